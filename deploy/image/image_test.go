package image_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/nri-gpu/nri-gpu/deploy/image"
)

// repoRoot is the repository root, where make image runs.
const repoRoot = "../.."

// testEpoch is the SOURCE_DATE_EPOCH of the images the tests build.
const testEpoch = 1767225600 // 2026-01-01T00:00:00Z

// made is what makeImage built: the archive, and the binary in it.
type made struct {
	tar, binary, version string
}

// makeImage runs make image (the repository's Makefile, as a user does)
// with its outputs in dir.
func makeImage(t *testing.T, dir string, vars ...string) made {
	t.Helper()
	m := made{tar: filepath.Join(dir, "nri-gpu-image.tar"), binary: filepath.Join(dir, "bin", "nri-gpu")}
	args := append([]string{"-s", "-C", repoRoot, "image", "IMAGE_TAR=" + m.tar, "IMAGE_BIN=" + m.binary}, vars...)
	for _, v := range vars {
		if s, ok := strings.CutPrefix(v, "VERSION="); ok {
			m.version = s
		}
	}
	start := time.Now()
	out, err := exec.Command("make", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("make image in %s: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	return m
}

var (
	sharedOnce sync.Once
	shared     made
	sharedDir  string
)

// testImage is one image built for the tests that only read it:
// VERSION=0.0.0-test, SOURCE_DATE_EPOCH=testEpoch.
func testImage(t *testing.T) made {
	t.Helper()
	sharedOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nri-gpu-image-test-")
		if err != nil {
			t.Fatal(err)
		}
		sharedDir = dir
		shared = makeImage(t, dir, "VERSION=0.0.0-test", "SOURCE_DATE_EPOCH="+strconv.Itoa(testEpoch))
	})
	if shared.tar == "" {
		t.Fatal("the shared test image was not built (see the first test's failure)")
	}
	return shared
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
	os.Exit(code)
}

// archive is an image archive read back with archive/tar and JSON alone.
type archive struct {
	entries  []string // the archive's own entries: type, mode, owner, name
	index    v1.IndexManifest
	manifest v1.Manifest
	config   v1.ConfigFile
	layer    []layerEntry
	contents map[string][]byte // regular files of the layer by path
}

// layerEntry is one entry of the image's layer, as the test compares it.
type layerEntry struct {
	Name    string
	Type    byte
	Mode    int64
	UID     int
	GID     int
	ModTime int64
	Link    string
}

func readArchive(t *testing.T, path string) archive {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[string][]byte{}
	var a archive
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		a.entries = append(a.entries, string(h.Typeflag)+" "+strconv.FormatInt(h.Mode, 8)+" "+strconv.Itoa(h.Uid)+":"+strconv.Itoa(h.Gid)+" "+h.Name)
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		blobs[h.Name] = data
	}
	if err := json.Unmarshal(blobs["index.json"], &a.index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(a.index.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1", len(a.index.Manifests))
	}
	blob := func(d v1.Hash) []byte {
		b, ok := blobs["blobs/sha256/"+d.Hex]
		if !ok {
			t.Fatalf("no blob %s in the archive", d)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != d.Hex {
			t.Fatalf("blob %s has digest %x", d, sum)
		}
		return b
	}
	if err := json.Unmarshal(blob(a.index.Manifests[0].Digest), &a.manifest); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(blob(a.manifest.Config.Digest), &a.config); err != nil {
		t.Fatal(err)
	}
	if len(a.manifest.Layers) != 1 {
		t.Fatalf("%d layers, want 1", len(a.manifest.Layers))
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(a.manifest.Layers[0].Digest)))
	if err != nil {
		t.Fatal(err)
	}
	a.contents = map[string][]byte{}
	lr := tar.NewReader(zr)
	for {
		h, err := lr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		a.layer = append(a.layer, layerEntry{Name: h.Name, Type: h.Typeflag, Mode: h.Mode, UID: h.Uid, GID: h.Gid, ModTime: h.ModTime.Unix(), Link: h.Linkname})
		if h.Typeflag == tar.TypeReg {
			if a.contents["/"+h.Name], err = io.ReadAll(lr); err != nil {
				t.Fatal(err)
			}
		}
	}
	return a
}

