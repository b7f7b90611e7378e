package nvml_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/inventory/nvml"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// simNVML lays out a simulated node with state st and opens its
// libnvidia-ml.so.1 through the real binding.
func simNVML(t *testing.T, gpus int, st simnode.NVMLState) (*simnode.Node, nvml.Lib) {
	t.Helper()
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: gpus})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.WriteNVMLState(st); err != nil {
		t.Fatal(err)
	}
	lib, err := nvml.Open(filepath.Join(n.Root, n.LibDir, "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Close() })
	return n, lib
}

func h100MIG(gi, ci, slices int) simnode.MIG { return simnode.H100MIG(gi, ci, slices) }

// TestSimulatedLibrary loads the simulated libnvidia-ml.so.1 (built with
// gcc from nvml.h's signatures and layouts) through the purego binding and
// reads a node with MIG on two GPUs of three: every GPU's properties, and
// each MIG device's GPU instance profile, placement and engines.
func TestSimulatedLibrary(t *testing.T) {
	var seven []simnode.MIG
	for gi := 7; gi <= 13; gi++ {
		seven = append(seven, h100MIG(gi, 0, 1))
	}
	n, lib := simNVML(t, 3, simnode.NVMLState{GPUs: []simnode.NVMLGPU{
		{MIGMode: 1, MIG: seven},
		{MIGMode: 1, MIG: []simnode.MIG{h100MIG(3, 0, 2), h100MIG(4, 0, 2), h100MIG(5, 0, 2), h100MIG(13, 0, 1)}},
		{MIGMode: 0},
	}})
	gpus, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 3 {
		t.Fatalf("got %d GPUs, want 3", len(gpus))
	}
	for i, g := range gpus {
		g.MIG = nil
		want := nvml.GPU{Index: i, UUID: n.GPUs[i].UUID, BusID: "0000" + upper(n.GPUs[i].BusID), Name: n.GPUs[i].Model,
			MemoryMiB: 81559, MemoryBytes: 81559 << 20, Brand: "Nvidia", Architecture: "Hopper", ComputeCapability: "9.0",
			CUDADriverVersion: "13.0", MIGEnabled: i < 2}
		if diff := cmp.Diff(want, g); diff != "" {
			t.Errorf("GPU %d (-want +got):\n%s", i, diff)
		}
	}
	if len(gpus[0].MIG) != 7 || len(gpus[2].MIG) != 0 {
		t.Fatalf("MIG: GPU 0 %d devices, GPU 2 %d", len(gpus[0].MIG), len(gpus[2].MIG))
	}
	g1 := n.GPUs[1].UUID
	twoG := nvml.Engines{Multiprocessors: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2}
	oneG := nvml.Engines{Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1}
	want := []nvml.MIG{
		{Index: 0, UUID: simnode.MIGUUIDFor(g1, 3, 0), GI: 3, CI: 0, Profile: "2g.20gb", MemoryMiB: 20096, GISlices: 2, CISlices: 2,
			Placement: &nvml.Placement{ProfileID: 14, Start: 0, Size: 2}, Engines: twoG},
		{Index: 1, UUID: simnode.MIGUUIDFor(g1, 4, 0), GI: 4, CI: 0, Profile: "2g.20gb", MemoryMiB: 20096, GISlices: 2, CISlices: 2,
			Placement: &nvml.Placement{ProfileID: 14, Start: 2, Size: 2}, Engines: twoG},
		{Index: 2, UUID: simnode.MIGUUIDFor(g1, 5, 0), GI: 5, CI: 0, Profile: "2g.20gb", MemoryMiB: 20096, GISlices: 2, CISlices: 2,
			Placement: &nvml.Placement{ProfileID: 14, Start: 4, Size: 2}, Engines: twoG},
		{Index: 3, UUID: simnode.MIGUUIDFor(g1, 13, 0), GI: 13, CI: 0, Profile: "1g.10gb", MemoryMiB: 9984, GISlices: 1, CISlices: 1,
			Placement: &nvml.Placement{ProfileID: 19, Start: 6, Size: 1}, Engines: oneG},
	}
	if diff := cmp.Diff(want, gpus[1].MIG); diff != "" {
		t.Errorf("GPU 1's MIG devices (-want +got):\n%s", diff)
	}
	if m := gpus[0].MIG[6]; m.Profile != "1g.10gb" || m.GI != 13 || m.Placement == nil || m.Placement.Start != 6 {
		t.Errorf("GPU 0's last MIG device: %+v", m)
	}
}

// TestSimulatedProfiles: MIG devices of the profiles go-nvlib names with
// a suffix or by their memory alone (1g.10gb+me, 1g.20gb), a whole-GPU
// instance, and a compute instance of part of its GPU instance, which has
// its own multiprocessors and its GPU instance's engines.
func TestSimulatedProfiles(t *testing.T) {
	me := simnode.MIG{GI: 7, CI: 0, GISlices: 1, CISlices: 1, MemoryMiB: 9984, Profile: "1g.10gb+me"}
	twenty := simnode.MIG{GI: 4, CI: 0, GISlices: 1, CISlices: 1, MemoryMiB: 20096, Profile: "1g.20gb"}
	part := simnode.MIG{GI: 2, CI: 1, GISlices: 3, CISlices: 1, MemoryMiB: 40448}
	_, lib := simNVML(t, 2, simnode.NVMLState{GPUs: []simnode.NVMLGPU{
		{MIGMode: 1, MIG: []simnode.MIG{me, twenty, part}},
		{MIGMode: 1, MIG: []simnode.MIG{h100MIG(0, 0, 7)}},
	}})
	gpus, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	type summary struct {
		Profile   string
		MemoryMiB uint64
		Placement nvml.Placement
		Engines   nvml.Engines
	}
	var got []summary
	for _, g := range gpus {
		for _, m := range g.MIG {
			if m.Placement == nil {
				t.Fatalf("%s: no placement", m.Profile)
			}
			got = append(got, summary{m.Profile, m.MemoryMiB, *m.Placement, m.Engines})
		}
	}
	want := []summary{
		{"1g.10gb+me", 9984, nvml.Placement{ProfileID: 20, Start: 0, Size: 1}, nvml.Engines{Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1}},
		{"1g.20gb", 20096, nvml.Placement{ProfileID: 15, Start: 2, Size: 2}, nvml.Engines{Multiprocessors: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1}},
		{"1c.3g.40gb", 40448, nvml.Placement{ProfileID: 9, Start: 4, Size: 4}, nvml.Engines{Multiprocessors: 16, CopyEngines: 3, Decoders: 3, JPEGs: 3}},
		{"7g.80gb", 81152, nvml.Placement{ProfileID: 0, Start: 0, Size: 8}, nvml.Engines{Multiprocessors: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MIG devices (-want +got):\n%s", diff)
	}
}

// TestSimulatedPropsLeftOut: what NVML does not tell is left unknown and
// nothing else fails: a library without the property and GPU instance
// functions (as one from before them) still loads and enumerates, its
// MIG devices named and measured from their device attributes; a GPU
// model NVML answers NOT_SUPPORTED for; GPU instances NVML refuses (no
// permission); an addressing mode where the platform has one; the CUDA
// version NVML reports, as NVIDIA prints it (12080: "12.8").
func TestSimulatedPropsLeftOut(t *testing.T) {
	st := simnode.NVMLState{GPUs: []simnode.NVMLGPU{
		{MIGMode: 1, MIG: []simnode.MIG{h100MIG(9, 0, 1)}, GIError: simnode.NVMLErrorNoPermission, AddressingMode: "ATS"},
		{},
	}}
	// The MIG device as its device attributes describe it.
	fromAttributes := nvml.MIG{Index: 0, GI: 9, Profile: "1g.10gb", MemoryMiB: 9984, GISlices: 1, CISlices: 1,
		Engines: nvml.Engines{Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1}}
	for _, tc := range []struct {
		name string
		opts simnode.Options
		gpu0 nvml.GPU // without Index, UUID, BusID and MIG
		gpu1 nvml.GPU
	}{
		{"an older library", simnode.Options{NumGPUs: 2, NVMLWithoutProps: true},
			nvml.GPU{Name: simnode.DefaultModel, MemoryMiB: 81559, MemoryBytes: 81559 << 20, MIGEnabled: true},
			nvml.GPU{Name: simnode.DefaultModel, MemoryMiB: 81559, MemoryBytes: 81559 << 20}},
		{"an unknown model, GPU instances refused", simnode.Options{GPUs: []simnode.GPU{{BusID: "0000:18:00.0"}, {BusID: "0000:2a:00.0", Model: "NVIDIA L4"}}, CUDAVersion: 12080},
			nvml.GPU{Name: simnode.DefaultModel, MemoryMiB: 81559, MemoryBytes: 81559 << 20, MIGEnabled: true,
				Brand: "Nvidia", Architecture: "Hopper", ComputeCapability: "9.0", AddressingMode: "ATS", CUDADriverVersion: "12.8"},
			nvml.GPU{Name: "NVIDIA L4", MemoryMiB: 81559, MemoryBytes: 81559 << 20, CUDADriverVersion: "12.8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := simnode.Generate(t.TempDir(), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := n.WriteNVMLState(st); err != nil {
				t.Fatal(err)
			}
			lib, err := nvml.Open(filepath.Join(n.Root, n.LibDir, "libnvidia-ml.so.1"))
			if err != nil {
				t.Fatal(err)
			}
			defer lib.Close()
			gpus, err := lib.Devices()
			if err != nil || len(gpus) != 2 {
				t.Fatalf("Devices: %d GPUs, %v", len(gpus), err)
			}
			mig := fromAttributes
			mig.UUID = simnode.MIGUUIDFor(n.GPUs[0].UUID, 9, 0)
			want0, want1 := tc.gpu0, tc.gpu1
			want0.Index, want0.UUID, want0.BusID, want0.MIG = 0, n.GPUs[0].UUID, "0000"+upper(n.GPUs[0].BusID), []nvml.MIG{mig}
			want1.Index, want1.UUID, want1.BusID = 1, n.GPUs[1].UUID, "0000"+upper(n.GPUs[1].BusID)
			if diff := cmp.Diff([]nvml.GPU{want0, want1}, gpus); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSimulatedLayoutChangeAndLoss: each enumeration sees the node as it
// is now; a lost GPU is reported in GPU.Err, not as a failed enumeration.
func TestSimulatedLayoutChangeAndLoss(t *testing.T) {
	n, lib := simNVML(t, 2, simnode.NVMLState{GPUs: []simnode.NVMLGPU{{MIGMode: 1, MIG: []simnode.MIG{h100MIG(1, 0, 7)}}}})
	if err := n.WriteNVMLState(simnode.NVMLState{GPUs: []simnode.NVMLGPU{
		{MIGMode: 1, MIG: []simnode.MIG{h100MIG(2, 0, 3), h100MIG(1, 0, 3)}},
		{Lost: true},
	}}); err != nil {
		t.Fatal(err)
	}
	gpus, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus[0].MIG) != 2 || gpus[0].MIG[0].Profile != "3g.40gb" {
		t.Errorf("after the change: %+v", gpus[0].MIG)
	}
	if !nvml.IsCode(gpus[1].Err, nvml.ErrGPUIsLost) {
		t.Errorf("lost GPU: err %v, want NVML_ERROR_GPU_IS_LOST", gpus[1].Err)
	}
}

// TestSimulatedXIDEvents: events written after the set was created come
// back with their GPU and instance; a wait without one times out.
func TestSimulatedXIDEvents(t *testing.T) {
	st := simnode.NVMLState{GPUs: []simnode.NVMLGPU{{MIGMode: 1, MIG: []simnode.MIG{h100MIG(1, 0, 7)}}, {}},
		Events: []simnode.XID{{GPU: 0, XID: 13, GI: -1, CI: -1}}}
	n, lib := simNVML(t, 2, st)
	ev, err := lib.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if e, ok, err := ev.Wait(20 * time.Millisecond); err != nil || ok {
		t.Fatalf("an event from before the set: %+v %v %v", e, ok, err)
	}
	st.Events = append(st.Events, simnode.XID{GPU: 1, XID: 79, GI: -1, CI: -1}, simnode.XID{GPU: 0, XID: 94, GI: 1, CI: 0})
	if err := n.WriteNVMLState(st); err != nil {
		t.Fatal(err)
	}
	var got []nvml.Event
	for len(got) < 2 {
		e, ok, err := ev.Wait(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got = append(got, e)
		}
	}
	want := []nvml.Event{
		{UUID: n.GPUs[1].UUID, XID: 79, GI: nvml.NoInstance, CI: nvml.NoInstance},
		{UUID: n.GPUs[0].UUID, XID: 94, GI: 1, CI: 0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := nvml.Open("libnvidia-ml.so.1"); err == nil {
		t.Error("a relative path was loaded")
	}
	if _, err := nvml.Open(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")); err == nil {
		t.Error("a missing library was loaded")
	}
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'f' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// TestSimulatedFailures: the simulated NVML's failure modes, through the
// binding: an enumeration that fails as a whole, one GPU that NVML cannot
// query (an error other than a lost GPU).
func TestSimulatedFailures(t *testing.T) {
	n, lib := simNVML(t, 2, simnode.NVMLState{CountError: simnode.NVMLErrorUnknown})
	if _, err := lib.Devices(); !nvml.IsCode(err, nvml.Return(simnode.NVMLErrorUnknown)) {
		t.Errorf("failed enumeration: %v, want NVML_ERROR_UNKNOWN", err)
	}
	if err := n.WriteNVMLState(simnode.NVMLState{GPUs: []simnode.NVMLGPU{{Error: simnode.NVMLErrorUnknown}}}); err != nil {
		t.Fatal(err)
	}
	gpus, err := lib.Devices()
	if err != nil || len(gpus) != 2 {
		t.Fatalf("one GPU erring: %v, %d GPUs", err, len(gpus))
	}
	if got := fmt.Sprint(gpus[0].Err); got != "nvmlDeviceGetUUID: Unknown Error (999)" || gpus[1].Err != nil {
		t.Errorf("GPU 0: %q, GPU 1: %v", got, gpus[1].Err)
	}
}

// TestCloseDuringWait: Close while another goroutine waits for events
// waits for the wait to return and frees the set before nvmlShutdown; the
// set fails with ErrClosed after. The simulated NVML records any call in
// the wrong order (a shutdown during a wait, a set used after it).
func TestCloseDuringWait(t *testing.T) {
	n, lib := simNVML(t, 2, simnode.NVMLState{})
	path := filepath.Join(n.Root, n.LibDir, "libnvidia-ml.so.1")
	// The wait must be in NVML when Close is called; on a loaded machine
	// the goroutine may not have got there yet: then again.
	for attempt := 0; ; attempt++ {
		ev, err := lib.Events()
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			err error
			end time.Time
		}
		waited := make(chan result, 1)
		go func() {
			_, _, err := ev.Wait(time.Second)
			waited <- result{err, time.Now()}
		}()
		time.Sleep(200 * time.Millisecond)
		if err := lib.Close(); err != nil {
			t.Fatal(err)
		}
		closed := time.Now()
		r := <-waited
		werr := r.err
		// r.end is read after Wait returned, by a goroutine the race
		// detector's scheduler may hold up a while: only a wait that ends
		// well after Close (a Close that did not wait for it: the wait
		// then runs on to its 1 s timeout) is the failure.
		if werr == nil && r.end.After(closed.Add(150*time.Millisecond)) {
			t.Fatal("Close returned before the wait in progress")
		}
		if errors.Is(werr, nvml.ErrClosed) && attempt < 5 {
			// The wait started after Close: not the case under test.
			if lib, err = nvml.Open(path); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if werr != nil {
			t.Errorf("the wait in progress: %v", werr)
		}
		if _, _, err := ev.Wait(time.Millisecond); !errors.Is(err, nvml.ErrClosed) {
			t.Errorf("Wait after Close: %v, want ErrClosed", err)
		}
		if err := ev.Close(); err != nil {
			t.Errorf("Events.Close after Close: %v", err)
		}
		break
	}
	if v, err := n.NVMLViolations(); err != nil || len(v) > 0 {
		t.Errorf("NVML used in the wrong order: %q %v", v, err)
	}
}
