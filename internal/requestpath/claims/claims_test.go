package claims

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func testSet() *Prepared {
	a := Claim{UID: "uid-a", Namespace: "ml", Name: "train"}
	b := Claim{UID: "uid-b", Namespace: "ml", Name: "probe"}
	return New([]Device{
		{Claim: a, Request: "gpu", Name: "gpu-0", UUID: "GPU-0", Node: "/dev/nvidia0", Nodes: []string{"/dev/nvidia0"}},
		{Claim: a, Request: "gpu", Name: "gpu-1", UUID: "GPU-1", Node: "/dev/nvidia1", Nodes: []string{"/dev/nvidia1"}},
		{Claim: b, Request: "all", Name: "gpu-0", UUID: "GPU-0", Node: "/dev/nvidia0", Nodes: []string{"/dev/nvidia0"}, AdminAccess: true},
		{Claim: b, Request: "mig", Name: "gpu-2-mig-1g10gb-19-0", UUID: "MIG-2", MIG: true, Node: "/dev/nvidia-caps/nvidia-cap40",
			Nodes: []string{"/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap39", "/dev/nvidia-caps/nvidia-cap40"}},
	})
}

// TestForContainer: what a container holds is decided by its device
// nodes; an environment entry for a device whose node it lacks, for
// another claim, or for no prepared device is forged.
func TestForContainer(t *testing.T) {
	p := testSet()
	devs := p.Devices()
	for _, tc := range []struct {
		name       string
		env, nodes []string
		held       []Device
		forged     []string
	}{
		{"one claim, two GPUs", []string{"PATH=/bin", "NRI_GPU_DRA_GPU_0=uid-a", "NRI_GPU_DRA_GPU_1=uid-a"}, []string{"/dev/nvidia0", "/dev/nvidia1"}, devs[:2], nil},
		{"env without the node", []string{"NRI_GPU_DRA_GPU_1=uid-a"}, []string{"/dev/nvidia0"}, nil, []string{"NRI_GPU_DRA_GPU_1=uid-a"}},
		{"another claim's uid", []string{"NRI_GPU_DRA_GPU_1=uid-b"}, []string{"/dev/nvidia1"}, nil, []string{"NRI_GPU_DRA_GPU_1=uid-b"}},
		{"no such device", []string{"NRI_GPU_DRA_GPU_7=uid-a"}, []string{"/dev/nvidia7"}, nil, []string{"NRI_GPU_DRA_GPU_7=uid-a"}},
		{"admin and holder of one GPU", []string{"NRI_GPU_DRA_GPU_0=uid-b"}, []string{"/dev/nvidia0"}, devs[2:3], nil},
		{"MIG by its CI node", []string{"NRI_GPU_DRA_GPU_2_MIG_1G10GB_19_0=uid-b"}, devs[3].Nodes, devs[3:4], nil},
		{"MIG with its parent's node only", []string{"NRI_GPU_DRA_GPU_2_MIG_1G10GB_19_0=uid-b"}, []string{"/dev/nvidia2"}, nil, []string{"NRI_GPU_DRA_GPU_2_MIG_1G10GB_19_0=uid-b"}},
		{"nodes without env", nil, []string{"/dev/nvidia0"}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held, forged := p.ForContainer(tc.env, tc.nodes)
			if diff := cmp.Diff(tc.held, held); diff != "" {
				t.Errorf("held (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.forged, forged); diff != "" {
				t.Errorf("forged (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHoldings: adminAccess holds nothing; the rest is held by its claim.
func TestHoldings(t *testing.T) {
	got := testSet().Holdings()
	want := map[string]string{"GPU-0": "uid-a", "GPU-1": "uid-a", "MIG-2": "uid-b"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Holdings (-want +got):\n%s", diff)
	}
	var nilSet *Prepared
	if nilSet.Len() != 0 || nilSet.Holdings() != nil || len(nilSet.ByNode("/dev/nvidia0")) != 0 {
		t.Error("a nil set is not empty")
	}
	if n := len(testSet().ByNode("/dev/nvidia0")); n != 2 {
		t.Errorf("ByNode(/dev/nvidia0): %d devices, want 2", n)
	}
	if k := EnvKey("gpu-3-mig-1g10gb-19-0"); k != "NRI_GPU_DRA_GPU_3_MIG_1G10GB_19_0" {
		t.Errorf("EnvKey = %s", k)
	}
}
