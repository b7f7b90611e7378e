package dra

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// TestPrepareOverGRPC calls NodePrepareResources and
// NodeUnprepareResources on the plugin's socket as the kubelet does: a
// claim of a GPU and a MIG device gets one CDI device each, its spec has
// only their device nodes and the claim's environment entries (no hooks,
// no mounts), the request path's view has them, and unprepare releases
// it all.
func TestPrepareOverGRPC(t *testing.T) {
	e := newEnv(t, draConfig(), testSnapshot(), nil)
	c := e.claim(t, "train", "uid-1", false, "gpu-0", "gpu-1-mig-1g10gb-19-5")
	got := e.prepare(t, c)
	kind := "k8s.gpu.nri-gpu.dev/claim"
	want := &drapb.NodePrepareResourceResponse{Devices: []*drapb.Device{
		{RequestNames: []string{"gpu"}, PoolName: testNode, DeviceName: "gpu-0", CdiDeviceIds: []string{kind + "=uid-1-gpu-0"}},
		{RequestNames: []string{"gpu"}, PoolName: testNode, DeviceName: "gpu-1-mig-1g10gb-19-5", CdiDeviceIds: []string{kind + "=uid-1-gpu-1-mig-1g10gb-19-5"}},
	}}
	if diff := cmp.Diff(want, got, protoCmp()); diff != "" {
		t.Fatalf("prepare (-want +got):\n%s", diff)
	}
	mode := func(m os.FileMode) *os.FileMode { return &m }
	wantSpec := &specs.Spec{Version: "0.3.0", Kind: kind, Devices: []specs.Device{
		{Name: "uid-1-gpu-0", ContainerEdits: specs.ContainerEdits{Env: []string{"NRI_GPU_DRA_GPU_0=uid-1"},
			DeviceNodes: []*specs.DeviceNode{{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0, Permissions: "rw", FileMode: mode(0o666)}}}},
		{Name: "uid-1-gpu-1-mig-1g10gb-19-5", ContainerEdits: specs.ContainerEdits{Env: []string{"NRI_GPU_DRA_GPU_1_MIG_1G10GB_19_5=uid-1"},
			DeviceNodes: []*specs.DeviceNode{
				{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1, Permissions: "rw", FileMode: mode(0o666)},
				{Path: "/dev/nvidia-caps/nvidia-cap202", Type: "c", Major: 508, Minor: 202, Permissions: "rw", FileMode: mode(0o444)},
				{Path: "/dev/nvidia-caps/nvidia-cap203", Type: "c", Major: 508, Minor: 203, Permissions: "rw", FileMode: mode(0o444)}}}},
	}}
	if diff := cmp.Diff(wantSpec, e.spec(t, "uid-1")); diff != "" {
		t.Errorf("CDI spec (-want +got):\n%s", diff)
	}
	p := e.d.Prepared()
	held, forged := p.ForContainer([]string{"NRI_GPU_DRA_GPU_0=uid-1"}, []string{"/dev/nvidia0"})
	if len(held) != 1 || held[0].UUID != "GPU-aaaaaaaa" || len(forged) != 0 {
		t.Errorf("the request path's view: held %v, forged %v", held, forged)
	}
	if diff := cmp.Diff(map[string]string{"GPU-aaaaaaaa": "uid-1", "MIG-nnnnnnnn": "uid-1"}, p.Holdings()); diff != "" {
		t.Errorf("holdings (-want +got):\n%s", diff)
	}
	// Again (a kubelet restart): the same answer, nothing added.
	if diff := cmp.Diff(want, e.prepare(t, c), protoCmp()); diff != "" {
		t.Errorf("second prepare (-want +got):\n%s", diff)
	}
	e.unprepare(t, c)
	e.unprepare(t, c) // twice is no error
	if e.spec(t, "uid-1") != nil || e.d.Prepared().Len() != 0 {
		t.Errorf("unprepare left the spec or %d prepared devices", e.d.Prepared().Len())
	}
}

