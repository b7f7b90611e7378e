package node

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// newMIGNode lays out three GPUs with simnode.MixedMIG and starts a Node
// on them with open as NVML's loader (nil: the real one).
func newMIGNode(t *testing.T, open func(string) (nvml.Lib, error)) (*Node, *simnode.Node, config.Config, *logBuffer) {
	t.Helper()
	return newMIGNodeWith(t, simnode.MixedMIG(), open)
}

// emulatedNVMLBound is how long a discovery waits for NVML in the tests
// under emulation that are not about the bound.
const emulatedNVMLBound = 30 * time.Second

// newMIGNodeWith is newMIGNode with the simulated NVML in state st.
func newMIGNodeWith(t *testing.T, st simnode.NVMLState, open func(string) (nvml.Lib, error)) (*Node, *simnode.Node, config.Config, *logBuffer) {
	t.Helper()
	needRoot(t)
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 3, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = n.Root, n.Root, n.Root
	buf := &logBuffer{}
	log := logrus.New()
	log.SetOutput(io.MultiWriter(buf))
	var opts []Option
	if open != nil {
		opts = append(opts, func(p *Node) { p.nvml.open = open })
	}
	if os.Getenv("NRI_GPU_TEST_EMULATED") != "" && st.InitDelay == 0 {
		// Under make test-arm64's emulator loading NVML can outlast
		// DefaultNVMLBound on a loaded machine; the tests that are not
		// about the bound want its answer in the first discovery.
		opts = append(opts, func(p *Node) { p.nvml.bound = emulatedNVMLBound })
	}
	p, err := New(cfg, log, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.nvml.closeLocked() })
	return p, n, cfg, buf
}

// TestMIGLayoutChange: the node's MIG devices come from the simulated
// NVML through the real binding; a layout changed on the node is picked
// up by the next rediscovery, without a restart; NVML is loaded once.
func TestMIGLayoutChange(t *testing.T) {
	p, n, cfg, log := newMIGNode(t, nil)
	s := p.Snapshot()
	if s.NVML != "ok" || len(s.MIG) != 11 || !s.GPUs[0].MIGEnabled || !s.GPUs[1].MIGEnabled || s.GPUs[2].MIGEnabled {
		t.Fatalf("NVML %q, %d MIG devices, GPUs %+v", s.NVML, len(s.MIG), s.GPUs)
	}
	if s.GPUs[2].MemoryMiB != 81559 {
		t.Errorf("GPU 2's memory from NVML: %d MiB, want 81559", s.GPUs[2].MemoryMiB)
	}
	if s.MIG[7].Profile != "2g.20gb" || s.MIG[7].Name() != "1:0" {
		t.Errorf("MIG device 1:0: %+v", s.MIG[7])
	}
	if r, err := p.Update(cfg, "test"); r != RefreshUnchanged || err != nil {
		t.Fatalf("Update of an unchanged node = %q, %v", r, err)
	}

	// GPU 0 goes from seven 1g.10gb to two 3g.40gb; GPU 2 turns MIG on.
	st := simnode.MixedMIG()
	st.GPUs[0].MIG = []simnode.MIG{simnode.H100MIG(1, 0, 3), simnode.H100MIG(2, 0, 3)}
	st.GPUs = append(st.GPUs, simnode.NVMLGPU{MIGMode: 1, MIG: []simnode.MIG{simnode.H100MIG(0, 0, 7)}})
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Update(cfg, "periodic"); r != RefreshChanged || err != nil {
		t.Fatalf("Update after the layout change = %q, %v", r, err)
	}
	s = p.Snapshot()
	var profiles []string
	for _, m := range s.MIG {
		profiles = append(profiles, m.Name()+"="+m.Profile)
	}
	if got := strings.Join(profiles, " "); got != "0:0=3g.40gb 0:1=3g.40gb 1:0=2g.20gb 1:1=2g.20gb 1:2=2g.20gb 1:3=1g.10gb 2:0=7g.80gb" {
		t.Errorf("after the change: %s", got)
	}
	if c := strings.Count(log.String(), "NVML: "); c != 1 {
		t.Errorf("%d NVML log lines, want 1:\n%s", c, log)
	}
}

