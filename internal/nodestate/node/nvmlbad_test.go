package node

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// migView is what a state offers of a MIG node: its whole GPUs and MIG
// devices (the request path's units), the GPUs with MIG enabled, and the
// unhealthy units, by name.
type migView struct {
	Whole, MIG []string
	MIGEnabled []int
	Unhealthy  []string
}

func viewOf(st *State) migView {
	var v migView
	snap := st.Snapshot()
	names := map[string]string{}
	for _, u := range snap.Units() {
		if u.MIG != nil {
			v.MIG = append(v.MIG, u.MIG.Name())
		} else {
			v.Whole = append(v.Whole, inventory.UnitLabel(u.Index))
		}
		names[u.UUID] = inventory.UnitLabel(u.Index)
	}
	for _, g := range snap.GPUs {
		if g.MIGEnabled {
			v.MIGEnabled = append(v.MIGEnabled, g.Index)
		}
		if _, ok := names[g.UUID]; !ok {
			names[g.UUID] = "GPU " + inventory.UnitLabel(g.Index)
		}
	}
	for id := range st.Unhealthy {
		v.Unhealthy = append(v.Unhealthy, names[id])
	}
	slices.Sort(v.Unhealthy)
	return v
}

// TestNVMLWorseAnswerKeepsLast: an NVML answer worse than the last good
// one never offers more than before. Through the simulated NVML and the
// real binding: an enumeration that fails keeps the last MIG layout (the
// MIG-enabled GPUs stay not whole, none is unhealthy: no GPU erred); a GPU
// NVML cannot query keeps its layout and is unhealthy with its MIG
// devices; NVML answering again brings NVML's layout, healthy.
func TestNVMLWorseAnswerKeepsLast(t *testing.T) {
	p, n, cfg, log := newMIGNode(t, nil)
	gpu0MIG := []string{"0:0", "0:1", "0:2", "0:3", "0:4", "0:5", "0:6"}
	good := migView{Whole: []string{"2"}, MIG: append(slices.Clone(gpu0MIG), "1:0", "1:1", "1:2", "1:3"), MIGEnabled: []int{0, 1}}
	if d := cmp.Diff(good, viewOf(p.State())); d != "" {
		t.Fatalf("the MIG node (-want +got):\n%s", d)
	}
	erring := good
	erring.Unhealthy = append(slices.Clone(gpu0MIG), "GPU 0")
	for _, tc := range []struct {
		name string
		st   func(*simnode.NVMLState)
		want migView
		log  string
	}{
		{"failed enumeration", func(s *simnode.NVMLState) { s.CountError = simnode.NVMLErrorUnknown }, good,
			"NVML unavailable: nvmlDeviceGetCount_v2: Unknown Error (999): the last MIG layout NVML reported stays in force (2 GPUs with MIG enabled, 11 MIG devices)"},
		{"GPU 0 erring", func(s *simnode.NVMLState) { s.GPUs[0].Error = simnode.NVMLErrorUnknown }, erring,
			"NVML: GPU 0 (" + n.GPUs[0].UUID + "): nvmlDeviceGetUUID: Unknown Error (999): unhealthy; the MIG layout NVML last reported for it stays"},
		{"GPU 0 lost", func(s *simnode.NVMLState) { s.GPUs[0].Lost = true }, erring, "GPU is lost"},
		{"both", func(s *simnode.NVMLState) {
			s.GPUs[0].Error = simnode.NVMLErrorUnknown
			s.CountError = simnode.NVMLErrorUnknown
		}, erring, ""},
		{"NVML answering again", func(*simnode.NVMLState) {}, good, "healthy again"},
	} {
		st := simnode.MixedMIG()
		tc.st(&st)
		if err := n.WriteNVMLState(st); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Update(cfg, "test"); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := viewOf(p.State())
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
		if !strings.Contains(log.String(), tc.log) {
			t.Errorf("%s: the log does not say %q:\n%s", tc.name, tc.log, log)
		}
	}
}

// TestNVMLBound: an nvmlInit_v2 that takes longer than the bound does not
// hold up the node's discovery (New returns, serving whole the GPUs whose
// driver shows no GPU instance, and says so); when NVML answers, the node is rediscovered
// with its MIG devices without anything asking for it.
func TestNVMLBound(t *testing.T) {
	st := simnode.MixedMIG()
	st.InitDelay = 3 * time.Second
	if os.Getenv("NRI_GPU_TEST_EMULATED") != "" {
		// Under make test-arm64's emulator a discovery alone takes seconds
		// on a loaded machine: a longer nvmlInit_v2 keeps "New did not
		// wait for it" telling.
		st.InitDelay = 10 * time.Second
	}
	start := time.Now()
	p, n, _, log := newMIGNodeWith(t, st, nil)
	took := time.Since(start)
	t.Logf("New took %s with nvmlInit_v2 taking %s (bound %s)", took, st.InitDelay, DefaultNVMLBound)
	if took >= st.InitDelay {
		t.Errorf("New waited for nvmlInit_v2: %s", took)
	}
	if s := p.Snapshot(); len(s.MIG) != 0 || !strings.Contains(s.NVML, "NVML has not answered within 1s") {
		t.Errorf("while NVML is busy: NVML %q, %d MIG devices", s.NVML, len(s.MIG))
	}
	// NVML never answered, so there is no last MIG layout to keep; the
	// driver's GPU instances (/proc/driver/nvidia/capabilities) keep the
	// MIG-enabled GPUs from being handed out whole.
	busy := migView{Whole: []string{"2"}, MIGEnabled: []int{0, 1}}
	if d := cmp.Diff(busy, viewOf(p.State())); d != "" {
		t.Errorf("while NVML is busy at the first discovery (-want +got):\n%s", d)
	}
	if want := "GPUs 0, 1 show GPU instances: not handed out whole"; !strings.Contains(log.String(), want) {
		t.Errorf("the log does not say %q:\n%s", want, log)
	}
	// The delay is read at nvmlInit_v2: later enumerations are quick.
	st.InitDelay = 0
	if err := n.WriteNVMLState(st); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the MIG devices once NVML answered", func() bool { return len(p.Snapshot().MIG) == 11 })
	if !strings.Contains(log.String(), "cause=\"NVML answered\"") && !strings.Contains(log.String(), "cause=NVML") {
		t.Errorf("the log does not say why the node was rediscovered:\n%s", log)
	}
}