// TestImageFiles lists the image's files exactly: the binary, glibc's
// loader where the binary names it, and five glibc libraries; nothing
// else (no shell, no /etc). Each is owned by root with a fixed mtime, and
// holds what it was copied from.
func TestImageFiles(t *testing.T) {
	m := testImage(t)
	a := readArchive(t, m.tar)
	dir := func(name string) layerEntry {
		return layerEntry{Name: name, Type: tar.TypeDir, Mode: 0o755, ModTime: testEpoch}
	}
	file := func(name string, mode int64) layerEntry {
		return layerEntry{Name: name, Type: tar.TypeReg, Mode: mode, ModTime: testEpoch}
	}
	want := []layerEntry{
		dir("lib/"),
		dir("lib/x86_64-linux-gnu/"),
		file("lib/x86_64-linux-gnu/libc.so.6", 0o644),
		file("lib/x86_64-linux-gnu/libdl.so.2", 0o644),
		file("lib/x86_64-linux-gnu/libm.so.6", 0o644),
		file("lib/x86_64-linux-gnu/libpthread.so.0", 0o644),
		file("lib/x86_64-linux-gnu/librt.so.1", 0o644),
		dir("lib64/"),
		file("lib64/ld-linux-x86-64.so.2", 0o755),
		dir("usr/"),
		dir("usr/bin/"),
		file("usr/bin/nri-gpu", 0o755),
	}
	if d := cmp.Diff(want, a.layer); d != "" {
		t.Errorf("the image's files (-want +got):\n%s", d)
	}
	sources := map[string]string{image.BinaryPath: m.binary, "/lib64/ld-linux-x86-64.so.2": "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"}
	for _, lib := range []string{"libc.so.6", "libdl.so.2", "libm.so.6", "libpthread.so.0", "librt.so.1"} {
		sources[image.LibDir+"/"+lib] = "/lib/x86_64-linux-gnu/" + lib
	}
	for p, src := range sources {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, a.contents[p]) {
			t.Errorf("%s in the image (%d bytes) is not %s (%d bytes)", p, len(a.contents[p]), src, len(data))
		}
	}
}

// TestImageConfig checks the image's configuration, manifest and index:
// what the DaemonSet runs and how ctr and podman name the image.
func TestImageConfig(t *testing.T) {
	m := testImage(t)
	a := readArchive(t, m.tar)
	created := v1.Time{Time: time.Unix(testEpoch, 0).UTC()}
	wantConfig := v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      created,
		History:      []v1.History{{Created: created, CreatedBy: "make image: nri-gpu 0.0.0-test, glibc from Debian libc6 " + hostLibc6(t)}},
		RootFS:       v1.RootFS{Type: "layers", DiffIDs: a.config.RootFS.DiffIDs},
		Config: v1.Config{
			Entrypoint: []string{"/usr/bin/nri-gpu"},
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			User:       "0:0",
			Labels: map[string]string{
				"org.opencontainers.image.title":       "nri-gpu",
				"org.opencontainers.image.description": "NVIDIA GPUs for containers through NRI (containerd, CRI-O), without a runtime wrapper.",
				"org.opencontainers.image.source":      "https://github.com/nri-gpu/nri-gpu",
				"org.opencontainers.image.version":     "0.0.0-test",
			},
		},
	}
	if d := cmp.Diff(wantConfig, a.config); d != "" {
		t.Errorf("configuration (-want +got):\n%s", d)
	}
	if len(a.config.RootFS.DiffIDs) != 1 {
		t.Errorf("diff_ids %v, want one", a.config.RootFS.DiffIDs)
	}
	if a.manifest.MediaType != "application/vnd.oci.image.manifest.v1+json" ||
		a.manifest.Config.MediaType != "application/vnd.oci.image.config.v1+json" ||
		a.manifest.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Errorf("media types: manifest %s, config %s, layer %s; want OCI's", a.manifest.MediaType, a.manifest.Config.MediaType, a.manifest.Layers[0].MediaType)
	}
	desc := a.index.Manifests[0]
	wantIndex := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     "application/vnd.oci.image.index.v1+json",
		Manifests: []v1.Descriptor{{
			MediaType: "application/vnd.oci.image.manifest.v1+json",
			Size:      desc.Size,
			Digest:    desc.Digest,
			Platform:  &v1.Platform{OS: "linux", Architecture: "amd64"},
			Annotations: map[string]string{
				"io.containerd.image.name":          "ghcr.io/nri-gpu/nri-gpu:0.0.0-test",
				"org.opencontainers.image.ref.name": "0.0.0-test",
			},
		}},
	}
	if d := cmp.Diff(wantIndex, a.index); d != "" {
		t.Errorf("index.json (-want +got):\n%s", d)
	}
	digests := []string{desc.Digest.Hex, a.manifest.Config.Digest.Hex, a.manifest.Layers[0].Digest.Hex}
	slices.Sort(digests)
	wantEntries := []string{"5 755 0:0 blobs/", "5 755 0:0 blobs/sha256/"}
	for _, d := range digests {
		wantEntries = append(wantEntries, "0 644 0:0 blobs/sha256/"+d)
	}
	wantEntries = append(wantEntries, "0 644 0:0 index.json", "0 644 0:0 oci-layout")
	if d := cmp.Diff(wantEntries, a.entries); d != "" {
		t.Errorf("the archive's entries (-want +got):\n%s", d)
	}

	// The layout as go-containerregistry reads and validates it: every
	// digest, size and diff ID agrees.
	dir := t.TempDir()
	if out, err := exec.Command("tar", "-xf", m.tar, "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Errorf("go-containerregistry's validate.Index: %v", err)
	}
}

