package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
)

// TestWriteStatusKubelet: the table shows each GPU's kubelet assignment
// in its own column, beside the holders of requests nri-gpu read; GPUs
// the runtime gave (another device plugin's device nodes) are there too,
// marked.
func TestWriteStatusKubelet(t *testing.T) {
	k := alloc.Holder{ID: "a", Namespace: "ml", Pod: "train", Container: "main"}
	o := alloc.Holder{ID: "b", Namespace: "ml", Pod: "side", Container: "main"}
	s := status.Status{Ready: true, Sharing: "shared", GPUs: []status.GPUStatus{
		{GPUState: alloc.GPUState{Index: 0, Mode: "shared", Holders: []alloc.HolderState{{Holder: k, Mode: "shared", Kubelet: true}, {Holder: o, Mode: "shared"}}}, UUID: "GPU-0", Kubelet: []alloc.Holder{k}},
		{GPUState: alloc.GPUState{Index: 1, Mode: "free", Holders: []alloc.HolderState{}}, UUID: "GPU-1", Kubelet: []alloc.Holder{}},
		{GPUState: alloc.GPUState{Index: 2, Mode: "shared", Holders: []alloc.HolderState{{Holder: o, Mode: "shared", Runtime: true}}}, UUID: "GPU-2", Kubelet: []alloc.Holder{}},
	}}
	var b bytes.Buffer
	if err := writeStatus(&b, s); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	want := [][]string{
		{"GPU", "UUID", "MODE", "KUBELET", "HOLDERS"},
		{"0", "GPU-0", "shared", "ml/train/main", "(shared)", "ml/side/main", "(shared)"},
		{"1", "GPU-1", "free", "-", "-"},
		// Given by the runtime (NVIDIA's device plugin's DeviceSpecs).
		{"2", "GPU-2", "shared", "ml/side/main", "(shared,", "device", "nodes)", "-"},
	}
	for i, w := range want {
		if got := strings.Fields(lines[3+i]); strings.Join(got, " ") != strings.Join(w, " ") {
			t.Errorf("line %d: %q, want %q\n%s", i, got, w, b.String())
		}
	}
}
