package dra

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// decodeMetadataFile reads a metadata file with the Kubernetes library's
// consumer-side decoder, validation on, as a container's reader would,
// into dest; it returns the apiVersions the stream holds, in order.
func decodeMetadataFile(t *testing.T, path string, dest interface {
	GetObjectKind() schema.ObjectKind
}) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var verr error
	var gvk schema.GroupVersionKind
	obj, ok := dest.(*metadata.DeviceMetadata)
	if ok {
		err = devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), obj,
			devicemetadata.DecodeMetadataWithValidationResult(&verr), devicemetadata.DecodeMetadataStoreGVKResult(&gvk))
	} else {
		err = devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), dest.(*metadatav1alpha1.DeviceMetadata),
			devicemetadata.DecodeMetadataWithValidationResult(&verr))
	}
	if err != nil || verr != nil {
		t.Fatalf("decode %s: %v, validation: %v", path, err, verr)
	}
	var versions []string
	dec := json.NewDecoder(bytes.NewReader(data))
	for dec.More() {
		var head metav1.TypeMeta
		if err := dec.Decode(&head); err != nil {
			t.Fatal(err)
		}
		versions = append(versions, head.APIVersion+" "+head.Kind)
	}
	return versions
}

// TestDeviceMetadata: Prepare writes, for each request of a claim, the
// device metadata file Kubernetes defines (the library's decoder reads it
// and its validation passes): the claim's name, namespace and UID, the
// request (with its subrequest), and each device with this driver, the
// node's pool and the attributes its ResourceSlice publishes; in
// v1beta1, then v1alpha1. The request path's view names the file and its
// container path (resourceclaims/<claim>, or resourceclaimtemplates/<pod
// claim name> for a claim made from a template). A restart finds the
// files again and removes those of claims not prepared; Unprepare
// removes the claim's.
func TestDeviceMetadata(t *testing.T) {
	e := newEnv(t, draConfig(), testSnapshot(), nil)
	direct := e.claim(t, "train", "uid-1", false, "gpu-0")
	tmpl := e.claim(t, "job-0-gpus-x7k2q", "uid-2", false, "gpu-2", "gpu-1-mig-1g10gb-19-5")
	tmpl.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "gpus"}
	tmpl.Status.Allocation.Devices.Results[1].Request = "mig/small"
	if _, err := e.client.ResourceV1().ResourceClaims("ml").Update(context.Background(), tmpl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*resourceapi.ResourceClaim{direct, tmpl} {
		if r := e.prepare(t, c); r.GetError() != "" {
			t.Fatalf("prepare %s: %s", c.Name, r.GetError())
		}
	}
	base := filepath.Join(e.dirs.PluginDir, MetadataDir)
	file := testDriver + "-metadata.json"
	want := map[string]claims.Metadata{
		"uid-1 gpu-0": {Host: filepath.Join(base, "uid-1/resourceclaims/train/gpu", file),
			Container: "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/gpu/" + file},
		"uid-2 gpu-2": {Host: filepath.Join(base, "uid-2/resourceclaimtemplates/gpus/gpu", file),
			Container: "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/" + file},
		"uid-2 gpu-1-mig-1g10gb-19-5": {Host: filepath.Join(base, "uid-2/resourceclaimtemplates/gpus/mig", file),
			Container: "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/mig/" + file},
	}
	view := func(p *claims.Prepared) map[string]claims.Metadata {
		out := map[string]claims.Metadata{}
		for _, d := range p.Devices() {
			out[d.Claim.UID+" "+d.Name] = d.Metadata
		}
		return out
	}
	if diff := cmp.Diff(want, view(e.d.Prepared())); diff != "" {
		t.Fatalf("the request path's view of the files (-want +got):\n%s", diff)
	}
	if want["uid-1 gpu-0"].Container != metadata.ResourceClaimFilePath(testDriver, "train", "gpu") ||
		want["uid-2 gpu-2"].Container != metadata.ResourceClaimTemplateFilePath(testDriver, "gpus", "gpu") {
		t.Fatal("the container paths are not the library's")
	}

	st := e.n.State()
	byName := map[string]unit{}
	for _, u := range units(st) {
		byName[u.name] = u
	}
	attrs := func(name string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return sliceDevice(byName[name], st.Snapshot(), e.d.pcieRoot, nil).Attributes
	}
	var got metadata.DeviceMetadata
	versions := decodeMetadataFile(t, want["uid-1 gpu-0"].Host, &got)
	if diff := cmp.Diff([]string{"metadata.resource.k8s.io/v1beta1 DeviceMetadata", "metadata.resource.k8s.io/v1alpha1 DeviceMetadata"}, versions); diff != "" {
		t.Errorf("versions in the stream (-want +got):\n%s", diff)
	}
	wantMeta := metadata.DeviceMetadata{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", UID: types.UID("uid-1"), Generation: 1},
		Requests: []metadata.DeviceMetadataRequest{{Name: "gpu", Devices: []metadata.Device{
			{Driver: testDriver, Pool: testNode, Name: "gpu-0", Attributes: attrs("gpu-0")}}}},
	}
	if diff := cmp.Diff(wantMeta, got); diff != "" {
		t.Errorf("metadata of claim train (-want +got):\n%s", diff)
	}
	if u := got.Requests[0].Devices[0].Attributes["gpu.nvidia.com/uuid"]; u.StringValue == nil || *u.StringValue != "GPU-aaaaaaaa" {
		t.Errorf("gpu-0's uuid attribute: %v", u)
	}
	var mig metadata.DeviceMetadata
	decodeMetadataFile(t, want["uid-2 gpu-1-mig-1g10gb-19-5"].Host, &mig)
	podClaim := "gpus"
	wantMIG := metadata.DeviceMetadata{
		ObjectMeta:   metav1.ObjectMeta{Name: "job-0-gpus-x7k2q", Namespace: "ml", UID: types.UID("uid-2"), Generation: 1},
		PodClaimName: &podClaim,
		Requests: []metadata.DeviceMetadataRequest{{Name: "mig/small", Devices: []metadata.Device{
			{Driver: testDriver, Pool: testNode, Name: "gpu-1-mig-1g10gb-19-5", Attributes: attrs("gpu-1-mig-1g10gb-19-5")}}}},
	}
	if diff := cmp.Diff(wantMIG, mig); diff != "" {
		t.Errorf("metadata of the template's claim, request mig (-want +got):\n%s", diff)
	}
	if p := mig.Requests[0].Devices[0].Attributes["gpu.nvidia.com/profile"]; p.StringValue == nil || *p.StringValue != "1g.10gb" {
		t.Errorf("the MIG device's profile attribute: %v", p)
	}
	// An older consumer reads the v1alpha1 copy.
	var old metadatav1alpha1.DeviceMetadata
	decodeMetadataFile(t, want["uid-2 gpu-2"].Host, &old)
	if old.Name != "job-0-gpus-x7k2q" || len(old.Requests) != 1 || old.Requests[0].Name != "gpu" || len(old.Requests[0].Devices) != 1 || old.Requests[0].Devices[0].Name != "gpu-2" {
		t.Errorf("v1alpha1 view: %+v", old)
	}

	// A restart: the files are found again; a claim's directory that the
	// checkpoint does not name goes.
	orphan := filepath.Join(base, "uid-gone", "resourceclaims", "gone", "gpu", file)
	if err := os.MkdirAll(filepath.Dir(orphan), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(orphan, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.stop()
	e = newEnv(t, draConfig(), testSnapshot(), &e.dirs)
	if diff := cmp.Diff(want, view(e.d.Prepared())); diff != "" {
		t.Errorf("after a restart (-want +got):\n%s", diff)
	}
	back, err := ReadPrepared(e.dirs.PluginDir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, view(back)); diff != "" {
		t.Errorf("ReadPrepared (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(base, "uid-gone")); !os.IsNotExist(err) {
		t.Errorf("the metadata of a claim that is not prepared stayed: %v", err)
	}
	// A file removed while prepared comes back at the next prepare.
	if err := os.Remove(want["uid-1 gpu-0"].Host); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.ResourceV1().ResourceClaims("ml").Create(context.Background(), direct, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := e.prepare(t, direct); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	decodeMetadataFile(t, want["uid-1 gpu-0"].Host, &got)
	// Prepared again unchanged: the file is left as it is (a container
	// being created meanwhile mounts it).
	fi1, err := os.Stat(want["uid-1 gpu-0"].Host)
	if err != nil {
		t.Fatal(err)
	}
	if r := e.prepare(t, direct); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if fi2, err := os.Stat(want["uid-1 gpu-0"].Host); err != nil || !os.SameFile(fi1, fi2) {
		t.Errorf("a prepare of an unchanged claim replaced its file: %v", err)
	}

	e.unprepare(t, direct)
	if _, err := os.Stat(filepath.Join(base, "uid-1")); !os.IsNotExist(err) {
		t.Errorf("unprepare left the claim's metadata: %v", err)
	}
	if _, err := os.Stat(want["uid-2 gpu-2"].Host); err != nil {
		t.Errorf("unprepare of another claim removed this one's: %v", err)
	}
}

// TestMetadataNames: names that become path components are checked as
// the API server's names; a bad one fails the claim's metadata, naming
// the field and the value. What is read back at start is only what this
// driver writes: regular files at valid names.
func TestMetadataNames(t *testing.T) {
	attrs := func(string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute { return nil }
	dev := []claims.Device{{Request: "gpu", Name: "gpu-0"}}
	for _, tc := range []struct {
		name string
		c    resourceapi.ResourceClaim
		devs []claims.Device
		want string
	}{
		{"uid", resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "a", UID: "../../etc"}}, dev, `claim uid "../../etc" is not valid`},
		{"namespace", resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "m/l", Name: "a", UID: "u"}}, dev, `claim namespace "m/l" is not valid`},
		{"name", resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "..", UID: "u"}}, dev, `claim name ".." is not valid`},
		{"pod claim", resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "a", UID: "u",
			Annotations: map[string]string{resourceapi.PodResourceClaimAnnotation: "../x"}}}, dev, `annotation resource.kubernetes.io/pod-claim-name: "../x" is not a pod claim name`},
		{"request", resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "a", UID: "u"}},
			[]claims.Device{{Request: "../gpu", Name: "gpu-0"}}, `request "../gpu" is not a request name`},
	} {
		if _, err := claimMetadata(&tc.c, testDriver, testNode, tc.devs, attrs); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}

	dir := t.TempDir()
	root := claimMetadataDir(dir, "uid-1")
	good := filepath.Join(root, "resourceclaims", "train", "gpu", testDriver+"-metadata.json")
	for _, p := range []string{good, filepath.Join(root, "resourceclaims", "train", "Bad_Request", "x-metadata.json"),
		filepath.Join(root, "elsewhere", "train", "gpu", "x-metadata.json"), filepath.Join(root, "resourceclaims", "train", "gpu", "other.json")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "resourceclaims", "train", "link"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/shadow", filepath.Join(root, "resourceclaims", "train", "link", "x-metadata.json")); err != nil {
		t.Fatal(err)
	}
	got := readMetadata(dir, "uid-1")
	want := map[string]claims.Metadata{"gpu": {Host: good, Container: metadata.ResourceClaimFilePath(testDriver, "train", "gpu")}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("read back (-want +got):\n%s", diff)
	}
	if readMetadata(dir, "..") != nil || removeMetadata(dir, "../..") != nil {
		t.Error("a uid that is not a name was looked up")
	}
}
