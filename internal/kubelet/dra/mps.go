package dra

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/mps"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// MPS for claims: a claim device whose GpuConfig asks for strategy MPS
// gets an MPS control daemon of its own GPU or MIG device (a MIG device,
// static or made for the claim, gets its own daemon, keyed by its
// MIG-<uuid>, as NVIDIA runs one daemon per MIG device), which nri-gpu mps starts and
// supervises (the same Supervisor as the device plugin's MPS GPUs) from
// this driver's checkpoint: it runs while a prepared claim names it, and
// is retired when none does (SuperviseClaims, run by nri-gpu mps). The
// driver itself starts nothing (nri-gpu run is unprivileged and reads
// mpsRoot only): it reads the daemons' ready files, refuses to finish
// preparing the claim until its daemon is ready (waitMPS, holding no
// lock), and tells the request path whether each is ready. The two sides
// wake each other through mps.Watch on the file the other writes
// (docs/sharing.md, the handshake with the DRA driver).

// mpsWait bounds how long PrepareResourceClaims waits for a claim's MPS
// daemon to be reported ready before it fails the claim (which stays
// prepared, so that nri-gpu mps keeps starting its daemon; the kubelet
// asks again).
var mpsWait = 15 * time.Second

// claimMPS plans the MPS control daemon of the GPU or MIG device uuid
// with lim.
func (d *Driver) claimMPS(uuid string, lim sharing.MPSLimits) *sharing.MPSDaemon {
	pipe, log, shm := sharing.DaemonDirs(d.opts.MPSRoot, uuid)
	return &sharing.MPSDaemon{PipeDir: pipe, LogDir: log, ShmDir: shm, MPSLimits: lim, Why: sharing.NotReported}
}