// TestPrepareRefusals: a device not on the node, an unhealthy one, another
// pool's: the claim fails with what is wrong, nothing is written.
func TestPrepareRefusals(t *testing.T) {
	e := newEnv(t, draConfig(), testSnapshot(), nil)
	st := *e.n.State()
	st.Unhealthy = map[string]string{"GPU-cccccccc": "XID 79"}
	e.n.Swap(&st)
	for _, tc := range []struct {
		name, device, want string
	}{
		{"unknown", "gpu-7", `device "gpu-7" is not on this node now (it has gpu-0, gpu-1-mig-1g10gb-19-4, gpu-1-mig-1g10gb-19-5, gpu-2)`},
		{"whole GPU in MIG mode", "gpu-1", `device "gpu-1" is not on this node now`},
		{"unhealthy", "gpu-2", `device gpu-2 (GPU-cccccccc) is unhealthy: XID 79`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.claim(t, "c-"+tc.device, "uid-"+tc.device, false, tc.device)
			r := e.prepare(t, c)
			if !strings.Contains(r.GetError(), tc.want) || len(r.GetDevices()) != 0 {
				t.Errorf("prepare: %v, want error %q", r, tc.want)
			}
			if e.spec(t, string(c.UID)) != nil {
				t.Error("a refused claim has a CDI spec")
			}
		})
	}
	other := e.claim(t, "elsewhere", "uid-x", false, "gpu-0")
	other.Status.Allocation.Devices.Results[0].Pool = "node-b"
	if _, err := e.client.ResourceV1().ResourceClaims("ml").Update(context.Background(), other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := e.prepare(t, other); !strings.Contains(r.GetError(), `pool "node-b" is not this node's (node-a)`) {
		t.Errorf("another pool: %v", r)
	}
	if e.d.Prepared().Len() != 0 {
		t.Errorf("%d devices prepared", e.d.Prepared().Len())
	}
}

