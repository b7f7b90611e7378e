package cdisource

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// TestVendorAdjustment checks the edits of another vendor's CDI devices:
// the spec's own edits then the device's, hooks at their stage with their
// explicit env, and nothing of NVIDIA's.
func TestVendorAdjustment(t *testing.T) {
	kfd := inventory.DeviceNode{Path: "/dev/kfd", Major: 240, Mode: 0o666}
	s := &Source{
		kind: "amd.com/gpu",
		snap: &inventory.Snapshot{GPUs: []inventory.GPU{{Index: 0, Name: "0", Node: inventory.DeviceNode{Path: "/dev/dri/renderD128", Major: 226, Minor: 128, Mode: 0o666}}}},
		common: &edits{nodes: []inventory.DeviceNode{kfd}, env: []string{"HSA=1"},
			mounts: []inventory.Mount{{Source: "/opt/rocm/lib", Destination: "/opt/rocm/lib", Type: "bind", Options: []string{"ro", "rbind"}}}},
		edits: []*edits{{nodes: []inventory.DeviceNode{kfd}, hooks: []inventory.Hook{{Stage: "createContainer", Path: "/bin/true", Env: []string{"PATH=/bin"}}}}},
	}
	e := s.Edits(s.Devices(), inventory.AllCapabilities)
	adj := e.Adjustment(nil)
	var devs []string
	for _, d := range adj.Linux.Devices {
		devs = append(devs, d.Path)
	}
	if diff := cmp.Diff([]string{"/dev/kfd", "/dev/dri/renderD128"}, devs); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
	if len(adj.Mounts) != 1 || adj.Mounts[0].Type != "bind" || len(adj.Mounts[0].Options) != 2 {
		t.Errorf("mounts %v", adj.Mounts)
	}
	if len(adj.Env) != 1 || adj.Env[0].Key != "HSA" || adj.Env[0].Value != "1" {
		t.Errorf("env %v, want only the spec's", adj.Env)
	}
	h := adj.GetHooks().GetCreateContainer()
	if len(h) != 1 || h[0].Path != "/bin/true" || len(h[0].Env) != 1 || h[0].Env[0] != "PATH=/bin" || len(adj.GetHooks().GetPrestart()) != 0 {
		t.Errorf("hooks %v", adj.GetHooks())
	}
}
