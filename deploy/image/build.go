package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Spec is what the image of one platform is built from.
type Spec struct {
	// Arch is the platform's architecture (Platforms: amd64, arm64).
	Arch string
	// Binary is nri-gpu built for the image (make image: CGO_ENABLED=0,
	// GOARCH=Arch, -trimpath, main.Version set to Version).
	Binary string
	// Version is the image's tag and the version the binary must report.
	Version string
	// LibcRoot is the root whose Debian libc6 files of Arch are copied
	// ("/": the build machine's installed libc6; or a directory a libc6
	// package was unpacked into with dpkg-deb -x).
	LibcRoot string
	// Created is every time in the image: the files' mtimes, the
	// configuration's and history's created (SOURCE_DATE_EPOCH).
	Created time.Time
}

// Reference is the image's name for a version.
func Reference(version string) string { return Repository + ":" + version }

// Annotations on the manifest's entry in the archive's index.json, which
// name the image on import: ctr images import and podman load read
// io.containerd.image.name (a full reference); the OCI layout's own
// org.opencontainers.image.ref.name holds the tag, as the image-spec
// describes it.
const (
	AnnotationContainerdName = "io.containerd.image.name"
	AnnotationRefName        = "org.opencontainers.image.ref.name"
)

// Built is the image of one platform and what it was built from.
type Built struct {
	Image    v1.Image
	Platform Platform
	Files    []File
	Glibc    Glibc
	Spec     Spec
}

// Build assembles the image of spec: one gzip layer holding Files, an OCI
// manifest and configuration. It first checks that the binary reports
// spec.Version.
func Build(spec Spec) (*Built, error) {
	p, err := PlatformOf(spec.Arch)
	if err != nil {
		return nil, err
	}
	files, g, err := Files(p, spec.Binary, spec.LibcRoot)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(p, spec.Binary, spec.Version, files); err != nil {
		return nil, err
	}
	raw, err := layerTar(files, spec.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("compress layer: %w", err)
	}
	created := v1.Time{Time: spec.Created.UTC()}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: p.Arch,
		Variant:      p.Variant,
		OS:           "linux",
		Created:      created,
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint: slices.Clone(Entrypoint),
			Env:        slices.Clone(Env),
			User:       User,
			Labels:     Labels(spec.Version),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("set image configuration: %w", err)
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: created, CreatedBy: createdBy(p, spec.Version, g)},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	return &Built{Image: img, Platform: p, Files: files, Glibc: g, Spec: spec}, nil
}

// createdBy is the layer's history line: what made it, and which glibc.
func createdBy(p Platform, version string, g Glibc) string {
	v := g.Version
	if v == "" {
		v = "(version unknown)"
	}
	return fmt.Sprintf("make image: nri-gpu %s, glibc from Debian libc6:%s %s", version, p.Arch, v)
}

// Release is the release image: one image per platform and the image
// index that lists them.
type Release struct {
	Images []*Built
	// Index is the image index's JSON, Digest its digest.
	Index  []byte
	Digest v1.Hash
}

// BuildRelease builds the image of each spec, one per platform in the
// order of Platforms, every one created at the same time, and the image
// index listing them with their platforms.
func BuildRelease(specs []Spec) (*Release, error) {
	r := &Release{}
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{}}
	last := -1
	for _, spec := range specs {
		if _, err := PlatformOf(spec.Arch); err != nil {
			return nil, fmt.Errorf("build release: %w", err)
		}
		i := slices.IndexFunc(Platforms, func(p Platform) bool { return p.Arch == spec.Arch })
		if i <= last {
			return nil, fmt.Errorf("build release: platform %q twice, out of order (want the order of %s)", spec.Arch, platformNames())
		}
		last = i
		if len(r.Images) > 0 && !spec.Created.Equal(r.Images[0].Spec.Created) {
			return nil, fmt.Errorf("build release: the %s image is created at %s, the %s image at %s", spec.Arch, spec.Created, r.Images[0].Spec.Arch, r.Images[0].Spec.Created)
		}
		b, err := Build(spec)
		if err != nil {
			return nil, fmt.Errorf("build the %s image: %w", spec.Arch, err)
		}
		// The descriptor by hand rather than mutate.AppendManifests, which
		// adds an artifactType (the config's media type) that an image's
		// entry does not need.
		desc, err := partial.Descriptor(b.Image)
		if err != nil {
			return nil, fmt.Errorf("describe the %s manifest: %w", b.Platform, err)
		}
		platform := b.Platform.OCI()
		idx.Manifests = append(idx.Manifests, v1.Descriptor{MediaType: desc.MediaType, Size: desc.Size, Digest: desc.Digest, Platform: &platform})
		r.Images = append(r.Images, b)
	}
	if len(r.Images) == 0 {
		return nil, fmt.Errorf("build release: no platform")
	}
	var err error
	if r.Index, err = json.Marshal(idx); err != nil {
		return nil, fmt.Errorf("build release: index: %w", err)
	}
	sum := sha256.Sum256(r.Index)
	r.Digest = v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sum)}
	return r, nil
}