// TestNVMLShutdownDuringWait: a rediscovery that moves the library (a
// driver upgrade) shuts the old NVML down while the health goroutine waits
// for its events. The shutdown waits for the wait to return and frees the
// event set first: the simulated NVML records no use of it after the
// shutdown, and the health goroutine follows the new library's events.
func TestNVMLShutdownDuringWait(t *testing.T) {
	p, n, cfg, log := newMIGNode(t, nil)
	obs := &healthObserver{countingObserver: countingObserver{refreshes: map[string]int{}}, xids: map[uint64]bool{}}
	p.SetObserver(obs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.RunHealth(ctx, 10*time.Millisecond) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "listening for XID events", func() bool { return strings.Contains(log.String(), "listening for XID events") })

	up, err := simnode.Upgrade(n, "590.48.01", simnode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // each while a wait of one second is in progress
		if _, err := p.Update(cfg, "driver upgrade"); err != nil {
			t.Fatal(err)
		}
		if v, err := up.NVMLViolations(); err != nil || len(v) > 0 {
			t.Fatalf("NVML used after its shutdown: %q %v", v, err)
		}
	}
	if got := NVMLPath(cfg, p.Snapshot()); !strings.HasSuffix(got, ".590.48.01") {
		t.Fatalf("NVML from %s after the upgrade", got)
	}
	st := simnode.MixedMIG()
	st.Events = []simnode.XID{{GPU: 2, XID: 79, GI: -1, CI: -1}}
	waitFor(t, "the new library's XID event", func() bool {
		_ = up.WriteNVMLState(st) // again until the new set exists
		_, ok := obs.seen(79)
		return ok
	})
	if v, _ := up.NVMLViolations(); len(v) > 0 {
		t.Errorf("NVML used after its shutdown: %q", v)
	}
}

// TestIgnoredXIDsAggregate: the log of ignored XIDs says the first of a
// GPU at once, then one line per GPU per interval with what came meanwhile.
func TestIgnoredXIDsAggregate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	x := newIgnoredXIDs(time.Minute)
	var got []xidLine
	at := t0.Add
	got = append(got, x.note("GPU-a", 13, at(0))...)
	for i := range 500 {
		got = append(got, x.note("GPU-a", 13+uint64(i%2)*18, at(time.Duration(i)*time.Millisecond))...)
	}
	got = append(got, x.note("GPU-b", 43, at(time.Second))...)
	got = append(got, x.due(at(30*time.Second), false)...)
	got = append(got, x.due(at(61*time.Second), false)...)
	got = append(got, x.due(at(200*time.Second), false)...) // quiet: nothing, forgotten
	got = append(got, x.note("GPU-a", 13, at(201*time.Second))...)
	want := []xidLine{
		{GPU: "GPU-a", XIDs: "13 x1", Interval: time.Minute},
		{GPU: "GPU-b", XIDs: "43 x1", Interval: time.Minute},
		{GPU: "GPU-a", XIDs: "13 x250, 31 x250", Interval: time.Minute},
		{GPU: "GPU-a", XIDs: "13 x1", Interval: time.Minute},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("lines (-want +got):\n%s", d)
	}
}

// TestIgnoredXIDsLogged: through the simulated NVML, 300 application XIDs
// of one GPU are all counted for the metric and logged in one line.
func TestIgnoredXIDsLogged(t *testing.T) {
	p, n, _, log := newMIGNode(t, nil)
	obs := &healthObserver{countingObserver: countingObserver{refreshes: map[string]int{}}, xids: map[uint64]bool{}, counts: map[uint64]int{}}
	p.SetObserver(obs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.RunHealth(ctx, 10*time.Millisecond) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "listening for XID events", func() bool { return strings.Contains(log.String(), "listening for XID events") })
	st := simnode.MixedMIG()
	for range 300 {
		st.Events = append(st.Events, simnode.XID{GPU: 2, XID: 13, GI: -1, CI: -1})
	}
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "300 XIDs counted", func() bool { return obs.count(13) == 300 })
	if lines := strings.Count(log.String(), "XID events: application errors, ignored"); lines != 1 {
		t.Errorf("%d log lines for 300 ignored XIDs of one GPU within a minute, want 1:\n%s", lines, log)
	}
	if len(p.State().Unhealthy) != 0 {
		t.Errorf("ignored XIDs made devices unhealthy: %v", p.State().Unhealthy)
	}
}
