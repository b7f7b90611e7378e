package image

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ociLayout is the oci-layout file of an OCI image layout.
const ociLayout = `{"imageLayoutVersion":"1.0.0"}`

// Index is the archive's index.json: one entry, the release's image
// index (which lists an image per platform), named ref (a full reference,
// repository:tag).
func Index(r *Release, ref string) (*v1.IndexManifest, error) {
	_, tag, ok := strings.Cut(ref[strings.LastIndex(ref, "/")+1:], ":")
	if !ok || tag == "" {
		return nil, fmt.Errorf("name image: reference %q has no tag (want %s:VERSION)", ref, Repository)
	}
	return &v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   types.OCIImageIndex,
			Size:        int64(len(r.Index)),
			Digest:      r.Digest,
			Annotations: map[string]string{AnnotationContainerdName: ref, AnnotationRefName: tag},
		}},
	}, nil
}

// archiveFile is one regular file of the archive.
type archiveFile struct {
	name string
	data []byte
}

// WriteArchive writes r as an OCI image layout in a tar archive (what
// ctr images import, podman load and skopeo's oci-archive: read), named
// ref: the directories, the blobs in digest order, index.json and
// oci-layout, each owned by 0:0 with r's creation time.
func WriteArchive(w io.Writer, r *Release, ref string) error {
	idx, err := Index(r, ref)
	if err != nil {
		return err
	}
	blobs := map[string][]byte{r.Digest.Hex: r.Index}
	for _, b := range r.Images {
		if err := addBlobs(blobs, b); err != nil {
			return err
		}
	}
	index, err := json.Marshal(idx)
	if err != nil {
		return fmt.Errorf("write archive: index: %w", err)
	}

	tw := tar.NewWriter(w)
	created := r.Images[0].Spec.Created
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: created, Format: tar.FormatUSTAR}); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
	}
	names := make([]string, 0, len(blobs))
	for h := range blobs {
		names = append(names, h)
	}
	slices.Sort(names)
	files := make([]archiveFile, 0, len(names)+2)
	for _, h := range names {
		files = append(files, archiveFile{"blobs/sha256/" + h, blobs[h]})
	}
	files = append(files, archiveFile{"index.json", index}, archiveFile{"oci-layout", []byte(ociLayout)})
	for _, f := range files {
		hdr := &tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f.data)), ModTime: created, Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write archive: %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return fmt.Errorf("write archive: %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	return nil
}

// WriteArchiveFile writes the archive to path atomically (a temporary
// file in the same directory, renamed).
func WriteArchiveFile(path string, r *Release, ref string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".nri-gpu-image-*.tar")
	if err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := WriteArchive(tmp, r, ref); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("write archive: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	return nil
}

// addBlobs adds the blobs of b to blobs (digest -> data): its manifest,
// configuration and layers.
func addBlobs(blobs map[string][]byte, b *Built) error {
	add := func(h v1.Hash, data []byte) { blobs[h.Hex] = data }
	manifest, err := b.Image.RawManifest()
	if err != nil {
		return fmt.Errorf("write archive: manifest: %w", err)
	}
	digest, err := b.Image.Digest()
	if err != nil {
		return fmt.Errorf("write archive: manifest digest: %w", err)
	}
	add(digest, manifest)
	config, err := b.Image.RawConfigFile()
	if err != nil {
		return fmt.Errorf("write archive: configuration: %w", err)
	}
	configName, err := b.Image.ConfigName()
	if err != nil {
		return fmt.Errorf("write archive: configuration digest: %w", err)
	}
	add(configName, config)
	layers, err := b.Image.Layers()
	if err != nil {
		return fmt.Errorf("write archive: layers: %w", err)
	}
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return fmt.Errorf("write archive: layer digest: %w", err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return fmt.Errorf("write archive: layer %s: %w", h, err)
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("write archive: layer %s: %w", h, err)
		}
		add(h, data)
	}
	return nil
}
