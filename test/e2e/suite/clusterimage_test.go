package suite

import (
	"path/filepath"
	"strings"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// releaseImage is the cluster's nri-gpu image of version ("" the chart's
// appVersion), as startTestCluster imported it.
func releaseImage(k kc, version string) *harness.Image {
	k.t.Helper()
	if version == "" {
		v, err := harness.ChartAppVersion(repoRoot())
		if err != nil {
			k.t.Fatal(err)
		}
		version = v
	}
	want := harness.NRIGPUImageRepository + ":" + version
	for _, img := range k.c.Opts.Images {
		if img.Name == want {
			return img
		}
	}
	k.t.Fatalf("the cluster has no image %s", want)
	return nil
}

// checkDaemonImage checks that nri-gpu's pod on node runs img: the
// kubelet reports its name, and an image ID that is the archive's
// configuration (containerd), manifest or image index (CRI-O) digest.
func checkDaemonImage(k kc, node, pod string, img *harness.Image) {
	k.t.Helper()
	p, err := k.c.GetPod(k.ctx, "nri-gpu", pod)
	if err != nil {
		k.t.Fatal(err)
	}
	digest := func(d string) string { return strings.TrimPrefix(d, "sha256:") }
	for _, s := range p.Status.ContainerStatuses {
		ofArchive := strings.Contains(s.ImageID, digest(img.ConfigDigest)) || strings.Contains(s.ImageID, digest(img.ManifestDigest)) ||
			img.IndexDigest != "" && strings.Contains(s.ImageID, digest(img.IndexDigest))
		if s.Image != img.Name || !ofArchive {
			k.t.Errorf("node %s: nri-gpu's container runs image %s (ID %s), want %s of %s (configuration %s, manifest %s, index %s)",
				node, s.Image, s.ImageID, img.Name, img.Tar, img.ConfigDigest, img.ManifestDigest, img.IndexDigest)
		} else {
			k.t.Logf("node %s: nri-gpu runs %s from %s (image ID %s)", node, s.Image, filepath.Base(img.Tar), s.ImageID)
		}
	}
}
