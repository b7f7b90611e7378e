package node

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/mps"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// plan returns the sharing plan of a new state, its MPS daemons' readiness
// read at once (nri-gpu mps's ready files), and logs the plan's warnings
// when they change. The caller holds mu.
func (n *Node) plan(cfg config.Config, src adjust.Source) *sharing.Plan {
	p := sharing.NewPlan(cfg.DevicePlugin.SharingSpec(), src.Devices())
	if w := strings.Join(p.Warnings, "\n"); w != n.lastPlanWarnings {
		n.lastPlanWarnings = w
		for _, msg := range p.Warnings {
			n.log.Warnf("device plugin: %s", msg)
		}
	}
	if daemons := p.MPSDaemons(); len(daemons) > 0 {
		p, _ = p.WithMPS(mps.Probe(daemons, time.Now()), "")
		n.logMPS(nil, p)
	}
	return p
}

// DefaultMPSInterval is how often RunMPS reads the MPS daemons' ready
// files.
const DefaultMPSInterval = time.Second

// RunMPS follows the readiness of the MPS control daemons that nri-gpu mps
// runs for the current state's plan until ctx ends, reading their ready
// files every interval (zero: DefaultMPSInterval): a change swaps in a
// copy of the state with the new readiness, which the request path and the
// device plugin read. A state without MPS GPUs costs nothing but the
// wake-up.
func (n *Node) RunMPS(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultMPSInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := n.state.Load()
		if cur == nil || cur.Shares == nil || len(cur.Shares.MPSDaemons()) == 0 {
			continue
		}
		status := mps.Probe(cur.Shares.MPSDaemons(), time.Now())
		n.mu.Lock()
		n.applyMPS(status)
		n.mu.Unlock()
	}
}

// applyMPS makes status the current state's MPS readiness, swapping in a
// copy of the state when it changed. The caller holds mu.
func (n *Node) applyMPS(status map[string]sharing.MPSStatus) {
	cur := n.state.Load()
	if cur == nil || cur.Shares == nil {
		return
	}
	p, changed := cur.Shares.WithMPS(status, "")
	if !changed {
		return
	}
	n.logMPS(cur.Shares, p)
	st := *cur
	st.Shares = p
	if n.onChange != nil {
		n.onChange(&st)
	}
	n.state.Store(&st)
	n.notify(&st)
}

// logMPS logs each MPS daemon that turned ready or not ready from old (nil:
// none known) to p.
func (n *Node) logMPS(old, p *sharing.Plan) {
	daemons := p.MPSDaemons()
	for _, id := range slices.Sorted(maps.Keys(daemons)) {
		d := daemons[id]
		var was *sharing.MPSDaemon
		if old != nil {
			was = old.MPSDaemons()[id]
		}
		switch {
		case was != nil && was.Ready == d.Ready && was.Why == d.Why:
		case d.Ready:
			n.log.WithField("device", id).Infof("MPS control daemon ready: containers may be given this GPU's replicas (pipe %s)", d.PipeDir)
		default:
			n.log.WithField("device", id).Warnf("MPS control daemon not ready: new containers on this GPU are refused: %s", d.Why)
		}
	}
}
