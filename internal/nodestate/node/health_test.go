package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/inventory/nvml"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// healthObserver records what a HealthObserver is told.
type healthObserver struct {
	countingObserver
	hmu       sync.Mutex
	xids      map[uint64]bool
	counts    map[uint64]int // when not nil
	unhealthy map[string]string
}

func (o *healthObserver) XID(xid uint64, critical bool) {
	o.hmu.Lock()
	defer o.hmu.Unlock()
	o.xids[xid] = critical
	if o.counts != nil {
		o.counts[xid]++
	}
}

func (o *healthObserver) count(xid uint64) int {
	o.hmu.Lock()
	defer o.hmu.Unlock()
	return o.counts[xid]
}

func (o *healthObserver) Unhealthy(bad map[string]string) {
	o.hmu.Lock()
	defer o.hmu.Unlock()
	o.unhealthy = bad
}

func (o *healthObserver) seen(xid uint64) (critical, ok bool) {
	o.hmu.Lock()
	defer o.hmu.Unlock()
	critical, ok = o.xids[xid]
	return critical, ok
}

// TestXIDHealth: through the simulated NVML and the real binding, an
// application XID is ignored, a critical one makes its GPU (and a MIG
// instance's only that MIG device) unhealthy; a GPU recovers when NVML,
// having reported it lost, reports it usable again.
func TestXIDHealth(t *testing.T) {
	p, n, cfg, log := newMIGNode(t, nil)
	obs := &healthObserver{countingObserver: countingObserver{refreshes: map[string]int{}}, xids: map[uint64]bool{}}
	p.SetObserver(obs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.RunHealth(ctx, 10*time.Millisecond) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "listening for XID events", func() bool { return strings.Contains(log.String(), "listening for XID events") })

	st := simnode.MixedMIG()
	st.Events = []simnode.XID{{GPU: 2, XID: 13, GI: -1, CI: -1}}
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "XID 13", func() bool { _, ok := obs.seen(13); return ok })
	if c, _ := obs.seen(13); c || len(p.State().Unhealthy) != 0 {
		t.Fatalf("XID 13 (an application's): critical %v, unhealthy %v", c, p.State().Unhealthy)
	}

	g2, g0 := n.GPUs[2].UUID, n.GPUs[0].UUID
	st.Events = append(st.Events, simnode.XID{GPU: 2, XID: 79, GI: -1, CI: -1}, simnode.XID{GPU: 0, XID: 94, GI: 8, CI: 0})
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	mig01 := simnode.MIGUUIDFor(g0, 8, 0)
	waitFor(t, "GPU 2 and MIG device 0:1 unhealthy", func() bool { return len(p.State().Unhealthy) == 2 })
	bad := p.State().Unhealthy
	if bad[g2] != "XID 79" || bad[mig01] != "XID 94 (GPU instance 8)" {
		t.Errorf("unhealthy %v", bad)
	}
	if !strings.Contains(log.String(), "unhealthy: XID 79: count requests skip it") || obs.unhealthy[g2] != "XID 79" {
		t.Errorf("no log line or metric says why:\n%s", log)
	}

	// A rediscovery does not heal it: NVML never said it was unusable.
	if _, err := p.Update(cfg, "periodic"); err != nil {
		t.Fatal(err)
	}
	if p.State().Unhealthy[g2] == "" {
		t.Fatal("a rediscovery healed GPU 2")
	}
	// Reset: NVML reports GPU 2 lost, then usable again.
	st.GPUs = append(st.GPUs, simnode.NVMLGPU{Lost: true})
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Update(cfg, "periodic"); err != nil {
		t.Fatal(err)
	}
	if why := p.State().Unhealthy[g2]; !strings.Contains(why, "GPU is lost") {
		t.Errorf("lost GPU 2: %q", why)
	}
	st.GPUs[2] = simnode.NVMLGPU{}
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Update(cfg, "periodic"); err != nil {
		t.Fatal(err)
	}
	if why, ok := p.State().Unhealthy[g2]; ok {
		t.Errorf("GPU 2 back: still unhealthy: %s", why)
	}
	if p.State().Unhealthy[mig01] == "" {
		t.Error("MIG device 0:1 healed without a reset")
	}
	if !strings.Contains(log.String(), "healthy again") {
		t.Errorf("no log line of the recovery:\n%s", log)
	}
}

// erringLib is an NVML whose every GPU fails with code.
type erringLib struct{ code nvml.Return }

func (l erringLib) Devices() ([]nvml.GPU, error) {
	var out []nvml.GPU
	for i := range 3 {
		out = append(out, nvml.GPU{Index: i, Err: &nvml.Error{Func: "nvmlDeviceGetUUID", Code: l.code}})
	}
	return out, nil
}
func (erringLib) Events() (nvml.Events, error) { return nil, errors.New("no events") }
func (erringLib) Close() error                 { return nil }

// TestNVMLErrorsHealth: a GPU NVML cannot query is unhealthy whatever the
// error (lost, in need of a reset, or any other: its MIG mode is then not
// known), with NVML's error as the reason and a warning naming the GPU.
func TestNVMLErrorsHealth(t *testing.T) {
	for _, code := range []nvml.Return{nvml.ErrInvalidArg, nvml.ErrNotSupported, nvml.ErrGPUIsLost, nvml.ErrResetRequired} {
		p, n, _, _ := newMIGNode(t, func(string) (nvml.Lib, error) { return erringLib{code}, nil })
		bad := p.State().Unhealthy
		want := fmt.Sprintf("NVML: nvmlDeviceGetUUID: NVML error %d", code)
		if got := bad[n.GPUs[0].UUID]; got != want {
			t.Errorf("code %d: GPU 0 unhealthy %q, want %q (%v)", code, got, want, bad)
		}
		if w := strings.Join(p.Snapshot().Warnings, "\n"); !strings.Contains(w, "NVML: GPU 0 ("+n.GPUs[0].UUID+"): "+want[len("NVML: "):]) {
			t.Errorf("code %d: no warning names the GPU and the error: %q", code, w)
		}
	}
}
