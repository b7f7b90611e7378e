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

func h100MIG(gi, ci, slices int) simnode.MIG {
	mem := map[int]uint64{1: 9856, 2: 19968, 3: 40192, 4: 40192, 7: 80896}[slices]
	return simnode.MIG{GI: gi, CI: ci, GISlices: slices, CISlices: slices, MemoryMiB: mem}
}

// TestSimulatedLibrary loads the simulated libnvidia-ml.so.1 (built with
// gcc from nvml.h's signatures and layouts) through the purego binding and
// reads a node with MIG on two GPUs of three.
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
		if g.Err != nil || g.UUID != n.GPUs[i].UUID || g.BusID != "0000"+upper(n.GPUs[i].BusID) || g.Name != n.GPUs[i].Model || g.MemoryMiB != 81559 {
			t.Errorf("GPU %d: %+v, want UUID %s", i, g, n.GPUs[i].UUID)
		}
	}
	if !gpus[0].MIGEnabled || len(gpus[0].MIG) != 7 || gpus[2].MIGEnabled || len(gpus[2].MIG) != 0 {
		t.Fatalf("MIG: GPU 0 %v/%d, GPU 2 %v/%d", gpus[0].MIGEnabled, len(gpus[0].MIG), gpus[2].MIGEnabled, len(gpus[2].MIG))
	}
	want := []nvml.MIG{
		{Index: 0, UUID: simnode.MIGUUIDFor(n.GPUs[1].UUID, 3, 0), GI: 3, CI: 0, Profile: "2g.20gb", MemoryMiB: 19968, GISlices: 2, CISlices: 2},
		{Index: 1, UUID: simnode.MIGUUIDFor(n.GPUs[1].UUID, 4, 0), GI: 4, CI: 0, Profile: "2g.20gb", MemoryMiB: 19968, GISlices: 2, CISlices: 2},
		{Index: 2, UUID: simnode.MIGUUIDFor(n.GPUs[1].UUID, 5, 0), GI: 5, CI: 0, Profile: "2g.20gb", MemoryMiB: 19968, GISlices: 2, CISlices: 2},
		{Index: 3, UUID: simnode.MIGUUIDFor(n.GPUs[1].UUID, 13, 0), GI: 13, CI: 0, Profile: "1g.10gb", MemoryMiB: 9856, GISlices: 1, CISlices: 1},
	}
	if diff := cmp.Diff(want, gpus[1].MIG); diff != "" {
		t.Errorf("GPU 1's MIG devices (-want +got):\n%s", diff)
	}
	if gpus[0].MIG[6].Profile != "1g.10gb" || gpus[0].MIG[6].GI != 13 {
		t.Errorf("GPU 0's last MIG device: %+v", gpus[0].MIG[6])
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
		if werr == nil && r.end.After(closed) {
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
