// Package releaseimage loads nri-gpu's release image (make image,
// bin/nri-gpu-image.tar) the ways docs/install.md tells users to: ctr
// images import into a real containerd, whose CRI then runs it, and podman
// load, whose podman run runs it. Needs root.
package releaseimage

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
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// release is the archive under test and what its index.json says.
type release struct {
	tar       string
	ref       string   // io.containerd.image.name: repository:tag
	tag       string   // the version the binary must report
	index     string   // the image index's digest: the image's digest
	platforms []string // the image index's platforms: linux/amd64, linux/arm64/v8
	manifest  string   // this machine's manifest's digest
	config    string   // its configuration's digest: the image ID
}

// releaseArchive is $NRI_GPU_IMAGE (make e2e sets it to
// bin/nri-gpu-image.tar), else an image make image builds for the test.
func releaseArchive(t *testing.T) release {
	t.Helper()
	r := release{tar: os.Getenv("NRI_GPU_IMAGE")}
	if r.tar == "" {
		r.tar = filepath.Join(t.TempDir(), "nri-gpu-image.tar")
		out, err := exec.Command("make", "-s", "--no-print-directory", "-C", "../../..", "image", "IMAGE_TAR="+r.tar,
			"IMAGE_BINDIR="+filepath.Join(filepath.Dir(r.tar), "bin")).CombinedOutput()
		if err != nil {
			t.Fatalf("make image: %v\n%s", err, out)
		}
		t.Logf("NRI_GPU_IMAGE unset: built %s", strings.TrimSpace(string(out)))
	}
	blobs := readTar(t, r.tar)
	type index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
			Platform    struct {
				OS           string `json:"os"`
				Architecture string `json:"architecture"`
				Variant      string `json:"variant"`
			} `json:"platform"`
		} `json:"manifests"`
	}
	var idx, images index
	if err := json.Unmarshal(blobs["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("%s: index.json with one entry: %v (%d entries)", r.tar, err, len(idx.Manifests))
	}
	r.index = idx.Manifests[0].Digest
	r.ref = idx.Manifests[0].Annotations["io.containerd.image.name"]
	if err := json.Unmarshal(blobs["blobs/sha256/"+strings.TrimPrefix(r.index, "sha256:")], &images); err != nil {
		t.Fatalf("%s: image index: %v", r.tar, err)
	}
	for _, m := range images.Manifests {
		p := m.Platform.OS + "/" + m.Platform.Architecture
		if m.Platform.Variant != "" {
			p += "/" + m.Platform.Variant
		}
		r.platforms = append(r.platforms, p)
		if m.Platform.Architecture == runtime.GOARCH {
			r.manifest = m.Digest
		}
	}
	if r.manifest == "" {
		t.Fatalf("%s: no %s image in the index (%v)", r.tar, runtime.GOARCH, r.platforms)
	}
	repo, tag, ok := strings.Cut(r.ref, ":")
	if !ok || repo != "ghcr.io/nri-gpu/nri-gpu" {
		t.Fatalf("%s is named %q, want ghcr.io/nri-gpu/nri-gpu:VERSION", r.tar, r.ref)
	}
	r.tag = tag
	var m struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
	}
	if err := json.Unmarshal(blobs["blobs/sha256/"+strings.TrimPrefix(r.manifest, "sha256:")], &m); err != nil {
		t.Fatalf("%s: manifest: %v", r.tar, err)
	}
	r.config = m.Config.Digest
	return r
}

