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

// made is what makeImage built: the archive, and the binaries in it.
type made struct {
	tar, bindir, version string
}

// binary is the path of the binary of the platform arch.
func (m made) binary(arch string) string { return filepath.Join(m.bindir, arch, "nri-gpu") }

// libcRoot is where make image takes the glibc of arch from: the build
// machine's installed libc6 for amd64, the libc6:arm64 package it
// unpacks into bin/libc6-arm64 for arm64.
func libcRoot(arch string) string {
	if arch == "amd64" {
		return "/"
	}
	return filepath.Join(repoRoot, "bin", "libc6-"+arch)
}

// makeImage runs make image (the repository's Makefile, as a user does)
// with its outputs in dir.
func makeImage(t *testing.T, dir string, vars ...string) made {
	t.Helper()
	m := made{tar: filepath.Join(dir, "nri-gpu-image.tar"), bindir: filepath.Join(dir, "bin")}
	args := append([]string{"-s", "-C", repoRoot, "image", "IMAGE_TAR=" + m.tar, "IMAGE_BINDIR=" + m.bindir}, vars...)
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
	entries []string         // the archive's own entries: type, mode, owner, name
	index   v1.IndexManifest // index.json
	release v1.IndexManifest // the image index index.json names
	images  map[string]platformImage
}

