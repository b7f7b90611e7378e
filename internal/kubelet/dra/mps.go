package dra

import (
	"context"
	"fmt"
	"maps"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/mps"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// MPS for claims: a claim device whose GpuConfig asks for strategy MPS
// gets an MPS control daemon of its own GPU, which nri-gpu mps starts and
// supervises (the same Supervisor as the device plugin's MPS GPUs) from
// this driver's checkpoint: it runs while a prepared claim names it, and
// is retired when none does. The driver itself starts nothing (nri-gpu
// run is unprivileged and reads mpsRoot only): it reads the daemons'
// ready files, refuses to finish preparing the claim until its daemon is
// ready, and tells the request path whether each is ready.

// mpsWait bounds how long PrepareResourceClaims waits for a claim's MPS
// daemon to be reported ready before it fails the claim (which stays
// prepared, so that nri-gpu mps keeps starting its daemon; the kubelet
// asks again).
var mpsWait = 15 * time.Second

// claimMPS plans the MPS control daemon of the GPU uuid with lim.
func (d *Driver) claimMPS(uuid string, lim sharing.MPSLimits) *sharing.MPSDaemon {
	pipe, log, shm := sharing.DaemonDirs(d.opts.MPSRoot, uuid)
	return &sharing.MPSDaemon{PipeDir: pipe, LogDir: log, ShmDir: shm, MPSLimits: lim, Why: sharing.NotReported}
}

// checkMPSClaim refuses what nri-gpu's MPS cannot serve: a claim with
// MPS on more than one device (an MPS client reaches one daemon, and
// nri-gpu's daemons serve one GPU each), on a MIG device (nri-gpu runs
// no daemon for a MIG device), or on an adminAccess request.
func checkMPSClaim(devs []claims.Device) error {
	var with []string
	for _, dv := range devs {
		if dv.MPS == nil {
			continue
		}
		with = append(with, dv.Name)
		switch {
		case dv.MIG:
			return fmt.Errorf("request %s: device %s is a MIG device: sharing strategy %s is supported by nri-gpu for whole GPUs only (valid here: %s, or no sharing)",
				dv.Request, dv.Name, StrategyMPS, StrategyTimeSlicing)
		case dv.AdminAccess:
			return fmt.Errorf("request %s: device %s is an adminAccess device, which holds nothing: sharing strategy %s does not apply to it", dv.Request, dv.Name, StrategyMPS)
		}
	}
	if len(with) > 0 && len(devs) > 1 {
		return fmt.Errorf("sharing strategy %s on %d devices (%v): nri-gpu's MPS control daemons serve one GPU each, and a container reaches one daemon only, "+
			"so a claim with %s has one device (split the request, or use %s)", StrategyMPS, len(devs), deviceNames(devs), StrategyMPS, StrategyTimeSlicing)
	}
	return nil
}

func deviceNames(devs []claims.Device) []string {
	out := make([]string, 0, len(devs))
	for _, dv := range devs {
		out = append(out, dv.Name)
	}
	return out
}

// MPSDaemons returns the MPS control daemons that the prepared claims p
// need, by GPU UUID: what nri-gpu mps supervises for DRA.
func MPSDaemons(p *claims.Prepared) map[string]*sharing.MPSDaemon {
	out := map[string]*sharing.MPSDaemon{}
	for _, dv := range p.Devices() {
		if m := dv.MPS; m != nil {
			out[dv.UUID] = &sharing.MPSDaemon{PipeDir: m.PipeDir, LogDir: m.LogDir, ShmDir: m.ShmDir, MPSLimits: daemonLimits(dv)}
		}
	}
	return out
}

// withStatus returns p with its MPS daemons' readiness from status (a
// daemon missing from it is not ready), and whether anything changed.
func withStatus(p *claims.Prepared, status map[string]sharing.MPSStatus) (*claims.Prepared, bool) {
	devs := p.Devices()
	changed := false
	for i := range devs {
		m := devs[i].MPS
		if m == nil {
			continue
		}
		st, ok := status[devs[i].UUID]
		if !ok {
			st.Why = sharing.NotReported
		}
		if st.Ready {
			st.Why = ""
		}
		if st.Ready != m.Ready || st.Why != m.Why {
			n := *m
			n.Ready, n.Why = st.Ready, st.Why
			devs[i].MPS = &n
			changed = true
		}
	}
	if !changed {
		return p, false
	}
	return claims.New(devs), true
}

// probeMPS reads the ready files of the prepared claims' daemons and,
// when their readiness changed, makes it current (and tells Book, whose
// request path refuses new clients of a daemon that is not ready). It
// reports whether every daemon of devs is ready. The caller holds mu.
func (d *Driver) probeMPS() {
	cur := d.prepared.Load()
	daemons := MPSDaemons(cur)
	if len(daemons) == 0 {
		return
	}
	status := mps.Probe(daemons, time.Now())
	if maps.Equal(status, d.mpsStatus) {
		return
	}
	d.mpsStatus = status
	if next, changed := withStatus(cur, status); changed {
		d.prepared.Store(next)
		d.tell(next)
	}
}

// waitMPS waits, up to mpsWait, until the MPS daemon of every device of
// devs with MPS is ready; not ready by then fails the claim with why.
// The caller holds mu.
func (d *Driver) waitMPS(ctx context.Context, c *resourceapi.ResourceClaim, devs []claims.Device) error {
	var need []claims.Device
	for _, dv := range devs {
		if dv.MPS != nil {
			need = append(need, dv)
		}
	}
	if len(need) == 0 {
		return nil
	}
	deadline := time.Now().Add(mpsWait)
	for {
		d.probeMPS()
		st := d.mpsStatus
		var why string
		for _, dv := range need {
			if s := st[dv.UUID]; !s.Ready {
				why = fmt.Sprintf("device %s (%s): its MPS control daemon is not ready: %s", dv.Name, dv.UUID, s.Why)
				break
			}
		}
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("prepare claim %s/%s: %s (sharing strategy %s: nri-gpu mps, deploy/kubernetes/mps, runs the daemons of prepared claims; the claim stays prepared and is ready once its daemon is)",
				c.Namespace, c.Name, why, StrategyMPS)
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// followMPS probes the prepared claims' daemons every heartbeat until ctx
// ends.
func (d *Driver) followMPS(ctx context.Context) {
	t := time.NewTicker(mps.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.mu.Lock()
		d.probeMPS()
		d.mu.Unlock()
	}
}
