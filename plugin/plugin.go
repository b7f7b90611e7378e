// Package plugin is nri-gpu's NRI plugin: the runtime's callbacks and the
// connection loop, nothing else. CreateContainer runs the request path
// (package pipeline) on the node's current state (package node); the
// other events keep the allocation table in step with the runtime's
// containers, and Synchronize rebuilds it after a restart of either side.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/pipeline"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Plugin answers the runtime's CreateContainer requests with GPU
// adjustments.
type Plugin struct {
	log  *logrus.Logger
	node *node.Node
	// table is who holds which GPUs; rebuilt on every Synchronize.
	table *alloc.Table
	// synced is set once the runtime has synchronized the plugin on the
	// current connection, and cleared when the connection is lost.
	synced atomic.Bool
	// stub is the NRI stub of the current connection.
	stub atomic.Pointer[stub.Stub]
	// runtimeCDI is set when the connected runtime's NRI resolves CDI
	// device references in adjustments.
	runtimeCDI atomic.Bool
	// pathWarned is set once this connection's log has said that a
	// container's binaries went to /usr/bin (Result.BinariesAtUsrBin).
	pathWarned atomic.Bool
	// obs is told what the plugin does (metrics); set before Run.
	obs Observer
	// events hears of refused and voided requests (the pod's Events);
	// nil without one; set before Run.
	events EventSink
	// claims are the node's prepared DRA claims (SetPrepared), nil
	// without the DRA driver; claimMu orders their bookings with the
	// table's rebuild at Synchronize.
	claims  atomic.Pointer[claims.Prepared]
	claimMu sync.Mutex
	// unknown is set while the DRA driver's checkpoint cannot be read
	// (ClaimsUnknown): why, and the GPUs held for its claims; guarded by
	// claimMu, read by notReady.
	unknown atomic.Pointer[unknownClaims]
}

// unknownClaims is why the DRA driver's prepared claims are unknown, and
// the UUIDs of the GPUs it offers, held meanwhile.
type unknownClaims struct {
	why   string
	uuids []string
}

// nriEvents are the NRI events the plugin subscribes to: creation to inject
// and book GPUs, the others to release them.
var nriEvents = []string{"CreateContainer", "StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox"}

// minCDINRIVersion is the first NRI version whose runtimes inject CDI
// devices named in an adjustment.
const minCDINRIVersion = "v0.10.0"

// New discovers the node with cfg and returns a plugin serving it; nodeOpts
// go to the node (node.KeepDevCharLinks).
func New(cfg config.Config, log *logrus.Logger, nodeOpts ...node.Option) (*Plugin, error) {
	return newPlugin(log, func(opts ...node.Option) (*node.Node, error) {
		return node.New(cfg, log, append(opts, nodeOpts...)...)
	})
}

// newPlugin returns a plugin serving the node that mk makes with the
// options it is given.
func newPlugin(log *logrus.Logger, mk func(...node.Option) (*node.Node, error)) (*Plugin, error) {
	p := &Plugin{log: log, table: alloc.New(nil)}
	n, err := mk(node.OnChange(p.stateChanged))
	if err != nil {
		return nil, err
	}
	p.node = n
	return p, nil
}

// stateChanged sizes the allocation table to a new state's devices.
func (p *Plugin) stateChanged(st *node.State) {
	devs := st.Source.Devices()
	idx := make([]int, len(devs))
	var bad map[int]string
	for i, g := range devs {
		idx[i] = g.Index
		if why := st.Unhealthy[g.UUID]; why != "" {
			if bad == nil {
				bad = map[int]string{}
			}
			bad[g.Index] = why
		}
	}
	p.table.SetGPUs(idx)
	p.table.SetUnhealthy(bad)
	p.table.SetReplicated(replicated(st))
}

