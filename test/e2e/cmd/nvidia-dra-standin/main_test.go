package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"sigs.k8s.io/yaml"
)

// toolkitSpec is a toolkit spec of two GPUs, as `nvidia-ctk cdi
// generate` shapes it (by index, by UUID, common edits with a hook).
const toolkitSpec = `{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
 "devices": [
  {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
  {"name": "GPU-aaaa", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
  {"name": "GPU-bbbb", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia3"}]}}],
 "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
  "hooks": [{"hookName": "createContainer", "path": "/x/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"]}],
  "mounts": [{"hostPath": "/usr/lib64/libcuda.so.1", "containerPath": "/usr/lib64/libcuda.so.1"}]}}`

func newTestDriver(t *testing.T) *driver {
	t.Helper()
	dir := t.TempDir()
	d := &driver{gpus: map[string]gpu{}, ckpt: map[types.UID]string{}, cfg: config{
		DriverName: "gpu.nvidia.com", NodeName: "nv-a", PluginDir: filepath.Join(dir, "plugin"), CDIDir: filepath.Join(dir, "cdi"),
		GPUs: []gpu{{Index: 0, Minor: 0, UUID: "GPU-aaaa"}, {Index: 1, Minor: 3, UUID: "GPU-bbbb"}},
	}}
	for _, p := range []string{d.cfg.PluginDir, d.cfg.CDIDir} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := json.Unmarshal([]byte(toolkitSpec), &d.toolkit); err != nil {
		t.Fatal(err)
	}
	for _, g := range d.cfg.GPUs {
		d.gpus[g.DeviceName()] = g
	}
	return d
}

func claim(uid string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-" + uid, UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, dv := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: "gpu.nvidia.com", Pool: "nv-a", Device: dv})
	}
	return c
}

// TestPrepareWritesNVIDIAClaimSpec: a claim of gpu-3 gets the spec file,
// kind, device name and edits NVIDIA's driver writes, the CDI device ID
// naming it, and a checkpoint entry; unprepare removes both.
func TestPrepareWritesNVIDIAClaimSpec(t *testing.T) {
	d := newTestDriver(t)
	ctx := context.Background()
	out, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("u1", "gpu-3")})
	if err != nil || out["u1"].Err != nil {
		t.Fatal(err, out["u1"].Err)
	}
	want := []kubeletplugin.Device{{Requests: []string{"gpu"}, PoolName: "nv-a", DeviceName: "gpu-3",
		CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=u1-gpu-3"}}}
	if diff := cmp.Diff(want, out["u1"].Devices); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
	path := filepath.Join(d.cfg.CDIDir, "k8s.gpu.nvidia.com-claim_u1.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got, tk map[string]any
	if err := yaml.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(toolkitSpec), &tk); err != nil {
		t.Fatal(err)
	}
	wantSpec := map[string]any{"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim",
		"devices":        []any{map[string]any{"name": "u1-gpu-3", "containerEdits": tk["devices"].([]any)[2].(map[string]any)["containerEdits"]}},
		"containerEdits": tk["containerEdits"]}
	if diff := cmp.Diff(wantSpec, got); diff != "" {
		t.Errorf("the claim's spec (-want +got):\n%s", diff)
	}
	if d.ckpt["u1"] != "PrepareCompleted" {
		t.Errorf("checkpoint %v, want u1 PrepareCompleted", d.ckpt)
	}
	if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the spec after unprepare: %v", err)
	}
	ck, _ := os.ReadFile(filepath.Join(d.cfg.PluginDir, "checkpoint.json"))
	if string(ck) != "{}" {
		t.Errorf("checkpoint after unprepare: %s", ck)
	}
}

// TestPrepareRefusesForeignDevice: a device the node does not have fails
// the claim, naming it, and writes no spec.
func TestPrepareRefusesForeignDevice(t *testing.T) {
	d := newTestDriver(t)
	out, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim("u2", "gpu-7")})
	if err != nil {
		t.Fatal(err)
	}
	if e := out["u2"].Err; e == nil || !strings.Contains(e.Error(), `device "gpu-7" is not a GPU of node nv-a`) {
		t.Errorf("error %v, want one naming gpu-7", e)
	}
	if ents, _ := os.ReadDir(d.cfg.CDIDir); len(ents) != 0 {
		t.Errorf("specs written: %v", ents)
	}
}