// platformImage is the image of one platform in an archive.
type platformImage struct {
	desc     v1.Descriptor // its entry in the image index
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
	if err := json.Unmarshal(blob(a.index.Manifests[0].Digest), &a.release); err != nil {
		t.Fatal(err)
	}
	a.images = map[string]platformImage{}
	for _, desc := range a.release.Manifests {
		if desc.Platform == nil {
			t.Fatalf("image index entry %s has no platform", desc.Digest)
		}
		img := platformImage{desc: desc, contents: map[string][]byte{}}
		if err := json.Unmarshal(blob(desc.Digest), &img.manifest); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(blob(img.manifest.Config.Digest), &img.config); err != nil {
			t.Fatal(err)
		}
		if len(img.manifest.Layers) != 1 {
			t.Fatalf("%s: %d layers, want 1", desc.Platform, len(img.manifest.Layers))
		}
		zr, err := gzip.NewReader(bytes.NewReader(blob(img.manifest.Layers[0].Digest)))
		if err != nil {
			t.Fatal(err)
		}
		lr := tar.NewReader(zr)
		for {
			h, err := lr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			img.layer = append(img.layer, layerEntry{Name: h.Name, Type: h.Typeflag, Mode: h.Mode, UID: h.Uid, GID: h.Gid, ModTime: h.ModTime.Unix(), Link: h.Linkname})
			if h.Typeflag == tar.TypeReg {
				if img.contents["/"+h.Name], err = io.ReadAll(lr); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, dup := a.images[desc.Platform.Architecture]; dup {
			t.Fatalf("two images for %s", desc.Platform.Architecture)
		}
		a.images[desc.Platform.Architecture] = img
	}
	return a
}

// glibcFiles are the glibc files of the image, by platform: the loader
// (its path in the image, and in Debian's libc6) and the libraries.
var glibcFiles = map[string]struct {
	loader, debianLoader, libDir string
}{
	"amd64": {"/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu"},
	"arm64": {"/lib/ld-linux-aarch64.so.1", "/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1", "/lib/aarch64-linux-gnu"},
}

// glibcLibraries are the glibc libraries in each platform's image.
var glibcLibraries = []string{"libc.so.6", "libdl.so.2", "libm.so.6", "libpthread.so.0", "librt.so.1"}

// TestImageFiles lists each platform's files exactly: the binary, glibc's
// loader where the binary names it, and five glibc libraries; nothing
// else (no shell, no /etc). Each is owned by root with a fixed mtime, and
// holds what it was copied from: the platform's binary, and Debian's
// libc6 of the platform.
func TestImageFiles(t *testing.T) {
	m := testImage(t)
	a := readArchive(t, m.tar)
	if len(a.images) != 2 {
		t.Errorf("the image index lists %d images, want 2 (amd64, arm64)", len(a.images))
	}
	dir := func(name string) layerEntry {
		return layerEntry{Name: name, Type: tar.TypeDir, Mode: 0o755, ModTime: testEpoch}
	}
	file := func(name string, mode int64) layerEntry {
		return layerEntry{Name: name, Type: tar.TypeReg, Mode: mode, ModTime: testEpoch}
	}
	for _, tc := range []struct {
		arch string
		want []layerEntry
	}{
		{"amd64", []layerEntry{
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
		}},
		{"arm64", []layerEntry{
			dir("lib/"),
			dir("lib/aarch64-linux-gnu/"),
			file("lib/aarch64-linux-gnu/libc.so.6", 0o644),
			file("lib/aarch64-linux-gnu/libdl.so.2", 0o644),
			file("lib/aarch64-linux-gnu/libm.so.6", 0o644),
			file("lib/aarch64-linux-gnu/libpthread.so.0", 0o644),
			file("lib/aarch64-linux-gnu/librt.so.1", 0o644),
			file("lib/ld-linux-aarch64.so.1", 0o755),
			dir("usr/"),
			dir("usr/bin/"),
			file("usr/bin/nri-gpu", 0o755),
		}},
	} {
		t.Run(tc.arch, func(t *testing.T) {
			img, ok := a.images[tc.arch]
			if !ok {
				t.Fatalf("no %s image", tc.arch)
			}
			if d := cmp.Diff(tc.want, img.layer); d != "" {
				t.Errorf("the image's files (-want +got):\n%s", d)
			}
			g := glibcFiles[tc.arch]
			root := libcRoot(tc.arch)
			sources := map[string]string{image.BinaryPath: m.binary(tc.arch), g.loader: filepath.Join(root, g.debianLoader)}
			for _, lib := range glibcLibraries {
				sources[g.libDir+"/"+lib] = filepath.Join(root, g.libDir, lib)
			}
			for p, src := range sources {
				data, err := os.ReadFile(src)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(data, img.contents[p]) {
					t.Errorf("%s in the image (%d bytes) is not %s (%d bytes)", p, len(img.contents[p]), src, len(data))
				}
			}
		})
	}
}

// TestImageConfig checks each platform's configuration and manifest, the
// image index and index.json: what the DaemonSet runs and how ctr and
// podman name the image.
func TestImageConfig(t *testing.T) {
	m := testImage(t)
	a := readArchive(t, m.tar)
	created := v1.Time{Time: time.Unix(testEpoch, 0).UTC()}
	var wantRelease []v1.Descriptor
	digests := []string{a.index.Manifests[0].Digest.Hex}
	for _, p := range []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64", Variant: "v8"}} {
		img := a.images[p.Architecture]
		wantConfig := v1.ConfigFile{
			Architecture: p.Architecture,
			Variant:      p.Variant,
			OS:           "linux",
			Created:      created,
			History:      []v1.History{{Created: created, CreatedBy: "make image: nri-gpu 0.0.0-test, glibc from Debian libc6:" + p.Architecture + " " + libc6Version(t, p.Architecture)}},
			RootFS:       v1.RootFS{Type: "layers", DiffIDs: img.config.RootFS.DiffIDs},
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
		if d := cmp.Diff(wantConfig, img.config); d != "" {
			t.Errorf("%s configuration (-want +got):\n%s", p.Architecture, d)
		}
		if len(img.config.RootFS.DiffIDs) != 1 {
			t.Errorf("%s diff_ids %v, want one", p.Architecture, img.config.RootFS.DiffIDs)
		}
		if img.manifest.MediaType != "application/vnd.oci.image.manifest.v1+json" ||
			img.manifest.Config.MediaType != "application/vnd.oci.image.config.v1+json" ||
			img.manifest.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
			t.Errorf("%s media types: manifest %s, config %s, layer %s; want OCI's", p.Architecture, img.manifest.MediaType, img.manifest.Config.MediaType, img.manifest.Layers[0].MediaType)
		}
		wantRelease = append(wantRelease, v1.Descriptor{
			MediaType: "application/vnd.oci.image.manifest.v1+json",
			Size:      img.desc.Size,
			Digest:    img.desc.Digest,
			Platform:  &p,
		})
		digests = append(digests, img.desc.Digest.Hex, img.manifest.Config.Digest.Hex, img.manifest.Layers[0].Digest.Hex)
	}
	if d := cmp.Diff(v1.IndexManifest{SchemaVersion: 2, MediaType: "application/vnd.oci.image.index.v1+json", Manifests: wantRelease}, a.release); d != "" {
		t.Errorf("the image index (-want +got):\n%s", d)
	}
	desc := a.index.Manifests[0]
	wantIndex := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     "application/vnd.oci.image.index.v1+json",
		Manifests: []v1.Descriptor{{
			MediaType: "application/vnd.oci.image.index.v1+json",
			Size:      desc.Size,
			Digest:    desc.Digest,
			Annotations: map[string]string{
				"io.containerd.image.name":          "ghcr.io/nri-gpu/nri-gpu:0.0.0-test",
				"org.opencontainers.image.ref.name": "0.0.0-test",
			},
		}},
	}
	if d := cmp.Diff(wantIndex, a.index); d != "" {
		t.Errorf("index.json (-want +got):\n%s", d)
	}
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
	// digest, size and diff ID agrees, in the index and each image.
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

// libc6Version is the version of the libc6 make image takes the glibc
// of arch from: the build machine's for amd64 (dpkg-query), the unpacked
// package's for arm64 (dpkg-deb -f, which debian-package.sh wrote down).
func libc6Version(t *testing.T, arch string) string {
	t.Helper()
	if arch == "amd64" {
		out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "libc6:amd64").Output()
		if err != nil {
			t.Fatalf("dpkg-query libc6: %v", err)
		}
		return string(out)
	}
	return find(t, "the unpacked libc6's .package", `(?m)^Version: (\S+)$`, readFile(t, filepath.Join(libcRoot(arch), ".package")))
}