// replicated returns the devices of st that its sharing plan hands out as
// the device plugin's replicas, by index, with what each is shared as.
func replicated(st *node.State) map[int]string {
	var out map[int]string
	for _, g := range st.Source.Devices() {
		if sh, ok := st.Shares.Share(g.ID()); ok {
			if out == nil {
				out = map[int]string{}
			}
			out[g.Index] = sh.String()
		}
	}
	return out
}

// Node returns the node the plugin serves: its state, reload and watch.
func (p *Plugin) Node() *node.Node { return p.node }

// Configure handles the runtime's Configure request. A pre-registered
// plugin gets its configuration file's contents here; an empty config keeps
// the current one.
func (p *Plugin) Configure(_ context.Context, cfg, runtime, version string) (api.EventMask, error) {
	nriVersion := "unknown"
	if s := p.stub.Load(); s != nil {
		nriVersion = (*s).RuntimeNRIVersion()
	}
	cdi, why := runtimeInjectsCDI(runtime, version, nriVersion)
	p.runtimeCDI.Store(cdi)
	p.pathWarned.Store(false)
	p.log.Infof("connected to %s %s (NRI %s)", runtime, version, nriVersion)
	if cfg != "" {
		c, err := config.Parse([]byte(cfg))
		if err != nil {
			return 0, fmt.Errorf("nri-gpu: configuration from the runtime: %w", err)
		}
		if err := p.node.Reload(c); err != nil {
			return 0, err
		}
	}
	if !cdi && p.node.State().Config.Emit == config.EmitCDI {
		// Once per connection, not per container: every GPU goes as edits.
		p.log.Warnf("emit: cdi: %s; GPUs are injected as edits (device nodes, mounts, env) instead", why)
	}
	return api.MustParseEventMask(nriEvents...), nil
}

// path returns the request path of the current state.
func (p *Plugin) path(st *node.State) pipeline.Path {
	return pipeline.Path{
		Source: st.Source, Table: p.table, Sharing: st.Sharing, Policy: st.Config.Policy,
		EmitCDI: st.Config.Emit == config.EmitCDI, CDINames: st.CDINames, RuntimeCDI: p.runtimeCDI.Load(), Shares: st.Shares,
		Claims: p.claims.Load(),
	}
}

// SetPrepared makes prep the node's prepared Dynamic Resource Allocation
// claims, which the request path reads (the DRA driver calls it before
// each set becomes current: dra.Options.Book), and books their devices
// in the allocation table, by claim (pipeline.ClaimHoldings,
// alloc.Table.SyncClaims): node-local requests (annotations, the
// environment, where the policy allows them) then see a prepared claim's
// devices as held before its first container exists, and an unprepared
// claim's as free. claim, when given, is the UID of the claim being
// prepared: when one of its devices is held exclusively by another, or
// it would hold one exclusively that another holds, nothing changes and
// the error names the holder.
func (p *Plugin) SetPrepared(prep *claims.Prepared, claim string) error {
	p.claimMu.Lock()
	defer p.claimMu.Unlock()
	st := p.node.State()
	hs, warnings := pipeline.ClaimHoldings(st.Source, st.Sharing, prep)
	for _, w := range warnings {
		p.log.Warn("DRA: " + w)
	}
	must := ""
	if claim != "" {
		must = alloc.ClaimHolderPrefix + claim
	}
	if err := p.table.SyncClaims(hs, must); err != nil {
		if ae := (*alloc.Error)(nil); errors.As(err, &ae) {
			p.log.Warn("DRA: claim refused: " + ae.Logged())
		}
		return err
	}
	p.claims.Store(prep)
	if p.unknown.Swap(nil) != nil {
		p.log.Info("DRA: the checkpoint reads again: the GPUs held while it could not be read are released")
	}
	p.logTable(fmt.Sprintf("%d prepared claims booked", len(hs)))
	return nil
}