func readTar(t *testing.T, p string) map[string][]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Size < 1<<20 {
			if out[h.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// criLog returns the messages of a CRI container log (lines of
// "TIMESTAMP STREAM TAG MESSAGE").
func criLog(s string) string {
	var out []string
	for l := range strings.Lines(s) {
		if f := strings.SplitN(strings.TrimRight(l, "\n"), " ", 4); len(f) == 4 {
			out = append(out, f[3])
		}
	}
	return strings.Join(out, "\n")
}

// TestCtrImport imports the archive with ctr images import, as
// docs/install.md says (into containerd's k8s.io namespace, the one CRI
// reads; this machine's platform of the image index), and runs it through
// CRI as the DaemonSet does (read-only root, every capability dropped, the
// node's trees mounted read-only): it reports the image's version, and
// `nri-gpu inventory` finds a simulated node's GPUs and loads its
// libnvidia-ml.so.1 with the image's glibc. Imported again with
// --all-platforms, the image has every platform of the index.
func TestCtrImport(t *testing.T) {
	r := releaseArchive(t)
	c := harness.StartForTest(t, harness.ContainerdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	start := time.Now()
	if _, err := c.Ctr(ctx, "images", "import", r.tar); err != nil {
		t.Fatal(err)
	}
	t.Logf("ctr images import: %s", time.Since(start).Round(time.Millisecond))
	ls, err := c.Ctr(ctx, "images", "ls")
	if err != nil {
		t.Fatal(err)
	}
	if got := ctrImage(t, ls, r.ref); got.digest != r.index {
		t.Errorf("ctr images ls: %s has digest %s, the archive's image index is %s", r.ref, got.digest, r.index)
	}
	st, err := c.CRI().Image.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: r.ref}})
	if err != nil || st.GetImage() == nil {
		t.Fatalf("CRI ImageStatus %s: %v (image %v)", r.ref, err, st.GetImage())
	}
	if st.Image.Id != r.config {
		t.Errorf("CRI image ID %s, want the configuration's digest %s", st.Image.Id, r.config)
	}

	dir := t.TempDir()
	n, err := simnode.Generate(filepath.Join(dir, "node"), simnode.Options{NumGPUs: 2, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	cfgDir := filepath.Join(dir, "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), []byte("hostRoot: /host\ndriverRoot: /driver-root\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pod, err := c.CRI().RunPod(ctx, "release-image", nil)
	if err != nil {
		t.Fatal(err)
	}
	root := int64(0)
	run := func(name string, args ...string) string {
		t.Helper()
		id, err := c.CRI().Run(ctx, pod, harness.ContainerSpec{
			Name: name, Image: r.ref, Args: args,
			RunAsUser: &root, ReadOnlyRootfs: true, DropAllCaps: true,
			Mounts: []*runtimeapi.Mount{
				{ContainerPath: "/etc/nri-gpu", HostPath: cfgDir, Readonly: true},
				{ContainerPath: "/host", HostPath: n.Root, Readonly: true},
				{ContainerPath: "/driver-root", HostPath: n.Root, Readonly: true},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		code, err := c.CRI().WaitExit(ctx, id, time.Minute)
		log, lerr := c.CRI().ContainerLog(ctx, id)
		if err != nil || lerr != nil || code != 0 {
			t.Fatalf("nri-gpu %s in the image: exit %d, %v, %v\n%s", strings.Join(args, " "), code, err, lerr, log)
		}
		return criLog(log)
	}
	if got, want := run("version", "version"), "nri-gpu "+r.tag; got != want {
		t.Errorf("nri-gpu version through CRI: %q, want %q", got, want)
	}
	defer func() {
		if _, err := c.Ctr(ctx, "images", "import", "--all-platforms", r.tar); err != nil {
			t.Fatal(err)
		}
		ls, err := c.Ctr(ctx, "images", "ls")
		if err != nil {
			t.Fatal(err)
		}
		if got := ctrImage(t, ls, r.ref); got.digest != r.index || !slices.Equal(got.platforms, r.platforms) {
			t.Errorf("ctr images import --all-platforms: %s has digest %s, platforms %v; want %s, %v", r.ref, got.digest, got.platforms, r.index, r.platforms)
		}
	}()
	var inv struct {
		NVML string `json:"nvml"`
		GPUs []struct {
			UUID string `json:"uuid"`
		} `json:"gpus"`
	}
	out := run("inventory", "inventory", "-config", "/etc/nri-gpu/config.yaml", "-o", "json")
	if err := json.Unmarshal([]byte(out), &inv); err != nil {
		t.Fatalf("inventory -o json: %v\n%s", err, out)
	}
	var uuids []string
	for _, g := range inv.GPUs {
		uuids = append(uuids, g.UUID)
	}
	if d := cmp.Diff([]string{n.GPUs[0].UUID, n.GPUs[1].UUID}, uuids); d != "" || inv.NVML != "ok" {
		t.Errorf("inventory through CRI: NVML %q (want ok), GPUs (-want +got):\n%s", inv.NVML, d)
	}
}

// ctrListed is an image as ctr images ls lists it.
type ctrListed struct {
	digest    string
	platforms []string
}

// ctrImage finds ref in the output of ctr images ls (REF TYPE DIGEST
// SIZE PLATFORMS LABELS; the size is two fields, "61.6 MiB").
func ctrImage(t *testing.T, ls, ref string) ctrListed {
	t.Helper()
	for l := range strings.Lines(ls) {
		if f := strings.Fields(l); len(f) > 5 && f[0] == ref {
			return ctrListed{digest: f[2], platforms: strings.Split(f[5], ",")}
		}
	}
	t.Fatalf("ctr images ls has no %s:\n%s", ref, ls)
	return ctrListed{}
}

// TestPodmanLoad loads the archive with podman load (Debian's podman, in
// a private storage root; this machine's platform of the image index) and
// runs it with podman run.
func TestPodmanLoad(t *testing.T) {
	r := releaseArchive(t)
	tools, _ := harness.SetupForTest(t, "")
	podman := ensurePodman(t)
	dir := t.TempDir()
	// A private store; cgroupfs and file events: no systemd here.
	base := []string{"--root", filepath.Join(dir, "storage"), "--runroot", filepath.Join(dir, "run"), "--tmpdir", filepath.Join(dir, "tmp"),
		"--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file"}
	pm := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(podman, append(base, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	t.Cleanup(func() { _ = exec.Command(podman, append(base, "rm", "-a", "-f")...).Run() })

	start := time.Now()
	if out := pm("load", "-i", r.tar); !strings.Contains(out, "Loaded image: "+r.ref+"\n") {
		t.Errorf("podman load says:\n%s\nwant Loaded image: %s", out, r.ref)
	}
	t.Logf("podman load: %s", time.Since(start).Round(time.Millisecond))
	var imgs []struct {
		ID     string   `json:"Id"`
		Names  []string `json:"Names"`
		Digest string   `json:"Digest"`
	}
	if err := json.Unmarshal([]byte(pm("images", "--format", "json")), &imgs); err != nil {
		t.Fatal(err)
	}
	type seen struct{ ID, Digest string }
	got := map[string]seen{}
	for _, i := range imgs {
		for _, name := range i.Names {
			got[name] = seen{"sha256:" + i.ID, i.Digest}
		}
	}
	// podman loads this machine's image of the index and names it by
	// the index's digest, as a pull of a multi-platform image would.
	if d := cmp.Diff(map[string]seen{r.ref: {r.config, r.index}}, got); d != "" {
		t.Errorf("podman images (-want +got):\n%s", d)
	}

	// runc from the harness: Debian's crun refuses this machine's hybrid
	// cgroup hierarchy. Explicit ulimits: the defaults ask for more open
	// files and processes than this machine's hard limits allow.
	out := pm("--runtime", tools.Runc, "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "all",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", r.ref, "version")
	if got, want := strings.TrimSpace(out), "nri-gpu "+r.tag; got != want {
		t.Errorf("podman run %s version: %q, want %q", r.ref, got, want)
	}
}

// ensurePodman returns podman's path, installing Debian's podman when it
// is missing (.ci/run installs it; this is for a machine that has not run
// it).
func ensurePodman(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("podman"); err == nil {
		return p
	}
	start := time.Now()
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "--no-install-recommends", "podman"}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("podman is not installed, and apt-get %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Logf("apt-get install podman: %s", time.Since(start).Round(time.Second))
	p, err := exec.LookPath("podman")
	if err != nil {
		t.Fatal(fmt.Errorf("podman after apt-get install: %w", err))
	}
	return p
}