// checkMPSClaim refuses what nri-gpu's MPS cannot serve: a claim with
// MPS on more than one device (an MPS client reaches one daemon, and
// nri-gpu's daemons serve one GPU or MIG device each), on a MIG device
// whose UUID is not one path element (the daemon's directories are
// named by it), or on an adminAccess request.
func checkMPSClaim(devs []claims.Device) error {
	var with []string
	for _, dv := range devs {
		if dv.MPS == nil {
			continue
		}
		with = append(with, dv.Name)
		switch {
		case dv.MIG && (!sharing.IsMIG(dv.UUID) || strings.ContainsAny(dv.UUID, `/\`)):
			return fmt.Errorf("request %s: device %s is a MIG device whose UUID %q is not of the form MIG-<uuid> (an older driver's MIG-GPU-<uuid>/<gi>/<ci>), "+
				"which names the directories of its MPS control daemon: sharing strategy %s is not served on it (valid here: %s, or no sharing)",
				dv.Request, dv.Name, dv.UUID, StrategyMPS, StrategyTimeSlicing)
		case dv.AdminAccess:
			return fmt.Errorf("request %s: device %s is an adminAccess device, which holds nothing: sharing strategy %s does not apply to it", dv.Request, dv.Name, StrategyMPS)
		}
	}
	if len(with) > 0 && len(devs) > 1 {
		return fmt.Errorf("sharing strategy %s on %d devices (%v): nri-gpu's MPS control daemons serve one GPU or MIG device each, and a container reaches one daemon only, "+
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

// SuperviseClaims runs, in nri-gpu mps, the MPS control daemons of the
// driver's prepared claims with sharing strategy MPS (the checkpoint in
// pluginDir, which nri-gpu mps's pod mounts read-only) beside static (the
// device plugin's), with sup, until ctx ends: a claim's daemon comes up once its claim is in the
// checkpoint and is retired once no prepared claim names its GPU. The
// checkpoint is read at start and at every wake-up: WatchCheckpoint's,
// at every change of pluginDir; one that cannot be read leaves the
// daemons as they are. It survives restarts of either side, so a
// restarted nri-gpu mps adopts the same daemons.
func SuperviseClaims(ctx context.Context, pluginDir, root string, wake <-chan struct{}, sup *mps.Supervisor, static map[string]*sharing.MPSDaemon, log *logrus.Logger) {
	var last string
	want := func() map[string]*sharing.MPSDaemon {
		p, err := ReadPrepared(pluginDir)
		if err != nil {
			if err.Error() != last {
				log.WithError(err).Warn("DRA: the prepared claims cannot be read: their MPS daemons stay as they are")
				last = err.Error()
			}
			return nil
		}
		last = ""
		out := maps.Clone(static)
		if out == nil {
			out = map[string]*sharing.MPSDaemon{}
		}
		for uuid, d := range MPSDaemons(p) {
			if static[uuid] == nil {
				out[uuid] = d
			}
		}
		return out
	}
	keep := want()
	if keep == nil {
		keep = static
	}
	log.Infof("supervising %d MPS control daemons under %s (%d of DRA claims, followed in %s)", len(keep), root, len(keep)-len(static), pluginDir)
	sup.Retire(ctx, root, keep)
	sup.Follow(ctx, root, wake, want)
}

// WatchCheckpoint wakes nri-gpu mps's SuperviseClaims when the
// checkpoint in pluginDir changes (the driver writes it by a rename into
// the directory: mps.Watch), else every claimsFallback.
func WatchCheckpoint(ctx context.Context, pluginDir string) <-chan struct{} {
	return mps.Watch(ctx, claimsFallback, pluginDir)
}

// claimsFallback is how often nri-gpu mps reads the checkpoint without a
// wake-up.
const claimsFallback = 5 * time.Second

// MPSDaemons returns the MPS control daemons that the prepared claims p
// need, by GPU or MIG device UUID: what nri-gpu mps supervises for DRA.
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
// request path refuses new clients of a daemon that is not ready). The
// caller holds mu.
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
// devs with MPS is ready; not ready by then, or the claim unprepared
// meanwhile, fails the claim with why. It holds mu only to read the
// daemons' ready files (probeMPS), and wakes when one of their
// directories changes (mps.Watch: nri-gpu mps writes a ready file by a
// rename), else every mpsFallback.
func (d *Driver) waitMPS(ctx context.Context, c *resourceapi.ResourceClaim, devs []claims.Device) error {
	var need []claims.Device
	var dirs []string
	for _, dv := range devs {
		if dv.MPS != nil {
			need = append(need, dv)
			dirs = append(dirs, mps.DaemonDir(dv.MPS))
		}
	}
	if len(need) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := d.watchReady(ctx, append(dirs, d.opts.MPSRoot)...)
	deadline := time.NewTimer(mpsWait)
	defer deadline.Stop()
	for {
		d.mu.Lock()
		_, prepared := d.ckpt.Claims[string(c.UID)]
		d.probeMPS()
		st := d.mpsStatus
		d.mu.Unlock()
		if !prepared {
			return fmt.Errorf("prepare claim %s/%s: unprepared while waiting for its MPS control daemon", c.Namespace, c.Name)
		}
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
		select {
		case <-wake:
			continue
		case <-ctx.Done():
		case <-deadline.C:
		}
		return fmt.Errorf("prepare claim %s/%s: %s (sharing strategy %s: nri-gpu mps, deploy/kubernetes/mps, runs the daemons of prepared claims; the claim stays prepared and is ready once its daemon is)",
			c.Namespace, c.Name, why, StrategyMPS)
	}
}

// watchReady wakes waitMPS when one of dirs (the daemons' directories
// and mpsRoot) changes, else every mpsFallback.
func watchReady(ctx context.Context, dirs ...string) <-chan struct{} {
	return mps.Watch(ctx, mpsFallback, dirs...)
}

// mpsFallback is how often waitMPS reads the ready files without a
// wake-up.
const mpsFallback = 250 * time.Millisecond

// followMPS probes the prepared claims' daemons every heartbeat until ctx
// ends: a ready file untouched for mps.StaleAfter (nri-gpu mps gone) is
// found only by its age.
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