// ClaimsUnknown holds the GPUs of uuids (those the DRA driver offers:
// dra.Offered) for the driver's prepared claims, which are unknown: its
// checkpoint cannot be read (why). Node-local requests are refused on
// them, naming alloc.UnknownClaims, and the plugin is not ready, until
// SetPrepared books a set read from the checkpoint. The first call, and
// one with another why, logs it; each call books the GPUs again (the
// inventory may have changed).
func (p *Plugin) ClaimsUnknown(why error, uuids []string) {
	p.claimMu.Lock()
	defer p.claimMu.Unlock()
	u := &unknownClaims{why: why.Error(), uuids: uuids}
	if old := p.unknown.Swap(u); old == nil || old.why != u.why {
		p.log.WithError(why).Errorf("DRA: the prepared claims cannot be read: the %d GPUs and MIG devices the DRA driver offers are held, and nri-gpu is not ready, "+
			"until they can (nri-gpu doctor checks the file; see the DRA documentation on the checkpoint)", len(uuids))
	}
	st := p.node.State()
	hs, _ := pipeline.ClaimHoldings(st.Source, st.Sharing, p.claims.Load())
	if err := p.table.SyncClaims(append(hs, unknownHolding(st, u)...), ""); err != nil {
		p.log.WithError(err).Warn("DRA: holding the GPUs of unknown claims")
	}
}

// unknownHolding is the holding of u's GPUs that st has, exclusive
// (alloc.UnknownClaims); none without u.
func unknownHolding(st *node.State, u *unknownClaims) []alloc.Holding {
	if u == nil {
		return nil
	}
	h := alloc.Holding{Holder: alloc.UnknownClaims(), Mode: sharing.Exclusive, Runtime: true}
	for _, g := range st.Source.Devices() {
		if slices.Contains(u.uuids, g.UUID) {
			h.GPUs = append(h.GPUs, g.Index)
		}
	}
	if len(h.GPUs) == 0 {
		return nil
	}
	return []alloc.Holding{h}
}

// CreateContainer handles the runtime's CreateContainer request: the
// request path on the current state, under the runtime's context (its
// deadline is the runtime's plugin timeout).
func (p *Plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	adj, res, err := p.Handle(ctx, pod, ctr)
	took := time.Since(start)
	p.observeRequest(&res, adj, err, took)
	p.report(pod, ctr, &res, err)
	// took: the answer's time, exact where the histogram's buckets end.
	fields := logrus.Fields{
		"namespace": pod.GetNamespace(),
		"pod":       pod.GetName(),
		"container": ctr.GetName(),
		"took":      took.Round(time.Microsecond),
	}
	for _, w := range res.Warnings {
		p.log.WithFields(fields).Warn(w)
	}
	switch {
	case err != nil:
		// The pod's message does not name other tenants' pods; the log
		// names every holder.
		logged := err
		if ae := (*alloc.Error)(nil); errors.As(err, &ae) {
			logged = errors.New(ae.Logged())
		}
		p.log.WithFields(fields).WithError(logged).Warn("request refused")
		return nil, nil, err
	case res.Selection.Note != "":
		p.log.WithFields(fields).Info(res.Selection.Note)
	case adj != nil:
		if res.Emit != "" {
			fields["emit"] = res.Emit
		}
		fields["source"] = res.Request.Source.String()
		fields["gpus"] = res.Edits.VisibleDevices
		fields["capabilities"] = res.Selection.Caps.String()
		fields["files"] = res.Edits.Files
		fields["mounts"] = len(res.Edits.Mounts)
		if res.Holding != nil {
			fields["mode"] = res.Holding.Mode.String()
		}
		if len(res.Claims) > 0 {
			names := make([]string, len(res.Claims))
			for i, h := range res.Claims {
				names[i] = h.Holder.Namespace + "/" + h.Holder.Claim
			}
			fields["claims"] = strings.Join(names, ",")
		}
		p.log.WithFields(fields).Info("injected")
		if res.BinariesAtUsrBin && p.pathWarned.CompareAndSwap(false, true) {
			// Once per connection: the runtime does it for every image
			// that sets PATH.
			p.log.WithFields(fields).Warnf("the runtime shows the container's PATH twice and keeps its own over a plugin's (CRI-O 1.34 does for every image or pod spec that sets PATH): driver binaries are mounted at /usr/bin instead of %s for such containers, so that they run by name", strings.Join(res.Edits.BinaryDirs, ":"))
		}
		if res.Holding != nil {
			p.logTable("allocated to " + res.Holding.Holder.String())
		}
	}
	return adj, nil, nil
}

