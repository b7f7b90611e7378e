package cdispec_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdispec"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestGenerateMIG: on a node with MIG on GPUs 0 and 1 (MIG devices from
// the simulated NVML), the spec names each MIG device as the toolkit does,
// nvidia.com/gpu=<gpu>:<mig> and nvidia.com/gpu=MIG-<uuid>, with its
// parent's node and its GPU and compute instances' capability nodes; the
// MIG-enabled GPUs have no device; "all" holds every node once. The spec
// validates, a runtime's CDI cache resolves the names, and Resolvable
// (emit: cdi) finds the MIG devices by UUID.
func TestGenerateMIG(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: the GPUs of a simulated node are character devices made with mknod: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 3, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.SetMIG(simnode.MixedMIG()); err != nil {
		t.Fatal(err)
	}
	major, err := n.CapsMajor()
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = n.Root, n.Root, n.Root
	cfg.Layout, cfg.BinaryDir = config.LayoutToolkit, "" // as nri-gpu cdi generate does
	p, err := node.New(cfg, logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	snap := p.Snapshot()
	if len(snap.MIG) != 11 {
		t.Fatalf("%d MIG devices, want 11", len(snap.MIG))
	}
	spec, err := cdispec.Generate(p.State().Source, inventory.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	data, err := cdispec.Marshal(spec)
	if err != nil {
		t.Fatalf("the spec does not validate: %v", err)
	}
	var names []string
	for _, d := range spec.Devices {
		names = append(names, d.Name)
	}
	want := []string{"2", n.GPUs[2].UUID}
	for _, m := range snap.MIG {
		want = append(want, m.Name(), m.UUID)
	}
	want = append(want, "all")
	if !slices.Equal(names, want) {
		t.Errorf("devices %q, want %q", names, want)
	}

	// 1:3 is GPU 1's GPU instance 13, compute instance 0.
	m := snap.MIG[10]
	g1 := n.GPUs[1]
	if m.Name() != "1:3" || m.GI != 13 {
		t.Fatalf("MIG device 10: %+v", m)
	}
	wantNodes := []string{
		fmt.Sprintf("/dev/nvidia%d %d:%d", g1.Minor, 195, g1.Minor),
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d %d:%d", simnode.GIMinor(g1.Minor, 13), major, simnode.GIMinor(g1.Minor, 13)),
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d %d:%d", simnode.CIMinor(g1.Minor, 13, 0), major, simnode.CIMinor(g1.Minor, 13, 0)),
	}
	for _, name := range []string{"1:3", m.UUID} {
		i := slices.Index(names, name)
		if i < 0 {
			t.Errorf("no device %s", name)
			continue
		}
		var got []string
		for _, d := range spec.Devices[i].ContainerEdits.DeviceNodes {
			got = append(got, fmt.Sprintf("%s %d:%d", d.Path, d.Major, d.Minor))
		}
		if !slices.Equal(got, wantNodes) {
			t.Errorf("device %s: nodes %q, want %q", name, got, wantNodes)
		}
	}
	all := spec.Devices[len(spec.Devices)-1].ContainerEdits
	// GPU 2, GPUs 0 and 1 once each, 11 GI and 11 CI nodes.
	if len(all.DeviceNodes) != 1+2+22 {
		t.Errorf("all: %d nodes, want 25", len(all.DeviceNodes))
	}

	// A runtime resolves the names from the spec.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nri-gpu.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nvidia.com/gpu=1:3", "nvidia.com/gpu=" + m.UUID, "nvidia.com/gpu=0:0", "nvidia.com/gpu=2"} {
		if cache.GetDevice(name) == nil {
			t.Errorf("the CDI cache does not resolve %s", name)
		}
	}
	if cache.GetDevice("nvidia.com/gpu=0") != nil {
		t.Error("GPU 0, MIG-enabled, has a device")
	}

	// emit: cdi names MIG devices by UUID.
	resolvable, warnings := cdispec.Resolvable(snap, []string{dir})
	if len(warnings) > 0 {
		t.Errorf("warnings %q", warnings)
	}
	if resolvable[m.UUID] != "nvidia.com/gpu="+m.UUID || resolvable[snap.MIG[0].UUID] == "" || resolvable[n.GPUs[2].UUID] == "" {
		t.Errorf("Resolvable: %v", resolvable)
	}
}