// TestDeletedClaimNeverBlocks: a claim deleted (or its name reused) while
// prepared does not keep its device from a new claim; a claim that still
// holds the device does. AdminAccess takes a held device without holding
// it.
func TestDeletedClaimNeverBlocks(t *testing.T) {
	e := newEnv(t, draConfig(), testSnapshot(), nil)
	old := e.claim(t, "old", "uid-old", false, "gpu-0")
	if r := e.prepare(t, old); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	admin := e.claim(t, "admin", "uid-admin", true, "gpu-0")
	if r := e.prepare(t, admin); r.GetError() != "" {
		t.Fatalf("adminAccess beside a holder: %s", r.GetError())
	}
	busy := e.claim(t, "busy", "uid-busy", false, "gpu-0")
	if r := e.prepare(t, busy); !strings.Contains(r.GetError(), "device gpu-0 is prepared for claim ml/old (uid-old), which still holds it") {
		t.Errorf("a held device: %v", r)
	}
	// The old claim goes while prepared (the kubelet never unprepared it).
	if err := e.client.ResourceV1().ResourceClaims("ml").Delete(context.Background(), "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := e.prepare(t, busy); r.GetError() != "" {
		t.Fatalf("a deleted claim blocks: %s", r.GetError())
	}
	if e.spec(t, "uid-old") != nil {
		t.Error("the deleted claim's spec stayed")
	}
	want := map[string]string{"GPU-aaaaaaaa": "uid-busy"}
	if diff := cmp.Diff(want, e.d.Prepared().Holdings()); diff != "" {
		t.Errorf("holdings (-want +got):\n%s", diff)
	}
	// Its name reused by a new claim that is not allocated the device.
	e.claim(t, "old", "uid-new", false, "gpu-2")
	if err := e.client.ResourceV1().ResourceClaims("ml").Delete(context.Background(), "busy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.claim(t, "busy", "uid-busy-2", false, "gpu-2")
	third := e.claim(t, "third", "uid-3", false, "gpu-0")
	if r := e.prepare(t, third); r.GetError() != "" {
		t.Errorf("a replaced claim blocks: %s", r.GetError())
	}
}

// TestRestart: the checkpoint carries the prepared claims across a
// restart; a spec lost meanwhile (tmpfs) is written again, a spec without
// a claim (a crash between the writes) removed; a checkpoint of an
// unknown version is refused.
func TestRestart(t *testing.T) {
	e := newEnv(t, draConfig(), testSnapshot(), nil)
	c := e.claim(t, "train", "uid-1", false, "gpu-2")
	if r := e.prepare(t, c); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	before := e.d.Prepared().Devices()
	e.stop()
	dirs := e.dirs
	if err := os.Remove(filepath.Join(dirs.CDIDir, specFile(testDriver, "uid-1"))); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(dirs.CDIDir, specFile(testDriver, "uid-gone"))
	if err := os.WriteFile(orphan, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dirs.CDIDir, "nvidia.yaml") // another vendor's spec stays
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	e2 := newEnv(t, draConfig(), testSnapshot(), &dirs)
	if diff := cmp.Diff(before, e2.d.Prepared().Devices()); diff != "" {
		t.Errorf("prepared after a restart (-before +after):\n%s", diff)
	}
	if e2.spec(t, "uid-1") == nil {
		t.Error("the lost spec was not written again")
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Error("a spec of no prepared claim stayed")
	}
	if _, err := os.Stat(other); err != nil {
		t.Error("another vendor's spec was removed")
	}
	e2.stop()
	if err := os.WriteFile(filepath.Join(dirs.PluginDir, CheckpointFile), []byte(`{"version":"dra.nri-gpu.dev/v9","claims":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(dirs, e2.n, e2.client, quietLog()); err == nil || !strings.Contains(err.Error(), `version "dra.nri-gpu.dev/v9" is not one this nri-gpu reads (dra.nri-gpu.dev/v1, dra.nri-gpu.dev/v2)`) {
		t.Errorf("a newer checkpoint: %v", err)
	}
}

// TestPublish: the fake API server gets one ResourceSlice of the node's
// pool; a GPU that XID health takes out is tainted with NVIDIA's key and
// value, and untainted when it recovers; where the API server has no
// device taints it is left out instead, and back when it recovers.
func TestPublish(t *testing.T) {
	e := newEnv(t, draConfig(), testSnapshot(), nil)
	slices := func() []resourceapi.Device {
		t.Helper()
		var devs []resourceapi.Device
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			l, err := e.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
			if err == nil && len(l.Items) == 1 {
				s := l.Items[0]
				if s.Spec.Driver != testDriver || s.Spec.Pool.Name != testNode || s.Spec.NodeName == nil || *s.Spec.NodeName != testNode {
					t.Fatalf("slice %+v", s.Spec)
				}
				return s.Spec.Devices
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal("no ResourceSlice published")
		return devs
	}
	waitFor := func(what string, ok func([]resourceapi.Device) bool) []resourceapi.Device {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			devs := slices()
			if ok(devs) {
				return devs
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: devices %v", what, names2(devs))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("four devices", func(d []resourceapi.Device) bool { return len(d) == 4 })
	st := *e.n.State()
	st.Unhealthy = map[string]string{"GPU-aaaaaaaa": "XID 79", "MIG-mmmmmmmm": "NVML: nvmlDeviceGetUUID: GPU is lost (15) on its GPU GPU-bbbbbbbb"}
	e.n.Swap(&st)
	devs := waitFor("taints", func(d []resourceapi.Device) bool { return len(d) == 4 && len(d[0].Taints) == 1 })
	if diff := cmp.Diff([]resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}, devs[0].Taints, cmpTaint()); diff != "" {
		t.Errorf("XID taint (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/gpu-lost", Effect: resourceapi.DeviceTaintEffectNoSchedule}}, devs[2].Taints, cmpTaint()); diff != "" {
		t.Errorf("lost taint (-want +got):\n%s", diff)
	}
	// An API server without DRADeviceTaints drops them: the library tells
	// HandleError, and the unhealthy devices are left out.
	e.d.HandleError(context.Background(), droppedTaints(devs), "publish")
	waitFor("left out", func(d []resourceapi.Device) bool { return len(d) == 2 && d[0].Name == "gpu-2" })
	st.Unhealthy = nil
	e.n.Swap(&st)
	waitFor("recovered", func(d []resourceapi.Device) bool { return len(d) == 4 && len(d[0].Taints) == 0 })
}

func names2(devs []resourceapi.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.Name+"/"+itoa(len(d.Taints)))
	}
	return out
}

func protoCmp() cmp.Option { return protocmp.Transform() }

// cmpTaint ignores when a taint was added (the library sets it).
func cmpTaint() cmp.Option {
	return cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".TimeAdded" }, cmp.Ignore())
}

// droppedTaints is what the library reports when the API server dropped
// the devices' taints: the desired slice has them, the stored one not.
func droppedTaints(devs []resourceapi.Device) error {
	desired := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: devs}}
	actual := desired.DeepCopy()
	for i := range actual.Spec.Devices {
		actual.Spec.Devices[i].Taints = nil
	}
	return &resourceslice.DroppedFieldsError{PoolName: testNode, DesiredSlice: desired, ActualSlice: actual}
}