// Handle runs the request path for container ctr of pod on the node's
// current state and the plugin's allocation table, as CreateContainer
// does, and returns what the path decided besides its answer.
// CreateContainer adds the log, the metrics and the pod's Events; nri-gpu
// explain calls Handle on a plugin of its own (a scratch table).
func (p *Plugin) Handle(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, pipeline.Result, error) {
	path := p.path(p.node.State())
	return path.Handle(ctx, pod, ctr)
}

// Seed makes the allocation table hold hs (nri-gpu explain starts from
// the running plugin's table, status.Status.Holdings).
func (p *Plugin) Seed(hs []alloc.Holding) { p.table.Rebuild(hs) }

// Synchronize handles the runtime's Synchronize request, sent once per
// connection with the pods and containers that exist: the allocation table
// is rebuilt from them (see pipeline.Path.Holdings: the request path's own
// classification, so the table is what CreateContainer booked), so that it survives
// restarts of the plugin and of the runtime without a state file; the
// prepared claims' holdings are rebuilt from the DRA driver's checkpoint
// (SetPrepared's last set, pipeline.ClaimHoldings).
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	st := p.node.State()
	p.claimMu.Lock()
	path := p.path(st)
	hs, warnings := path.Holdings(pods, ctrs)
	chs, cw := pipeline.ClaimHoldings(st.Source, st.Sharing, path.Claims)
	for _, w := range append(warnings, cw...) {
		p.log.Warn("synchronize: " + w)
	}
	chs = append(chs, unknownHolding(st, p.unknown.Load())...)
	p.table.Rebuild(append(hs, chs...))
	p.claimMu.Unlock()
	p.log.WithFields(logrus.Fields{"pods": len(pods), "containers": len(ctrs), "holders": len(hs)}).Info("synchronized with the runtime")
	p.logTable("rebuilt from the runtime's containers")
	p.synced.Store(true)
	sources := map[string]bool{}
	for _, c := range ctrs {
		for _, m := range c.GetMounts() {
			sources[m.GetSource()] = true
		}
	}
	p.node.CleanLibraryCache(func(dir string) bool { return sources[dir] })
	p.observer().Connected()
	return nil, nil
}

// StopContainer releases the GPUs of a container that stopped (or whose
// creation failed after the plugin answered: the runtime then stops and
// removes it).
func (p *Plugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.release(pipeline.HolderOf(pod, ctr), "stopped")
	return nil, nil
}

// RemoveContainer releases the GPUs of a removed container, and its
// pod's GPUs (a pod-level count) when it was the last container of the pod
// that shared them (a creation the runtime undid).
func (p *Plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	h := pipeline.HolderOf(pod, ctr)
	p.release(h, "removed")
	if p.table.Leave(h.ID) {
		p.logTable("released by pod " + pod.GetNamespace() + "/" + pod.GetName() + " (its last container that shared the pod's GPUs was removed)")
	}
	return nil
}

// StopPodSandbox releases the GPUs of every container of a stopped pod.
func (p *Plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.releasePod(pod, "stopped")
	return nil
}

// RemovePodSandbox releases the GPUs of every container of a removed pod.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.releasePod(pod, "removed")
	return nil
}

func (p *Plugin) release(h alloc.Holder, why string) {
	if p.table.Release(h.ID) {
		p.logTable("released by " + h.String() + " (" + why + ")")
	}
}

