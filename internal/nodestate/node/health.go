package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
)

// HealthObserver is told about the health of GPUs and MIG devices, so
// that it can be counted (the metrics package implements it). An
// Observer may implement it.
type HealthObserver interface {
	// XID is called for each XID event; critical is false for an
	// ignored (application) XID.
	XID(xid uint64, critical bool)
	// Unhealthy is called with the unhealthy devices (UUID -> why)
	// each time they change.
	Unhealthy(bad map[string]string)
}

// health follows the health of GPUs and MIG devices: a critical XID (one
// not in health.ignoredXIDs) makes the device it names unhealthy, as
// does NVML failing to query a GPU (a lost GPU). Such a device recovers
// when NVML, having reported it unusable since, reports it usable again:
// the GPU was reset or came back. A critical XID that NVML never follows
// with an unusable GPU keeps the device unhealthy until nri-gpu restarts,
// as with NVIDIA's device plugin.
type health struct {
	mu  sync.Mutex
	bad map[string]*badDevice // by upper-case UUID
}

type badDevice struct {
	reason string
	// unusable: NVML currently fails to query it; seenUnusable: it did
	// since it turned unhealthy.
	unusable, seenUnusable bool
}

// xid records a critical XID of the GPU uuid; gi/ci attribute it to a
// MIG instance (nvml.NoInstance: none). It returns the devices marked.
func (h *health) xid(snap *inventory.Snapshot, ev nvml.Event) []string {
	reason := fmt.Sprintf("XID %d", ev.XID)
	var ids []string
	gpu, ok := findUUID(snap.GPUs, ev.UUID)
	switch {
	case ok && gpu.MIGEnabled && ev.GI != nvml.NoInstance:
		for _, m := range snap.MIG {
			if m.Parent == gpu.Index && uint32(m.GI) == ev.GI && (ev.CI == nvml.NoInstance || uint32(m.CI) == ev.CI) {
				ids = append(ids, m.UUID)
			}
		}
		reason += fmt.Sprintf(" (GPU instance %d)", ev.GI)
	case ev.UUID != "":
		ids = append(ids, ev.UUID) // the GPU, and with it its MIG devices
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bad == nil {
		h.bad = map[string]*badDevice{}
	}
	for _, id := range ids {
		if b := h.bad[strings.ToUpper(id)]; b != nil {
			b.reason = reason
			continue
		}
		h.bad[strings.ToUpper(id)] = &badDevice{reason: reason}
	}
	return ids
}

// probe records what an enumeration said of each GPU: usable (queried
// without error) or not, with NVML's error. It returns the devices that
// recovered.
func (h *health) probe(usable map[string]bool, errs map[string]string) (recovered []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, why := range errs {
		k := strings.ToUpper(id)
		b := h.bad[k]
		if b == nil {
			if h.bad == nil {
				h.bad = map[string]*badDevice{}
			}
			b = &badDevice{}
			h.bad[k] = b
		}
		b.reason = "NVML: " + why
		b.unusable, b.seenUnusable = true, true
	}
	for id, ok := range usable {
		k := strings.ToUpper(id)
		if b := h.bad[k]; ok && b != nil {
			b.unusable = false
			if b.seenUnusable {
				delete(h.bad, k)
				recovered = append(recovered, id)
			}
		}
	}
	return recovered
}

// unhealthy returns the snapshot's unhealthy units (GPU or MIG UUID ->
// why): a MIG device is unhealthy with its GPU.
func (h *health) unhealthy(snap *inventory.Snapshot) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.bad) == 0 {
		return nil
	}
	out := map[string]string{}
	for _, g := range snap.GPUs {
		if b := h.bad[strings.ToUpper(g.UUID)]; b != nil {
			out[g.UUID] = b.reason
		}
	}
	for _, m := range snap.MIG {
		if b := h.bad[strings.ToUpper(m.UUID)]; b != nil {
			out[m.UUID] = b.reason
		} else if b := h.bad[strings.ToUpper(m.ParentUUID)]; b != nil {
			out[m.UUID] = b.reason + " on its GPU " + m.ParentUUID
		}
	}
	return out
}

