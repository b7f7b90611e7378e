package dra

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	runtimeserializer "k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/api/metadata/install"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// Device metadata (KEP-5304): for each request of a prepared claim, a
// file that says which devices the request got, with the attributes the
// ResourceSlice publishes for them, and which claim and request it is.
// The format and the container path are the Kubernetes library's
// (k8s.io/dynamic-resource-allocation/api/metadata); the file is written
// here at Prepare, and the NRI side mounts it read-only into the claim's
// containers at CreateContainer (claims.Device.Metadata): no CDI mount,
// no hook. The helper library's own writer (kubeletplugin's
// EnableDeviceMetadata) is not used: it writes a CDI spec per request
// that the runtime would mount too.

// MetadataDir is the directory, in dra.pluginDir, of the prepared claims'
// device metadata files: one directory per claim UID, in which each file
// is at its container path relative to metadata.ContainerDir
// (resourceclaims/<claim>/<request>/<driver>-metadata.json, or
// resourceclaimtemplates/<pod claim name>/... for a claim made from a
// template), so that the directory alone says where it goes.
const MetadataDir = "device-metadata"

// maxMetadataFiles bounds the files read back for one claim at start: an
// allocation has at most resourceapi.AllocationResultsMaxSize devices,
// so at most as many requests.
const maxMetadataFiles = resourceapi.AllocationResultsMaxSize

// metadataVersions are the versions each file holds, newest first, as
// the library's format asks: a consumer takes the first it knows.
// v1alpha1 is kept for consumers built against Kubernetes 1.36's library.
var metadataVersions = []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion, metadatav1alpha1.SchemeGroupVersion}

// metadataCodecs encode the internal metadata type into each version.
var metadataCodecs = runtimeserializer.NewCodecFactory(install.NewScheme())

// metadataFile is one metadata file of a claim being prepared: its path
// relative to the claim's directory (and to metadata.ContainerDir), and
// its content.
type metadataFile struct {
	rel  string
	data []byte
}

// claimMetadata returns the metadata files of claim c, one per request
// (a subrequest's devices go in its request's file, as the library
// writes them), for its devices devs of this driver in pool, with each
// device's attributes (attrs, by device name). The claim's UID,
// namespace, name, pod claim name and request names become path
// components: each is checked to be the DNS label or subdomain the API
// server allows, so that no claim names a file outside its directory.
// Linear in devs.
func claimMetadata(c *resourceapi.ResourceClaim, driver, pool string, devs []claims.Device, attrs func(device string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) ([]metadataFile, error) {
	if err := checkClaimNames(string(c.UID), c.Namespace, c.Name); err != nil {
		return nil, err
	}
	var podClaim *string
	if v, ok := c.Annotations[resourceapi.PodResourceClaimAnnotation]; ok {
		if errs := validation.IsDNS1123Label(v); len(errs) > 0 {
			return nil, fmt.Errorf("device metadata: annotation %s: %q is not a pod claim name (%s)", resourceapi.PodResourceClaimAnnotation, v, strings.Join(errs, "; "))
		}
		podClaim = &v
	}
	byRequest := map[string][]metadata.Device{}
	var order []string
	for _, d := range devs {
		base := resourceclaim.BaseRequestRef(d.Request)
		if errs := validation.IsDNS1123Label(base); len(errs) > 0 {
			return nil, fmt.Errorf("device metadata: request %q is not a request name (%s)", d.Request, strings.Join(errs, "; "))
		}
		if _, ok := byRequest[base]; !ok {
			order = append(order, base)
		}
		byRequest[base] = append(byRequest[base], metadata.Device{Driver: driver, Pool: pool, Name: d.Name, Attributes: attrs(d.Name)})
	}
	out := make([]metadataFile, 0, len(order))
	for _, req := range order {
		// The request's name in the file is the allocation's (with a
		// subrequest), as the library records it; the file is the
		// request's.
		name := req
		for _, d := range devs {
			if resourceclaim.BaseRequestRef(d.Request) == req {
				name = d.Request
				break
			}
		}
		dm := &metadata.DeviceMetadata{
			ObjectMeta:   metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: c.UID, Generation: 1},
			PodClaimName: podClaim,
			Requests:     []metadata.DeviceMetadataRequest{{Name: name, Devices: byRequest[req]}},
		}
		data, err := encodeMetadata(dm)
		if err != nil {
			return nil, err
		}
		ctrPath := metadata.ResourceClaimFilePath(driver, c.Name, req)
		if podClaim != nil {
			ctrPath = metadata.ResourceClaimTemplateFilePath(driver, *podClaim, req)
		}
		out = append(out, metadataFile{rel: strings.TrimPrefix(ctrPath, metadata.ContainerDir+"/"), data: data})
	}
	return out, nil
}