// TestMIGLayoutChangeWatcher: the watcher's periodic rediscovery follows
// a MIG layout change (procfs and NVML send no file events).
func TestMIGLayoutChangeWatcher(t *testing.T) {
	p, n, _, _ := newMIGNode(t, nil)
	runWatcher(t, p, WatchOptions{Interval: 50 * time.Millisecond})
	st := simnode.MixedMIG()
	st.GPUs[1] = simnode.NVMLGPU{MIGMode: 0}
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "GPU 1's MIG devices to go", func() bool {
		s := p.Snapshot()
		return len(s.MIG) == 7 && !s.GPUs[1].MIGEnabled
	})
}

// TestWithoutNVML: a library that cannot be loaded leaves whole GPUs (but
// those whose driver shows GPU instances) served, and the log says so
// once, however many rediscoveries follow.
func TestWithoutNVML(t *testing.T) {
	p, _, cfg, log := newMIGNode(t, func(string) (nvml.Lib, error) { return nil, errors.New("nvmlInit_v2: Driver Not Loaded (9)") })
	for range 3 {
		if _, err := p.Update(cfg, "test"); err != nil {
			t.Fatal(err)
		}
	}
	s := p.Snapshot()
	if len(s.MIG) != 0 || len(s.GPUs) != 3 || !strings.HasPrefix(s.NVML, "unavailable: ") {
		t.Errorf("without NVML: NVML %q, %d MIG devices, GPUs %+v", s.NVML, len(s.MIG), s.GPUs)
	}
	// NVML never answered; the driver shows GPU instances on GPUs 0 and
	// 1 (the node's MIG layout): they are not handed out whole. GPU 2,
	// without any, is served whole.
	if d := cmp.Diff(migView{Whole: []string{"2"}, MIGEnabled: []int{0, 1}}, viewOf(p.State())); d != "" {
		t.Errorf("without NVML (-want +got):\n%s", d)
	}
	want := "NVML unavailable: nvmlInit_v2: Driver Not Loaded (9): GPUs 0, 1 show GPU instances: not handed out whole, no MIG devices until NVML answers; the others served whole; no XID health"
	if c := strings.Count(log.String(), want); c != 1 {
		t.Errorf("the log says %d times %q, want once:\n%s", c, want, log)
	}
}

// TestNVMLProps: NVML's properties of each GPU and the GPU instance of
// each MIG device reach the snapshot through the real binding and
// discovery's merge; while NVML fails as a whole, or for one GPU, the
// properties it last reported stay, as the MIG layout does.
func TestNVMLProps(t *testing.T) {
	p, n, cfg, _ := newMIGNode(t, nil)
	props := &inventory.GPUProps{ProductName: simnode.DefaultModel, MemoryBytes: 81559 << 20, Brand: "Nvidia",
		Architecture: "Hopper", ComputeCapability: "9.0", CUDADriverVersion: "13.0"}
	g1 := n.GPUs[1]
	last := inventory.MIGDevice{UUID: simnode.MIGUUIDFor(g1.UUID, 13, 0), Index: 3, Parent: 1, ParentUUID: g1.UUID,
		Profile: "1g.10gb", MemoryMiB: 9984, GI: 13, CI: 0,
		Placement: &inventory.MIGPlacement{ProfileID: 19, Start: 6, Size: 1},
		Engines:   inventory.MIGEngines{Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1}}
	check := func(when string) {
		t.Helper()
		s := p.Snapshot()
		for _, g := range s.GPUs {
			if d := cmp.Diff(props, g.Props); d != "" {
				t.Errorf("%s: GPU %d's properties (-want +got):\n%s", when, g.Index, d)
			}
		}
		if len(s.MIG) != 11 {
			t.Fatalf("%s: %d MIG devices", when, len(s.MIG))
		}
		got := s.MIG[10]
		got.GINode, got.CINode = inventory.DeviceNode{}, inventory.DeviceNode{}
		if d := cmp.Diff(last, got); d != "" {
			t.Errorf("%s: MIG device 1:3 (-want +got):\n%s", when, d)
		}
	}
	check("NVML answering")
	for _, tc := range []struct {
		name string
		st   func(*simnode.NVMLState)
	}{
		{"a failed enumeration", func(s *simnode.NVMLState) { s.CountError = simnode.NVMLErrorUnknown }},
		{"GPU 1 erring", func(s *simnode.NVMLState) { s.GPUs[1].Error = simnode.NVMLErrorUnknown }},
	} {
		st := simnode.MixedMIG()
		tc.st(&st)
		if err := n.WriteNVMLState(st); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Update(cfg, "test"); err != nil {
			t.Fatal(err)
		}
		check(tc.name)
	}
}