func findUUID(gpus []inventory.GPU, uuid string) (inventory.GPU, bool) {
	for _, g := range gpus {
		if strings.EqualFold(g.UUID, uuid) {
			return g, true
		}
	}
	return inventory.GPU{}, false
}

// applyHealth makes the current state's Unhealthy what the tracker says,
// swapping in a copy of the state when it changed, and logs each change.
// The caller holds mu.
func (n *Node) applyHealth() {
	cur := n.state.Load()
	if cur == nil || n.health == nil {
		return
	}
	bad := n.health.unhealthy(cur.Snapshot())
	if maps.Equal(bad, cur.Unhealthy) {
		return
	}
	n.logHealth(cur.Unhealthy, bad)
	st := *cur
	st.Unhealthy = bad
	if n.onChange != nil {
		n.onChange(&st)
	}
	n.state.Store(&st)
	n.notify(&st)
}

// logHealth logs the devices that turned unhealthy or recovered, and tells
// the observer.
func (n *Node) logHealth(old, bad map[string]string) {
	for _, id := range slices.Sorted(maps.Keys(bad)) {
		if old[id] != bad[id] {
			n.log.WithField("device", id).Warnf("unhealthy: %s: count requests skip it, the device plugin reports it Unhealthy", bad[id])
		}
	}
	for _, id := range slices.Sorted(maps.Keys(old)) {
		if _, ok := bad[id]; !ok {
			n.log.WithField("device", id).Info("healthy again: NVML reports it usable")
		}
	}
	if ho, ok := n.observer().(HealthObserver); ok {
		ho.Unhealthy(bad)
	}
}

// RunHealth follows NVML's XID events until ctx ends: a critical XID
// (not in the current configuration's health.ignoredXIDs) makes the
// device unhealthy at once. Without NVML it waits, and starts listening
// once a rediscovery has loaded it. retry is how long it waits before
// trying again (zero: 5 s).
func (n *Node) RunHealth(ctx context.Context, retry time.Duration) {
	if retry <= 0 {
		retry = 5 * time.Second
	}
	logged := ""
	ignored := newIgnoredXIDs(n.xidLogInterval)
	for ctx.Err() == nil {
		lib := n.nvml.Lib()
		if lib == nil {
			sleep(ctx, retry)
			continue
		}
		evs, err := lib.Events()
		if errors.Is(err, nvml.ErrClosed) {
			// A rediscovery is replacing the library: take the new one.
			sleep(ctx, min(retry, 100*time.Millisecond))
			continue
		}
		if err != nil {
			if msg := err.Error(); msg != logged {
				n.log.WithError(err).Warn("NVML: no XID events: GPU health follows NVML's enumeration only")
				logged = msg
			}
			sleep(ctx, retry)
			continue
		}
		if logged != "listening" {
			n.log.Infof("NVML: listening for XID events (ignoring application XIDs %v)", n.Config().Health.IgnoredXIDs)
			logged = "listening"
		}
		n.followEvents(ctx, evs, ignored)
		_ = evs.Close()
	}
	n.logIgnored(ignored.due(time.Now(), true))
}

// followEvents handles the events of evs until ctx ends or NVML fails
// (or is shut down by a rediscovery that replaces it).
func (n *Node) followEvents(ctx context.Context, evs nvml.Events, ignored *ignoredXIDs) {
	for ctx.Err() == nil {
		ev, ok, err := evs.Wait(time.Second)
		n.logIgnored(ignored.due(time.Now(), false))
		switch {
		case errors.Is(err, nvml.ErrClosed):
			n.log.Debug("NVML: shut down by a rediscovery; following the events of the library it loads")
			return
		case err != nil:
			n.log.WithError(err).Warn("NVML: waiting for XID events")
			return
		case !ok:
			continue
		}
		critical := !slices.Contains(n.Config().Health.IgnoredXIDs, ev.XID)
		if ho, ok := n.observer().(HealthObserver); ok {
			ho.XID(ev.XID, critical)
		}
		if !critical {
			// Application errors that user code can cause at will:
			// counted (nri_gpu_xid_events_total), logged at most once per
			// GPU per interval, and never under the node's lock.
			n.logIgnored(ignored.note(ev.UUID, ev.XID, time.Now()))
			continue
		}
		n.mu.Lock()
		if st := n.state.Load(); st != nil {
			n.health.xid(st.Snapshot(), ev)
			n.applyHealth()
		}
		n.mu.Unlock()
	}
}