// encodeMetadata encodes dm once per metadataVersions, as one JSON stream.
func encodeMetadata(dm *metadata.DeviceMetadata) ([]byte, error) {
	info, ok := runtime.SerializerInfoForMediaType(metadataCodecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		return nil, errors.New("device metadata: no JSON serializer")
	}
	var buf bytes.Buffer
	for _, gv := range metadataVersions {
		data, err := runtime.Encode(metadataCodecs.EncoderForVersion(info.PrettySerializer, gv), dm)
		if err != nil {
			return nil, fmt.Errorf("device metadata: encode %s: %w", gv, err)
		}
		buf.Write(data)
		buf.WriteByte('\n')
	}
	return buf.Bytes(), nil
}

// checkClaimNames refuses a claim UID, namespace or name that is not what
// the API server allows (a UID is a DNS label: a UUID): they name
// directories and files.
func checkClaimNames(uid, ns, name string) error {
	for _, f := range []struct {
		field, v string
		errs     []string
	}{{"uid", uid, validation.IsDNS1123Label(uid)}, {"namespace", ns, validation.IsDNS1123Label(ns)}, {"name", name, validation.IsDNS1123Subdomain(name)}} {
		if len(f.errs) > 0 {
			return fmt.Errorf("device metadata: claim %s %q is not valid (%s)", f.field, f.v, strings.Join(f.errs, "; "))
		}
	}
	return nil
}

// claimMetadataDir is the directory of claim uid's metadata files.
func claimMetadataDir(pluginDir, uid string) string {
	return filepath.Join(pluginDir, MetadataDir, uid)
}

// writeMetadata writes claim uid's files into its directory, each
// atomically (a rename over the old one: a container being created
// meanwhile mounts the whole old file or the whole new one, never none);
// a file already there with the same content is left as it is.
func writeMetadata(pluginDir, uid string, files []metadataFile) error {
	if errs := validation.IsDNS1123Label(uid); len(errs) > 0 {
		return fmt.Errorf("device metadata: claim uid %q is not valid", uid)
	}
	dir := claimMetadataDir(pluginDir, uid)
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.rel))
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, f.data) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("device metadata: %w", err)
		}
		if err := writeAtomic(p, f.data, 0o644); err != nil {
			return fmt.Errorf("device metadata: %w", err)
		}
	}
	return nil
}

// removeMetadata removes claim uid's metadata files; none is no error.
// A uid that is not a DNS label names no directory of ours.
func removeMetadata(pluginDir, uid string) error {
	if errs := validation.IsDNS1123Label(uid); len(errs) > 0 {
		return nil
	}
	if err := os.RemoveAll(claimMetadataDir(pluginDir, uid)); err != nil {
		return fmt.Errorf("remove device metadata: %w", err)
	}
	return nil
}

// metadataMounts returns, by request, where claim uid's files (files,
// once written) are on the host and in a container.
func metadataMounts(pluginDir, uid string, files []metadataFile) map[string]claims.Metadata {
	out := make(map[string]claims.Metadata, len(files))
	for _, f := range files {
		out[requestOf(f.rel)] = claims.Metadata{
			Host:      filepath.Join(claimMetadataDir(pluginDir, uid), filepath.FromSlash(f.rel)),
			Container: path.Join(metadata.ContainerDir, f.rel),
		}
	}
	return out
}

// requestOf is the request of a file's relative path:
// <kind>/<claim>/<request>/<file>.
func requestOf(rel string) string {
	parts := strings.Split(rel, "/")
	if len(parts) != 4 {
		return ""
	}
	return parts[2]
}

