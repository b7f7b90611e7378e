package pipeline

import (
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// TestRuntimeBinariesAtUsrBin: with a binary directory in the layout (the
// default layout), a container that the runtime gave its GPU and every
// driver file with the binaries at /usr/bin (a CDI spec of layout: toolkit,
// as nri-gpu cdi generate writes it, resolved before NRI by containerd 2.2
// and 1.7 and CRI-O) gets nothing more: not the binary directory, not a
// PATH. Fails before: the directory was injected as the one missing mount.
func TestRuntimeBinariesAtUsrBin(t *testing.T) {
	l := layout
	l.BinaryDir = "/usr/local/nvidia/bin"
	prep := adjust.Prepare(benchSnapshot(), l)
	toolkit := adjust.Prepare(benchSnapshot(), layout) // binaries at /usr/bin
	env := []string{"NVIDIA_VISIBLE_DEVICES=0"}
	mlPod := &api.PodSandbox{Id: "p", Name: "p", Namespace: "ml"}
	full, _, err := handleWithPolicy(toolkit, tableFor(toolkit.Snapshot()), sharing.Shared, policy.Policy{}, mlPod, &api.Container{Name: "c", Env: env})
	if err != nil {
		t.Fatal(err)
	}
	ctr := &api.Container{Name: "c", Env: env, Linux: &api.LinuxContainer{Devices: full.Linux.Devices}, Mounts: full.Mounts}
	adj, res, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), sharing.Shared, policy.Policy{}, mlPod, ctr)
	if adj != nil || err != nil || !strings.Contains(res.Selection.Note, "and every driver file: nothing injected") {
		t.Errorf("%v, %v, %q", adj, err, res.Selection.Note)
	}
	// Without the binaries at /usr/bin, the directory is what is missing.
	var noBin []*api.Mount
	for _, m := range full.Mounts {
		if !strings.HasPrefix(m.Destination, "/usr/bin/") {
			noBin = append(noBin, m)
		}
	}
	ctr.Mounts = noBin
	adj, _, err = handleWithPolicy(prep, tableFor(prep.Snapshot()), sharing.Shared, policy.Policy{}, mlPod, ctr)
	if err != nil || len(adj.GetMounts()) == 0 || !strings.HasSuffix(envOf(adj)["PATH"], ":"+l.BinaryDir) {
		t.Fatalf("binaries missing: %v, %v", adj, err)
	}
	for _, m := range adj.GetMounts() {
		if !strings.HasPrefix(m.Destination, l.BinaryDir+"/") {
			t.Errorf("binaries missing: mount %s, want only the binaries in %s", m.Destination, l.BinaryDir)
		}
	}
}
