package harness

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
)

// NRIGPUImageRepository is the repository of nri-gpu's release image, as
// deploy/kubernetes and the chart name it.
const NRIGPUImageRepository = "ghcr.io/nri-gpu/nri-gpu"

// ChartAppVersion is the appVersion of deploy/helm/nri-gpu/Chart.yaml in
// the checkout at repo: the image tag deploy/kubernetes and the chart
// deploy, and the version of make image's default archive.
func ChartAppVersion(repo string) (string, error) {
	p := filepath.Join(repo, "deploy", "helm", "nri-gpu", "Chart.yaml")
	data, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read the chart's appVersion: %w", err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?\s*$`).FindSubmatch(data)
	if m == nil {
		return "", fmt.Errorf("%s: no appVersion", p)
	}
	return string(m[1]), nil
}

// ReleaseImage is where the cluster's nri-gpu image comes from: the
// release image that `make image` builds from the checkout at repo (an
// OCI archive, NRIGPUImageRepository:<version>, the binary reporting
// <version>), the same archive users load (docs/install.md, "The image").
// The runtimes import it as users are told to: containerd with ctr
// images import, CRI-O's storage with skopeo copy oci-archive:.
//
// version "" is the chart's appVersion: make image's own archive,
// bin/nri-gpu-image.tar, the one make e2e builds and docs/install.md
// loads. Another version (an upgrade's new tag) is
// `make image VERSION=<version> IMAGE_TAR=bin/nri-gpu-image-<version>.tar`.
// make runs every time: with the Go build cache warm it relinks the
// binary and compresses the layer, a few seconds; the archive is the same
// bytes for the same commit (make image is reproducible).
func ReleaseImage(ctx context.Context, repo, version string) (*Image, error) {
	args := []string{"-s", "--no-print-directory", "-C", repo, "image", "GO=" + goBinary()}
	tarPath := filepath.Join(repo, "bin", "nri-gpu-image.tar")
	if version == "" {
		v, err := ChartAppVersion(repo)
		if err != nil {
			return nil, err
		}
		version = v
	} else {
		tarPath = filepath.Join(repo, "bin", "nri-gpu-image-"+version+".tar")
		args = append(args, "VERSION="+version, "IMAGE_TAR="+tarPath,
			"IMAGE_BINDIR="+filepath.Join(repo, "bin", "image-"+version))
	}
	cmd := exec.CommandContext(ctx, "make", args...)
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("make %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	img, err := readReleaseArchive(tarPath)
	if err != nil {
		return nil, err
	}
	if want := NRIGPUImageRepository + ":" + version; img.Name != want {
		return nil, fmt.Errorf("%s is named %q, want %q", tarPath, img.Name, want)
	}
	return img, nil
}

// readReleaseArchive reads an OCI archive's index.json, the image index
// it names and this machine's manifest: the image's name
// (io.containerd.image.name, what ctr and podman name it by) and digests.
func readReleaseArchive(p string) (*Image, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		if h.Size < 1<<20 {
			if files[h.Name], err = io.ReadAll(tr); err != nil {
				return nil, fmt.Errorf("read %s: %w", p, err)
			}
		}
	}
	type index struct {
		Manifests []struct {
			MediaType   string            `json:"mediaType"`
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
			Platform    struct {
				Architecture string `json:"architecture"`
			} `json:"platform"`
		} `json:"manifests"`
	}
	blob := func(digest string) []byte { return files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")] }
	var idx, release index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil || len(idx.Manifests) != 1 || idx.Manifests[0].MediaType != "application/vnd.oci.image.index.v1+json" {
		return nil, fmt.Errorf("%s: want an index.json with one image index (%d entries, %v)", p, len(idx.Manifests), err)
	}
	img := &Image{Name: idx.Manifests[0].Annotations["io.containerd.image.name"], Tar: p, IndexDigest: idx.Manifests[0].Digest}
	if err := json.Unmarshal(blob(img.IndexDigest), &release); err != nil {
		return nil, fmt.Errorf("%s: image index %s: %w", p, img.IndexDigest, err)
	}
	for _, m := range release.Manifests {
		if m.Platform.Architecture == runtime.GOARCH {
			img.ManifestDigest = m.Digest
		}
	}
	if img.ManifestDigest == "" {
		return nil, fmt.Errorf("%s: image index %s has no %s image", p, img.IndexDigest, runtime.GOARCH)
	}
	var m struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
	}
	if err := json.Unmarshal(blob(img.ManifestDigest), &m); err != nil {
		return nil, fmt.Errorf("%s: manifest %s: %w", p, img.ManifestDigest, err)
	}
	img.ConfigDigest = m.Config.Digest
	return img, nil
}

// BuildE2ECommand builds test/e2e/cmd/<name> of this module into dir and
// returns the binary's path (a test's own program, such as a stand-in).
func BuildE2ECommand(ctx context.Context, name, dir string) (string, error) {
	return buildE2ECommand(ctx, name, dir)
}

// buildE2ECommand builds test/e2e/cmd/<name> of this module into dir and
// returns the binary's path.
func buildE2ECommand(ctx context.Context, name, dir string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	module := filepath.Dir(filepath.Dir(file)) // test/e2e
	bin := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, goBinary(), "build", "-o", bin, "./cmd/"+name)
	cmd.Dir = module
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", name, err, out)
	}
	return bin, nil
}