// logIgnored logs lines of ignored XIDs.
func (n *Node) logIgnored(lines []xidLine) {
	for _, l := range lines {
		n.log.WithFields(logrus.Fields{"device": l.GPU, "xids": l.XIDs}).
			Infof("XID events: application errors, ignored (health.ignoredXIDs); counted in nri_gpu_xid_events_total, logged at most once per GPU every %s", l.Interval)
	}
}

// DefaultXIDLogInterval is how often, at most, the ignored XIDs of one GPU
// are logged: the first at once, those that follow within the interval in
// one line at its end.
const DefaultXIDLogInterval = time.Minute

// maxXIDKinds bounds the distinct XIDs counted per GPU between two lines;
// more are counted as "other".
const maxXIDKinds = 16

// ignoredXIDs aggregates the ignored XIDs of each GPU for the log.
type ignoredXIDs struct {
	interval time.Duration
	byGPU    map[string]*xidTally
}

// xidTally is one GPU's ignored XIDs since its last line.
type xidTally struct {
	logged time.Time
	counts map[uint64]int
	other  int
}

// xidLine is one log line: a GPU's ignored XIDs ("13 x120, 31 x2").
type xidLine struct {
	GPU, XIDs string
	Interval  time.Duration
}

func newIgnoredXIDs(interval time.Duration) *ignoredXIDs {
	if interval <= 0 {
		interval = DefaultXIDLogInterval
	}
	return &ignoredXIDs{interval: interval, byGPU: map[string]*xidTally{}}
}

// note counts an ignored XID of gpu at now and returns the line to log
// now: the XID itself when the GPU's last line is an interval old, else
// none (it is counted for the line at the interval's end).
func (x *ignoredXIDs) note(gpu string, xid uint64, now time.Time) []xidLine {
	t := x.byGPU[gpu]
	if t == nil {
		if len(x.byGPU) >= nvml.MaxGPUs {
			return nil // counted by the metric; NVML has no more GPUs than that
		}
		t = &xidTally{counts: map[uint64]int{}}
		x.byGPU[gpu] = t
	}
	switch _, seen := t.counts[xid]; {
	case seen || len(t.counts) < maxXIDKinds:
		t.counts[xid]++
	default:
		t.other++
	}
	if !t.logged.IsZero() && now.Sub(t.logged) < x.interval {
		return nil
	}
	return []xidLine{x.flush(gpu, t, now)}
}

// due returns the lines of the GPUs whose XIDs have waited an interval
// (all of them with force), and forgets GPUs quiet for an interval.
func (x *ignoredXIDs) due(now time.Time, force bool) []xidLine {
	var out []xidLine
	for _, gpu := range slices.Sorted(maps.Keys(x.byGPU)) {
		t := x.byGPU[gpu]
		if !force && now.Sub(t.logged) < x.interval {
			continue
		}
		if len(t.counts) == 0 && t.other == 0 {
			delete(x.byGPU, gpu)
			continue
		}
		out = append(out, x.flush(gpu, t, now))
	}
	return out
}

// flush makes t's line and starts a new interval.
func (x *ignoredXIDs) flush(gpu string, t *xidTally, now time.Time) xidLine {
	var parts []string
	for _, xid := range slices.Sorted(maps.Keys(t.counts)) {
		parts = append(parts, fmt.Sprintf("%d x%d", xid, t.counts[xid]))
	}
	if t.other > 0 {
		parts = append(parts, fmt.Sprintf("others x%d", t.other))
	}
	t.logged, t.counts, t.other = now, map[uint64]int{}, 0
	return xidLine{GPU: gpu, XIDs: strings.Join(parts, ", "), Interval: x.interval}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