// hostLibc6 is the version of the build machine's libc6.
func hostLibc6(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "libc6:amd64").Output()
	if err != nil {
		t.Fatalf("dpkg-query libc6: %v", err)
	}
	return string(out)
}

// TestReproducible builds the image twice with make image and compares
// the archives byte for byte; then builds it through the package from
// copies of every input with other mtimes, modes and paths (the glibc
// files from a copy of the libc6 files with the dpkg database, and as
// an unpacked package), which must give the same bytes;
// and checks that SOURCE_DATE_EPOCH is what dates the image.
func TestReproducible(t *testing.T) {
	first := testImage(t)
	second := makeImage(t, t.TempDir(), "VERSION=0.0.0-test", "SOURCE_DATE_EPOCH="+strconv.Itoa(testEpoch))
	a, b := readFile(t, first.tar), readFile(t, second.tar)
	if !bytes.Equal(a, b) {
		t.Fatalf("two builds of one commit differ: %s (%d bytes) and %s (%d bytes)", first.tar, len(a), second.tar, len(b))
	}
	want := readArchive(t, first.tar).index.Manifests[0].Digest

	dir := t.TempDir()
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	bin := filepath.Join(dir, "elsewhere", "nri-gpu")
	copyFile(t, first.binary, bin, 0o700, old)
	libs := []string{"lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/libc.so.6", "lib/x86_64-linux-gnu/libdl.so.2",
		"lib/x86_64-linux-gnu/libm.so.6", "lib/x86_64-linux-gnu/libpthread.so.0", "lib/x86_64-linux-gnu/librt.so.1"}
	// The libc6 files with the build machine's dpkg database, and as
	// dpkg-deb -x unpacks the package (its changelog names the version).
	for _, tc := range []struct {
		name     string
		metadata []string
	}{
		{"dpkg database", []string{"var/lib/dpkg/status", "var/lib/dpkg/info/libc6:amd64.md5sums"}},
		{"unpacked package", []string{"usr/share/doc/libc6/changelog.Debian.gz"}},
	} {
		root := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
		for _, p := range append(slices.Clone(libs), tc.metadata...) {
			copyFile(t, "/"+p, filepath.Join(root, p), 0o600, old)
		}
		built, err := image.Build(image.Spec{Binary: bin, Version: "0.0.0-test", LibcRoot: root, Created: time.Unix(testEpoch, 0)})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var buf bytes.Buffer
		if err := image.WriteArchive(&buf, built, image.Reference("0.0.0-test")); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), a) {
			got, _ := built.Image.Digest()
			t.Errorf("%s: the archive from copied inputs differs from make image's (manifest %s, make image's %s)", tc.name, got, want)
		}
	}

	root := filepath.Join(dir, "dpkg-database")
	later, err := image.Build(image.Spec{Binary: bin, Version: "0.0.0-test", LibcRoot: root, Created: time.Unix(testEpoch+1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := later.Image.Digest(); err != nil || d == want {
		t.Errorf("an image built one second later has digest %s (err %v), the same as at SOURCE_DATE_EPOCH", d, err)
	}
}

// TestBuildRefuses checks what Build refuses: a binary that reports
// another version than the image's, a libc6 file that differs from
// what dpkg installed, a glibc that is not laid out as Debian's.
func TestBuildRefuses(t *testing.T) {
	m := testImage(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "libc6")
	libs := []string{"ld-linux-x86-64.so.2", "libc.so.6", "libdl.so.2", "libm.so.6", "libpthread.so.0", "librt.so.1"}
	for _, l := range libs {
		copyFile(t, "/lib/x86_64-linux-gnu/"+l, filepath.Join(root, "lib/x86_64-linux-gnu", l), 0o644, time.Now())
	}
	for _, p := range []string{"var/lib/dpkg/status", "var/lib/dpkg/info/libc6:amd64.md5sums"} {
		copyFile(t, "/"+p, filepath.Join(root, p), 0o644, time.Now())
	}
	tampered := filepath.Join(root, "lib/x86_64-linux-gnu/librt.so.1")
	data := readFile(t, tampered)
	data[len(data)-1] ^= 0xff
	if err := os.WriteFile(tampered, data, 0o644); err != nil {
		t.Fatal(err)
	}
	flat := filepath.Join(dir, "flat")
	copyFile(t, "/lib/x86_64-linux-gnu/libc.so.6", filepath.Join(flat, "lib64/libc.so.6"), 0o644, time.Now())

	for _, tc := range []struct {
		name string
		spec image.Spec
		want string
	}{
		{"other version", image.Spec{Binary: m.binary, Version: "9.9.9", LibcRoot: "/"},
			`reports "nri-gpu 0.0.0-test", the image is "nri-gpu 9.9.9"`},
		{"tampered libc6 file", image.Spec{Binary: m.binary, Version: "0.0.0-test", LibcRoot: root},
			"librt.so.1: " + tampered + " differs from what libc6 installed"},
		{"not Debian's layout", image.Spec{Binary: m.binary, Version: "0.0.0-test", LibcRoot: flat},
			"find glibc file ld-linux-x86-64.so.2: not in lib/x86_64-linux-gnu or usr/lib/x86_64-linux-gnu under " + flat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := image.Build(tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Build: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestVersionsAgree checks that make image's default version, the
// chart's appVersion and image tag, the kustomization's newTag, the
// DaemonSet's image and the Dockerfile's VERSION are one version, and
// that make image passes it to the binary and names the image with it.
func TestVersionsAgree(t *testing.T) {
	chart := readFile(t, filepath.Join(repoRoot, "deploy/helm/nri-gpu/Chart.yaml"))
	appVersion := find(t, "Chart.yaml appVersion", `(?m)^appVersion: "?([^"\s]+)"?$`, chart)
	dry, err := exec.Command("make", "-n", "--no-print-directory", "-C", repoRoot, "image").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, dry)
	}
	got := map[string]string{
		"Chart.yaml version":             find(t, "Chart.yaml version", `(?m)^version: "?([^"\s]+)"?$`, chart),
		"values.yaml image.tag":          find(t, "values.yaml tag", `(?m)^  tag: "?([^"\s]+)"?$`, readFile(t, filepath.Join(repoRoot, "deploy/helm/nri-gpu/values.yaml"))),
		"kustomization.yaml newTag":      find(t, "kustomization newTag", `(?m)^  newTag: "?([^"\s]+)"?$`, readFile(t, filepath.Join(repoRoot, "deploy/kubernetes/kustomization.yaml"))),
		"daemonset.yaml image":           find(t, "daemonset image", `(?m)^ +image: ghcr\.io/nri-gpu/nri-gpu:(\S+)$`, readFile(t, filepath.Join(repoRoot, "deploy/kubernetes/daemonset.yaml"))),
		"make image: -X main.Version":    find(t, "make -n image: ldflags", `-X main\.Version=(\S+?)"`, dry),
		"make image: mkimage -version":   find(t, "make -n image: -version", ` -version (\S+)`, dry),
		"make image: mkimage -ref (tag)": find(t, "make -n image: -ref", ` -ref ghcr\.io/nri-gpu/nri-gpu:(\S+)`, dry),
	}
	for i, m := range regexp.MustCompile(`(?m)^ARG VERSION=(\S+)$`).FindAllSubmatch(readFile(t, filepath.Join(repoRoot, "deploy/Dockerfile")), -1) {
		got["Dockerfile ARG VERSION #"+strconv.Itoa(i+1)] = string(m[1])
	}
	want := map[string]string{"Dockerfile ARG VERSION #1": "", "Dockerfile ARG VERSION #2": ""}
	for k := range got {
		want[k] = appVersion
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("versions differ from Chart.yaml's appVersion %s (-want +got):\n%s", appVersion, d)
	}
}

// find returns the first submatch of re in data.
func find(t *testing.T, what, re string, data []byte) string {
	t.Helper()
	m := regexp.MustCompile(re).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s: no match for %s", what, re)
	}
	return string(m[1])
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// copyFile copies src to dst (creating its directory) with mode and mtime.
func copyFile(t *testing.T, src, dst string, mode os.FileMode, mtime time.Time) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, readFile(t, src), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(dst, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}