// TestReproducible builds the image twice with make image and compares
// the archives byte for byte; then builds it through the package from
// copies of every input with other mtimes, modes and paths (the binaries;
// amd64's glibc files from a copy of the libc6 files with the dpkg
// database, and as an unpacked package; arm64's as the unpacked package),
// which must give the same bytes; and checks that SOURCE_DATE_EPOCH is
// what dates the image.
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
	bins := map[string]string{}
	for _, arch := range []string{"amd64", "arm64"} {
		bins[arch] = filepath.Join(dir, "elsewhere", arch, "nri-gpu")
		copyFile(t, first.binary(arch), bins[arch], 0o700, old)
	}
	// copyLibc6 copies the glibc files of arch, and metadata, from the
	// root make image took them from into a root of its own.
	copyLibc6 := func(arch, name string, metadata ...string) string {
		g := glibcFiles[arch]
		root := filepath.Join(dir, arch+"-"+strings.ReplaceAll(name, " ", "-"))
		for _, p := range append([]string{g.debianLoader}, metadata...) {
			copyFile(t, filepath.Join(libcRoot(arch), p), filepath.Join(root, p), 0o600, old)
		}
		for _, l := range glibcLibraries {
			p := filepath.Join(g.libDir, l)
			copyFile(t, filepath.Join(libcRoot(arch), p), filepath.Join(root, p), 0o600, old)
		}
		return root
	}
	arm64 := copyLibc6("arm64", "unpacked package", "usr/share/doc/libc6/changelog.Debian.gz")
	// The amd64 libc6 files with the build machine's dpkg database, and
	// as dpkg-deb -x unpacks the package (its changelog names the
	// version).
	for _, tc := range []struct {
		name     string
		metadata []string
	}{
		{"dpkg database", []string{"var/lib/dpkg/status", "var/lib/dpkg/info/libc6:amd64.md5sums"}},
		{"unpacked package", []string{"usr/share/doc/libc6/changelog.Debian.gz"}},
	} {
		amd64 := copyLibc6("amd64", tc.name, tc.metadata...)
		r, err := image.BuildRelease(releaseSpecs(bins, map[string]string{"amd64": amd64, "arm64": arm64}, testEpoch))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var buf bytes.Buffer
		if err := image.WriteArchive(&buf, r, image.Reference("0.0.0-test")); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), a) {
			t.Errorf("%s: the archive from copied inputs differs from make image's (index %s, make image's %s)", tc.name, r.Digest, want)
		}
	}

	later, err := image.BuildRelease(releaseSpecs(bins, map[string]string{"amd64": "/", "arm64": arm64}, testEpoch+1))
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range later.Images {
		if d, err := img.Image.Digest(); err != nil || d == readArchive(t, first.tar).images[img.Platform.Arch].desc.Digest {
			t.Errorf("the %s image built one second later has digest %s (err %v), the same as at SOURCE_DATE_EPOCH", img.Platform.Arch, d, err)
		}
	}
}