// checkVersion runs binary version and checks that it reports version: on
// the build machine when the binary is of its architecture, else with
// qemu-user's emulator of the platform in a directory holding the image's
// files (qemu -L), which also shows that the image's glibc runs it.
func checkVersion(p Platform, binary, version string, files []File) error {
	cmd := exec.Command(binary, "version")
	if p.Arch != runtime.GOARCH {
		qemu, err := qemuFor(p)
		if err != nil {
			return err
		}
		root, err := os.MkdirTemp("", "nri-gpu-image-root-")
		if err != nil {
			return fmt.Errorf("check binary version: %w", err)
		}
		defer os.RemoveAll(root)
		for _, f := range files {
			src, err := filepath.Abs(f.Source)
			if err == nil {
				err = os.MkdirAll(filepath.Join(root, path.Dir(f.Path)), 0o755)
			}
			if err == nil {
				err = os.Symlink(src, filepath.Join(root, f.Path))
			}
			if err != nil {
				return fmt.Errorf("check binary version: lay out the image's files: %w", err)
			}
		}
		cmd = exec.Command(qemu, "-L", root, filepath.Join(root, BinaryPath), "version")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("run %s version: %w\n%s", strings.Join(cmd.Args[:len(cmd.Args)-1], " "), err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "nri-gpu "+version; got != want {
		return fmt.Errorf("check binary version: %s reports %q, the image is %q (build it with -ldflags \"-X main.Version=%s\")", binary, got, want, version)
	}
	return nil
}

// layerTar is the uncompressed layer: files and their parent directories,
// sorted by path, owned by 0:0, every mtime created.
func layerTar(files []File, created time.Time) ([]byte, error) {
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	type entry struct {
		path string
		file *File
	}
	var entries []entry
	for d := range dirs {
		entries = append(entries, entry{path: d})
	}
	for i := range files {
		entries = append(entries, entry{path: files[i].Path, file: &files[i]})
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.path, b.path) })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		name := strings.TrimPrefix(e.path, "/")
		hdr := &tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: created, Format: tar.FormatUSTAR}
		var data []byte
		if e.file != nil {
			var err error
			if data, err = os.ReadFile(e.file.Source); err != nil {
				return nil, fmt.Errorf("read %s for %s: %w", e.file.Source, e.path, err)
			}
			hdr = &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: int64(e.file.Mode.Perm()), Size: int64(len(data)), ModTime: created, Format: tar.FormatUSTAR}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("write layer entry %s: %w", e.path, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("write layer entry %s: %w", e.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	return buf.Bytes(), nil
}

// platformNames are the architectures of Platforms, in order.
func platformNames() string {
	var known []string
	for _, p := range Platforms {
		known = append(known, p.Arch)
	}
	return strings.Join(known, ", ")
}

// qemuFor finds qemu-user's emulator of the platform's machine: Debian's
// qemu-user (qemu-aarch64) or qemu-user-static (qemu-aarch64-static).
func qemuFor(p Platform) (string, error) {
	machine, _, _ := strings.Cut(p.Triplet, "-")
	for _, name := range []string{"qemu-" + machine, "qemu-" + machine + "-static"} {
		if q, err := exec.LookPath(name); err == nil {
			return q, nil
		}
	}
	return "", fmt.Errorf("check the %s binary's version: this machine runs %s, and no qemu-%s (Debian's qemu-user) is on PATH to run it", p.Arch, runtime.GOARCH, machine)
}
