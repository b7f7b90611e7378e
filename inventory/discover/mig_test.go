package discover_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

func TestParseMIGMinors(t *testing.T) {
	m, err := discover.ParseMIGMinors([]byte("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n\ngpu3/gi14/ci7/access 4321\nfuture/thing 7\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := discover.MIGMinors{Config: 1, Monitor: 2,
		GI: map[[2]int]int64{{0, 1}: 12},
		CI: map[[3]int]int64{{0, 1, 0}: 13, {3, 14, 7}: 4321}}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, bad := range []string{
		"config",                   // no minor
		"config x",                 // not a number
		"monitor -1",               // negative
		"gpu0/gi1/access 99999999", // too large
		"gpu/gi1/access 3",         // no GPU number
		"gpux/gi1/access 3",        // not a number
		"gpu0/gi01/access 3",       // leading zero
		"gpu0/gi64/access 3",       // beyond any GPU instance
		"gpu0/gi1/cix/access 3",    // bad CI
		"gpu999/gi1/ci0/access 3",  // beyond any GPU
		strings.Repeat("x", 70000), // a line over the bound
	} {
		if _, err := discover.ParseMIGMinors([]byte(bad + "\n")); err == nil {
			t.Errorf("%.40q: no error", bad)
		}
	}
}

// nvmlOf converts a simulated NVML state to AddMIG's input, as package
// node does with NVML's answer.
func nvmlOf(n *simnode.Node, st simnode.NVMLState) []discover.NVMLGPU {
	var out []discover.NVMLGPU
	for i, g := range n.GPUs {
		ng := discover.NVMLGPU{UUID: g.UUID, MemoryMiB: 81559, Props: &inventory.GPUProps{Architecture: "Hopper"}}
		if i < len(st.GPUs) && st.GPUs[i].MIGMode == 1 {
			ng.MIGEnabled = true
			for j, m := range st.GPUs[i].MIG {
				ng.MIG = append(ng.MIG, discover.NVMLMIG{UUID: simnode.MIGUUIDFor(g.UUID, m.GI, m.CI), Index: j, GI: m.GI, CI: m.CI,
					Profile: fmt.Sprintf("%dg", m.GISlices), MemoryMiB: m.MemoryMiB,
					Placement: &inventory.MIGPlacement{ProfileID: 19, Start: simnode.MIGPlacementStart(m.GI), Size: m.GISlices},
					Engines:   inventory.MIGEngines{Multiprocessors: uint32(16 * m.GISlices)}})
			}
		}
		out = append(out, ng)
	}
	return out
}

// TestAddMIG: the MIG devices of a node with two MIG GPUs and two
// without, numbered from mig-minors and the nvidia-caps major as the
// driver lays them out.
func TestAddMIG(t *testing.T) {
	n := generateWithNodes(t, simnode.Options{NumGPUs: 4, SwapMinors: true})
	st := simnode.MixedMIG()
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	snap := discoverAt(t, n.Root)
	out := discover.AddMIG(discover.Options{HostRoot: n.Root}, snap, nvmlOf(n, st))
	if len(out.Warnings) > 0 {
		t.Errorf("warnings: %q", out.Warnings)
	}
	if snap.MIG != nil || snap.GPUs[0].MIGEnabled {
		t.Error("AddMIG modified its input")
	}
	major, err := n.CapsMajor()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, true, false, false} {
		if out.GPUs[i].MIGEnabled != want {
			t.Errorf("GPU %d: MIGEnabled %v, want %v", i, out.GPUs[i].MIGEnabled, want)
		}
	}
	if len(out.MIG) != 11 {
		t.Fatalf("%d MIG devices, want 11", len(out.MIG))
	}
	// GPU 1 has device minor 2 (minors swapped).
	m := out.MIG[10]
	g1 := n.GPUs[1]
	want := inventory.MIGDevice{
		UUID: simnode.MIGUUIDFor(g1.UUID, 13, 0), Index: 3, Parent: 1, ParentUUID: g1.UUID, Profile: "1g", MemoryMiB: 9984, GI: 13, CI: 0,
		Placement: &inventory.MIGPlacement{ProfileID: 19, Start: 6, Size: 1}, Engines: inventory.MIGEngines{Multiprocessors: 16},
		GINode: inventory.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", simnode.GIMinor(g1.Minor, 13)), Major: int64(major), Minor: int64(simnode.GIMinor(g1.Minor, 13)), Mode: 0o444},
		CINode: inventory.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", simnode.CIMinor(g1.Minor, 13, 0)), Major: int64(major), Minor: int64(simnode.CIMinor(g1.Minor, 13, 0)), Mode: 0o444},
	}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Errorf("GPU 1's last MIG device (-want +got):\n%s", diff)
	}
	for i, g := range out.GPUs {
		if g.MemoryMiB != 81559 || g.Props == nil || g.Props.Architecture != "Hopper" {
			t.Errorf("GPU %d: NVML's memory and properties not kept: %d MiB, %+v", i, g.MemoryMiB, g.Props)
		}
	}
	if m.Name() != "1:3" || out.MIG[0].Name() != "0:0" {
		t.Errorf("names %s, %s", m.Name(), out.MIG[0].Name())
	}
	if c := out.MIGControl; c.Config == nil || c.Config.Minor != 1 || c.Monitor == nil || c.Monitor.Minor != 2 {
		t.Errorf("MIG control: %+v", c)
	}
}

// TestAddMIGWithoutCaps: MIG enabled but the driver's mig-minors missing
// offers no MIG device and says why; the GPU stays MIG-enabled, so it is
// not handed out whole either.
func TestAddMIGWithoutCaps(t *testing.T) {
	n := generate(t, simnode.Options{NumGPUs: 2})
	st := simnode.MixedMIG()
	snap := &inventory.Snapshot{GPUs: []inventory.GPU{{Index: 0, UUID: n.GPUs[0].UUID}, {Index: 1, UUID: n.GPUs[1].UUID, Minor: 1}}}
	out := discover.AddMIG(discover.Options{HostRoot: n.Root}, snap, nvmlOf(n, st))
	if len(out.MIG) != 0 || !out.GPUs[0].MIGEnabled {
		t.Errorf("MIG %d, GPU 0 MIG-enabled %v", len(out.MIG), out.GPUs[0].MIGEnabled)
	}
	if len(out.Warnings) != 1 || !strings.Contains(out.Warnings[0], "mig-minors") {
		t.Errorf("warnings %q, want one naming mig-minors", out.Warnings)
	}
}