// releaseSpecs are the specs of the release of the binaries and libc6
// roots by architecture, in the order of image.Platforms.
func releaseSpecs(bins, roots map[string]string, epoch int64) []image.Spec {
	var specs []image.Spec
	for _, p := range image.Platforms {
		specs = append(specs, image.Spec{Arch: p.Arch, Binary: bins[p.Arch], Version: "0.0.0-test", LibcRoot: roots[p.Arch], Created: time.Unix(epoch, 0)})
	}
	return specs
}

// TestBuildRefuses checks what Build and BuildRelease refuse: a binary
// that reports another version than the image's, one of another
// architecture than its platform's, a libc6 file that differs from what
// dpkg installed, a glibc that is not laid out as Debian's, a root whose
// dpkg has no libc6 of the platform, platforms out of order or twice, and
// images of different times.
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
	amd64, arm64 := m.binary("amd64"), m.binary("arm64")
	created := time.Unix(testEpoch, 0)
	spec := func(arch, binary, version, root string) image.Spec {
		return image.Spec{Arch: arch, Binary: binary, Version: version, LibcRoot: root, Created: created}
	}

	for _, tc := range []struct {
		name  string
		specs []image.Spec
		want  string
	}{
		{"other version", []image.Spec{spec("amd64", amd64, "9.9.9", "/")},
			`reports "nri-gpu 0.0.0-test", the image is "nri-gpu 9.9.9"`},
		{"other version, arm64", []image.Spec{spec("arm64", arm64, "9.9.9", libcRoot("arm64"))},
			`reports "nri-gpu 0.0.0-test", the image is "nri-gpu 9.9.9"`},
		{"arm64 binary as amd64", []image.Spec{spec("amd64", arm64, "0.0.0-test", "/")},
			"machine EM_AARCH64, the amd64 image needs EM_X86_64"},
		{"tampered libc6 file", []image.Spec{spec("amd64", amd64, "0.0.0-test", root)},
			"librt.so.1: " + tampered + " differs from what libc6 installed"},
		{"not Debian's layout", []image.Spec{spec("amd64", amd64, "0.0.0-test", flat)},
			"find glibc file ld-linux-x86-64.so.2: not in lib/x86_64-linux-gnu or usr/lib/x86_64-linux-gnu under " + flat},
		{"amd64's dpkg for arm64", []image.Spec{spec("arm64", arm64, "0.0.0-test", root)},
			"find libc6:arm64: not installed under " + root},
		{"unknown architecture", []image.Spec{spec("riscv64", amd64, "0.0.0-test", "/")},
			`architecture "riscv64": the image is built for amd64, arm64`},
		{"platforms out of order", []image.Spec{spec("arm64", arm64, "0.0.0-test", libcRoot("arm64")), spec("amd64", amd64, "0.0.0-test", "/")},
			`platform "amd64" twice, out of order`},
		{"another time", []image.Spec{spec("amd64", amd64, "0.0.0-test", "/"), {Arch: "arm64", Binary: arm64, Version: "0.0.0-test", LibcRoot: libcRoot("arm64"), Created: created.Add(time.Second)}},
			"the arm64 image is created at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := image.BuildRelease(tc.specs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("BuildRelease: %v, want an error with %q", err, tc.want)
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