func (p *Plugin) releasePod(pod *api.PodSandbox, why string) {
	if n := p.table.ReleasePod(pod.GetId()); n > 0 {
		p.logTable("released by the " + strconv.Itoa(n) + " containers of pod " + pod.GetNamespace() + "/" + pod.GetName() + " (" + why + ")")
	}
}

// logTable logs the allocation table after a change.
func (p *Plugin) logTable(change string) {
	if !p.log.IsLevelEnabled(logrus.InfoLevel) {
		return
	}
	p.log.WithField("table", alloc.Summary(p.table.State())).Info("allocation: " + change)
}

// Ready reports whether the plugin is connected to the runtime and
// synchronized with it, with an inventory loaded and the DRA driver's
// prepared claims known (ClaimsUnknown): whether containers created now
// get their GPUs.
func (p *Plugin) Ready() bool { return p.notReady() == "" }

// notReady says why the plugin is not ready, or "" when it is.
func (p *Plugin) notReady() string {
	switch {
	case p.node == nil || p.node.State() == nil:
		return "no inventory loaded"
	case p.unknown.Load() != nil:
		return "the DRA driver's prepared claims cannot be read (" + p.unknown.Load().why + "): the GPUs it offers are held until they can (nri-gpu doctor)"
	case !p.synced.Load():
		return "not connected to the runtime, or not yet synchronized with it"
	}
	return ""
}

// NotReady returns nil when the plugin is ready (see Ready), or an error
// saying why it is not, for the /readyz endpoint.
func (p *Plugin) NotReady() error {
	if r := p.notReady(); r != "" {
		return errors.New(r)
	}
	return nil
}

// Status returns the plugin's readiness and allocation table, for the
// status API.
func (p *Plugin) Status() status.Status {
	var st *node.State
	if p.node != nil {
		st = p.node.State()
	}
	s := status.Status{Reason: p.notReady(), GPUs: []status.GPUStatus{}}
	s.Ready = s.Reason == ""
	ids := map[int]string{}
	if st != nil {
		s.Sharing = st.Sharing.String()
		for _, g := range st.Source.Devices() {
			ids[g.Index] = g.ID()
		}
	}
	for _, row := range p.table.State() {
		s.GPUs = append(s.GPUs, status.GPUStatus{GPUState: row, UUID: ids[row.Index], Name: inventory.UnitLabel(row.Index), Kubelet: status.KubeletHolders(row)})
	}
	return s
}

// RunOptions say how to reach the runtime.
type RunOptions struct {
	// SocketPath is the runtime's NRI socket.
	SocketPath string
	Name       string
	Index      string
	// PreRegistered is set when the runtime started the plugin with a
	// connection on a file descriptor; such a plugin cannot reconnect.
	PreRegistered bool
	// MaxBackoff bounds the wait between reconnection attempts.
	MaxBackoff time.Duration
}

// Run serves the runtime until ctx is cancelled. When the runtime goes away
// (a restart), it reconnects with a backoff growing from 100ms to
// MaxBackoff, instead of exiting. A pre-registered plugin returns when its
// connection closes.
func (p *Plugin) Run(ctx context.Context, o RunOptions) error {
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 5 * time.Second
	}
	backoff := 100 * time.Millisecond
	for {
		// A pre-registered plugin takes its name, index and connection
		// from the environment the runtime gave it.
		var opts []stub.Option
		if !o.PreRegistered {
			opts = append(opts, stub.WithPluginName(o.Name), stub.WithPluginIdx(o.Index),
				stub.WithSocketPath(o.SocketPath))
		}
		s, err := stub.New(p, opts...)
		if err != nil {
			return fmt.Errorf("creating NRI stub: %w", err)
		}
		p.stub.Store(&s)
		start := time.Now()
		err = s.Run(ctx)
		p.synced.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if o.PreRegistered {
			return fmt.Errorf("connection to the runtime closed: %w", err)
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		if err == nil {
			err = errors.New("connection closed")
		}
		p.log.WithError(err).Warnf("NRI connection lost or refused; reconnecting in %s", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, o.MaxBackoff)
	}
}
