package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Spec is what an image is built from.
type Spec struct {
	// Binary is nri-gpu built for the image (make image: CGO_ENABLED=0,
	// -trimpath, main.Version set to Version).
	Binary string
	// Version is the image's tag and the version the binary must report.
	Version string
	// LibcRoot is the root whose Debian libc6 files are copied ("/": the
	// build machine's).
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

// Built is an image and what it was built from.
type Built struct {
	Image v1.Image
	Files []File
	Glibc Glibc
	Spec  Spec
}

// Build assembles the image of spec: one gzip layer holding Files, an OCI
// manifest and configuration. It first checks that the binary reports
// spec.Version.
func Build(spec Spec) (*Built, error) {
	if err := checkVersion(spec.Binary, spec.Version); err != nil {
		return nil, err
	}
	files, g, err := Files(spec.Binary, spec.LibcRoot)
	if err != nil {
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
		Architecture: "amd64",
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
		History:   v1.History{Created: created, CreatedBy: createdBy(spec.Version, g)},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	return &Built{Image: img, Files: files, Glibc: g, Spec: spec}, nil
}

// createdBy is the layer's history line: what made it, and which glibc.
func createdBy(version string, g Glibc) string {
	libc := "Debian libc6 " + g.Version
	if g.Version == "" {
		libc = "Debian libc6 (version unknown)"
	}
	return fmt.Sprintf("make image: nri-gpu %s, glibc from %s", version, libc)
}

// checkVersion runs binary version and checks that it reports version.
func checkVersion(binary, version string) error {
	out, err := exec.Command(binary, "version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("run %s version: %w\n%s", binary, err, out)
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
