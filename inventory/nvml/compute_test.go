package nvml_test

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/inventory/nvml"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestComputeMode reads and sets GPUs' compute modes through the real
// binding against the simulated library: Default until set; a set, as
// root, persists for the next process to read (the node records it); as
// another user it fails with NVML's Insufficient Permissions, as NVIDIA's
// does; an unknown UUID and a lost GPU are errors naming the call.
func TestComputeMode(t *testing.T) {
	n, lib := simNVML(t, 2, simnode.NVMLState{GPUs: []simnode.NVMLGPU{{}, {Lost: true}}})
	cm, ok := lib.(nvml.ComputeModes)
	if !ok {
		t.Fatal("the library's Lib has no compute modes")
	}
	if m, err := cm.ComputeMode(n.GPUs[0].UUID); err != nil || m != nvml.ComputeModeDefault {
		t.Fatalf("ComputeMode = %v, %v; want Default", m, err)
	}
	err := cm.SetComputeMode(n.GPUs[0].UUID, nvml.ComputeModeExclusiveProcess)
	if os.Geteuid() != 0 {
		if !nvml.IsCode(err, nvml.ErrNoPermission) || !strings.Contains(err.Error(), "Insufficient Permissions") {
			t.Fatalf("SetComputeMode as uid %d = %v, want NVML's Insufficient Permissions", os.Geteuid(), err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if m, err := cm.ComputeMode(n.GPUs[0].UUID); err != nil || m != nvml.ComputeModeExclusiveProcess || m.String() != "Exclusive_Process" {
		t.Errorf("ComputeMode after the set = %v, %v", m, err)
	}
	got, err := n.ComputeModes()
	if d := cmp.Diff(map[string]int{n.GPUs[0].UUID: simnode.ComputeModeExclusiveProcess}, got); err != nil || d != "" {
		t.Errorf("the node's record (-want +got), %v:\n%s", err, d)
	}
	if _, err := cm.ComputeMode("GPU-00000000-0000-0000-0000-000000000000"); !nvml.IsCode(err, nvml.ErrNotFound) || !strings.Contains(err.Error(), "nvmlDeviceGetHandleByUUID") {
		t.Errorf("an unknown UUID: %v", err)
	}
	if err := cm.SetComputeMode(n.GPUs[1].UUID, nvml.ComputeModeExclusiveProcess); !nvml.IsCode(err, nvml.ErrGPUIsLost) {
		t.Errorf("a lost GPU: %v", err)
	}
	if err := cm.SetComputeMode(n.GPUs[0].UUID, nvml.ComputeModeDefault); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.ComputeModes(); len(got) != 0 {
		t.Errorf("after a set back to Default the node records %v", got)
	}
}