// readMetadata finds claim uid's metadata files on disk (at start: the
// checkpoint does not list them): regular files at
// <kind>/<claim>/<request>/<driver>-metadata.json under its directory,
// each component a valid name, at most maxMetadataFiles. A link or
// anything else is skipped; an unreadable directory is no file.
func readMetadata(pluginDir, uid string) map[string]claims.Metadata {
	if errs := validation.IsDNS1123Label(uid); len(errs) > 0 {
		return nil
	}
	root := claimMetadataDir(pluginDir, uid)
	var files []metadataFile
	seen := 0
	_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if seen++; seen > 4*maxMetadataFiles+8 {
			return filepath.SkipAll
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		depth := strings.Count(rel, "/")
		if e.IsDir() {
			if depth >= 3 {
				return filepath.SkipDir
			}
			return nil
		}
		if depth == 3 && e.Type().IsRegular() && validMetadataRel(rel) {
			files = append(files, metadataFile{rel: rel})
		}
		return nil
	})
	if len(files) > maxMetadataFiles {
		files = files[:maxMetadataFiles]
	}
	return metadataMounts(pluginDir, uid, files)
}

// validMetadataRel reports whether rel is a path this driver writes:
// resourceclaims/<subdomain>/<label>/<name>-metadata.json or
// resourceclaimtemplates/<label>/<label>/<name>-metadata.json.
func validMetadataRel(rel string) bool {
	parts := strings.Split(rel, "/")
	if len(parts) != 4 || !strings.HasSuffix(parts[3], metadata.MetadataFileSuffix) || len(validation.IsDNS1123Label(parts[2])) > 0 {
		return false
	}
	switch parts[0] {
	case metadata.ResourceClaimsSubDir:
		return len(validation.IsDNS1123Subdomain(parts[1])) == 0
	case metadata.ResourceClaimTemplatesSubDir:
		return len(validation.IsDNS1123Label(parts[1])) == 0
	}
	return false
}

// reconcileMetadata removes the metadata directories of claims that the
// checkpoint does not name (a crash between writing them and the
// checkpoint, or an Unprepare whose removal failed), and finds the
// prepared claims' files. The caller is New.
func (d *Driver) reconcileMetadata() {
	ents, err := os.ReadDir(filepath.Join(d.opts.PluginDir, MetadataDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.log.WithError(err).Warn("DRA: reading the device metadata directory")
	}
	for _, e := range ents {
		if _, ok := d.ckpt.Claims[e.Name()]; ok {
			continue
		}
		d.log.WithField("uid", e.Name()).Info("DRA: removing the device metadata of a claim that is not prepared")
		if err := os.RemoveAll(filepath.Join(d.opts.PluginDir, MetadataDir, e.Name())); err != nil {
			d.log.WithField("uid", e.Name()).WithError(err).Warn("DRA: removing device metadata")
		}
	}
}

// claimFiles are the prepared claims' device metadata files, by claim
// UID and request: the directory MetadataDir is their record, not the
// checkpoint. Never modified once made (with, without).
type claimFiles map[string]map[string]claims.Metadata

// with returns f with claim uid's files.
func (f claimFiles) with(uid string, files map[string]claims.Metadata) claimFiles {
	out := maps.Clone(f)
	if out == nil {
		out = claimFiles{}
	}
	out[uid] = files
	return out
}

// without returns f without the claims uids.
func (f claimFiles) without(uids ...string) claimFiles {
	out := maps.Clone(f)
	for _, uid := range uids {
		delete(out, uid)
	}
	return out
}

// readAllMetadata finds the files of c's claims on disk (readMetadata).
func readAllMetadata(pluginDir string, c checkpoint) claimFiles {
	out := make(claimFiles, len(c.Claims))
	for uid := range c.Claims {
		if m := readMetadata(pluginDir, uid); len(m) > 0 {
			out[uid] = m
		}
	}
	return out
}

// removeMetadataOf removes the metadata files of the claims uids, which
// the checkpoint on disk no longer lists; a failure is logged (New
// removes them at the next start).
func (d *Driver) removeMetadataOf(uids []string) {
	for _, uid := range uids {
		if err := removeMetadata(d.opts.PluginDir, uid); err != nil {
			d.log.WithField("uid", uid).WithError(err).Warn("DRA: removing the device metadata of a released claim")
		}
	}
}
