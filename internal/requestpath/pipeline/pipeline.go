// Package pipeline is nri-gpu's request path: what happens to one
// container between the runtime's CreateContainer event and the plugin's
// answer. A Path holds what the path needs (the node's device source, the
// allocation table, the sharing mode and plan, the policy, the prepared
// Dynamic Resource Allocation claims). Handle first works out, once and as
// a value, what the runtime and the kubelet gave the container (classify:
// its device nodes, CDI devices, claims, the kubelet's assignment, whether
// it is privileged), then decides its kind (serve) and runs that kind's
// path: one function that reads top to bottom as named steps, each a
// method of Path that returns what the next needs, ending in the answer
// every kind shares. Then every kind's answer gets the IMEX channels the
// container asks for (imex), a request of its own. Synchronize rebuilds
// the allocation table with the same classification (Path.Holdings), so
// the two cannot disagree.
//
// The kinds, in the order serve lists them, each kind's steps, and the
// shared answer's (docs/kinds_test.go checks this block against the code):
//
// <!-- request path kinds: serve's order; each kind's steps -->
//
//	claimAssigned    stale, shares, bookGiven, claimRequest, reconcile, selectDevices, answer
//	kubeletAssigned  shares, bookGiven, kubeletRequest, reconcile, selectDevices, answer
//	runtimeGiven     shares, bookGiven, find, authorizeGiven, parse, reconcile, selectDevices, answer
//	none             -
//	management       authorize, parse, reconcile, selectDevices, checkManagement, answer
//	privileged       ownRequest
//	ownRequest       authorize, parse, reconcile, selectDevices, book, answer, release
//	answer           require, build, encode, mpsClient
//
// A step either hands its result to the next, ends the path with an
// answer (a note, or an adjustment that only hides NVIDIA_VISIBLE_DEVICES),
// or fails it with an error that names the request's source; the kind's
// function puts what the steps return in the Result. An error releases
// what the call booked, so a refused container holds nothing. Nothing
// here touches a file: the device source was discovered and prepared
// before.
//
// Every step's work is linear in what it reads and bounded whatever the
// container holds (request.MaxEnvEntries, request.MaxMounts, the bounds
// of package require, maxAnnotations, maxDevices): a request costs well
// under a millisecond, within the runtime's 2 s. Handle checks the
// runtime's context before any work and once more before it answers: once
// the runtime stopped waiting, it does nothing, or releases what it
// booked.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Path is the request path of one node state. It is a plain value: build
// one per request from the current state, or keep one; Handle does not
// modify it.
type Path struct {
	// Source is the node's device source.
	Source adjust.Source
	// Table is who holds which GPUs; Handle books in it.
	Table *alloc.Table
	// Sharing is the node's mode for requests that do not say exclusive=.
	Sharing sharing.Mode
	// Policy says which namespaces may use which request source.
	Policy policy.Policy
	// EmitCDI (emit: cdi) hands GPUs over as CDI device names where the
	// runtime can resolve them; CDINames maps GPU UUIDs to the names the
	// runtime's specs define for them.
	EmitCDI  bool
	CDINames map[string]string
	// RuntimeCDI is set when the runtime resolves CDI devices named in an
	// adjustment (NRI v0.10 and later).
	RuntimeCDI bool
	// Shares is the node's sharing plan (node.State.Shares): which
	// devices the device plugin hands out as replicas, and how; nil
	// without one.
	Shares *sharing.Plan
	// Claims are the node's prepared Dynamic Resource Allocation claims
	// (nil without the DRA driver).
	Claims *claims.Prepared
}

// Result tells what Handle decided, for logging and metrics.
type Result struct {
	Request   request.Request
	Selection request.Selection
	// GPUs are the GPUs the container gets: those named, or those the
	// allocator picked for a count.
	GPUs []inventory.GPU
	// Holding is what the container now holds in the allocation table;
	// nil when it holds no GPU.
	Holding *alloc.Holding
	// Claims are the holdings of the prepared claims whose devices the
	// container uses (a claim holds its devices, not its containers).
	Claims []alloc.Holding
	Edits  adjust.Edits
	// Emit says how the answer hands the devices over: "edits", "cdi",
	// or "edits (<why not cdi>)" when CDI names were wanted; empty
	// without emit: cdi.
	Emit string
	// BinariesAtUsrBin: the container's PATH could not be extended (the
	// runtime shows it twice, see adjust.Edits.BinariesAtUsrBin), so its
	// binaries went to /usr/bin instead of the layout's binary directory.
	BinariesAtUsrBin bool
	// IMEX are the IMEX channels the container gets (their nodes are
	// among Edits.Devices unless the runtime gives them already).
	IMEX []inventory.IMEXChannel
	// Warnings are what the log should hear of that does not refuse the
	// container: a kubelet annotation or claim entry that was not trusted.
	Warnings []string
	// MPS is the MPS share the container is a client of (it holds a GPU
	// shared with MPS: a replica of the sharing plan's, or a claim's);
	// nil otherwise.
	MPS *sharing.Share
}

// Injected reports whether the answer gives the container devices or
// driver files (an answer may also only hide NVIDIA_VISIBLE_DEVICES).
func (r *Result) Injected() bool { return len(r.Edits.Devices) > 0 || len(r.Edits.Mounts) > 0 }

// call is one container's way through the path: what the runtime sent.
type call struct {
	ctx context.Context
	pod *api.PodSandbox
	ctr *api.Container
}

// Handle runs the path for container ctr of pod. A nil adjustment with a
// nil error leaves the container untouched; an error changes nothing (a
// booking made on the way is released). ctx is the runtime's request:
// once it is done (the runtime stopped waiting), Handle does no work, or
// releases what it booked and answers with an error.
func (p *Path) Handle(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, Result, error) {
	c := call{ctx: ctx, pod: pod, ctr: ctr}
	if err := c.live(request.Source{}); err != nil {
		return nil, Result{}, err
	}
	adj, res, err := p.serve(&c)
	if err == nil {
		var added []inventory.DeviceNode
		adj, res.IMEX, added, err = p.imex(&c, adj) // IMEX channels: a request of their own, for every kind (imex.go)
		if len(added) > 0 {
			res.Edits.Devices = append(slices.Clip(res.Edits.Devices), added...)
		}
	}
	if err == nil {
		err = c.live(res.Request.Source) // an answer no one waits for books nothing
	}
	if err != nil {
		p.release(&c, res.Holding)
		res.Holding = nil
		return nil, res, err
	}
	return adj, res, nil
}

// serve decides, once, what kind of container c is, and runs that kind's
// path. What the runtime and the kubelet gave it (classify) decides
// first; then, for a container given none of that, what it carries (the
// carrier of its request, found by key):
//
//   - claimAssigned: prepared Dynamic Resource Allocation claims gave it
//     devices (the runtime applied their CDI devices: the device nodes,
//     and an environment entry per device naming its claim), with any
//     GPU the kubelet or the runtime gave it besides;
//   - kubeletAssigned: nri-gpu's device plugin gave it GPUs through the
//     kubelet (its annotations, backed by the GPUs' device nodes);
//   - runtimeGiven: the runtime gave it GPUs itself (their device nodes,
//     unless it is privileged, or CDI devices of the source's kind);
//   - none: it asks for nothing, and is left untouched;
//   - management: its carrier asks for management.nvidia.com/gpu=all;
//   - privileged: a privileged container with a request of its own;
//   - ownRequest: a request of its own (an annotation, a CDI annotation,
//     the device-list mounts, NVIDIA_VISIBLE_DEVICES).
//
// A new kind is one more case here, and one more function like those
// below.
func (p *Path) serve(c *call) (*api.ContainerAdjustment, Result, error) {
	if err := bounded(c.ctr); err != nil {
		return nil, Result{}, err
	}
	g := p.classify(c.pod, c.ctr)
	switch g.kind() {
	case kindClaims:
		return p.claimAssigned(c, g)
	case kindKubelet:
		return p.kubeletAssigned(c, g)
	case kindRuntime:
		return p.runtimeGiven(c, g)
	}
	f, err := p.find(c)
	switch {
	case err != nil || f.Source.Kind == request.NoSource:
		return nil, Result{Request: request.Request{Source: f.Source}, Warnings: g.warnings}, err
	case f.Management:
		return p.management(c, g, f)
	case g.privileged:
		return p.privileged(c, g, f)
	}
	return p.ownRequest(c, g, f)
}

// claimAssigned is the path of a container whose devices prepared
// Dynamic Resource Allocation claims gave it: the runtime applied the
// claims' CDI devices (device nodes and an environment entry naming each
// device's claim; heldClaims checked them against each other and the
// pod's namespace). Refused when one is no longer the GPU it was
// prepared on (stale). They are its request, booked by claim, once
// whatever containers and pods share the claim, and any GPU the kubelet
// or the runtime gave it besides is booked as in kubeletAssigned and
// runtimeGiven; it gets the driver files of the live inventory, and
// NVIDIA_VISIBLE_DEVICES names them, so that an image's "all" does not
// widen them. The pod's own carriers are not read.
func (p *Path) claimAssigned(c *call, g given) (*api.ContainerAdjustment, Result, error) {
	res := Result{Warnings: g.warnings, GPUs: g.gets()}
	var err error
	if err = p.stale(g); err != nil {
		return nil, res, err
	}
	if res.MPS, err = p.shares(c, g); err != nil {
		return nil, res, err
	}
	if res.Holding, res.Claims, err = p.bookGiven(c, g); err != nil {
		return nil, res, err
	}
	if res.Request, err = p.claimRequest(c, g); err != nil {
		return nil, res, err
	}
	if res.Selection.Note, err = p.reconcile(c, res.Request, g); res.Selection.Note != "" || err != nil {
		return nil, res, err
	}
	if res.Selection, err = p.selectDevices(res.Request); err != nil || !res.Selection.Inject {
		return nil, res, err
	}
	return p.answer(c, g, res, alloc.Record{})
}

// kubeletAssigned is the path of a container whose GPUs nri-gpu's device
// plugin gave it through the kubelet (kubeletAssignment checked them
// against its device nodes). They are its request, booked as the
// kubelet's; the pod's own carriers are not read.
func (p *Path) kubeletAssigned(c *call, g given) (*api.ContainerAdjustment, Result, error) {
	res := Result{Warnings: g.warnings, GPUs: g.gets()}
	var err error
	if res.MPS, err = p.shares(c, g); err != nil {
		return nil, res, err
	}
	if res.Holding, res.Claims, err = p.bookGiven(c, g); err != nil {
		return nil, res, err
	}
	if res.Request, err = p.kubeletRequest(c, g); err != nil {
		return nil, res, err
	}
	if res.Selection.Note, err = p.reconcile(c, res.Request, g); res.Selection.Note != "" || err != nil {
		return nil, res, err
	}
	if res.Selection, err = p.selectDevices(res.Request); err != nil || !res.Selection.Inject {
		return nil, res, err
	}
	return p.answer(c, g, res, alloc.Record{})
}

// runtimeGiven is the path of a container that the runtime gave GPUs
// itself: their device nodes (a device plugin's DeviceSpecs, --device) or
// CDI devices of the source's kind. They are the runtime's choice: booked
// as such and kept exactly, never widened; the container's carrier, when
// it has one, brings their driver files.
func (p *Path) runtimeGiven(c *call, g given) (*api.ContainerAdjustment, Result, error) {
	res := Result{Warnings: g.warnings, GPUs: g.gets()}
	var err error
	if res.MPS, err = p.shares(c, g); err != nil {
		return nil, res, err
	}
	if res.Holding, res.Claims, err = p.bookGiven(c, g); err != nil {
		return nil, res, err
	}
	f, err := p.find(c)
	if res.Request.Source = f.Source; err != nil {
		return nil, res, err
	}
	if f.Source.Kind == request.NoSource {
		res.Selection.Note = givenNote(res.Holding)
		return nil, res, nil
	}
	void, note, err := p.authorizeGiven(c, f, g)
	if void != nil || err != nil {
		res.Selection.Note = note
		return void, res, err
	}
	if res.Request, err = p.parse(f); err != nil || res.Request.Kind == request.Nothing {
		return nil, res, err
	}
	if res.Selection.Note, err = p.reconcile(c, res.Request, g); res.Selection.Note != "" || err != nil {
		return nil, res, err
	}
	if res.Selection, err = p.selectDevices(res.Request); err != nil || !res.Selection.Inject {
		return nil, res, err
	}
	return p.answer(c, g, res, alloc.Record{})
}

// management is the path of a management request
// (management.nvidia.com/gpu=all, in a CDI annotation or the device-list
// mounts): every GPU and every control node, NVIDIA_VISIBLE_DEVICES void.
// It books nothing, but is refused beside an exclusive holder.
func (p *Path) management(c *call, g given, f request.Found) (*api.ContainerAdjustment, Result, error) {
	res := Result{Warnings: g.warnings, Request: request.Request{Source: f.Source}}
	void, note, err := p.authorize(c, f)
	if void != nil || err != nil {
		res.Selection.Note = note
		return void, res, err
	}
	if res.Request, err = p.parse(f); err != nil {
		return nil, res, err
	}
	if res.Selection.Note, err = p.reconcile(c, res.Request, g); res.Selection.Note != "" || err != nil {
		return nil, res, err
	}
	if res.Selection, err = p.selectDevices(res.Request); err != nil || !res.Selection.Inject {
		return nil, res, err
	}
	res.GPUs = res.Selection.GPUs
	rec, err := p.checkManagement(c, res.Request, res.Selection)
	if err != nil {
		return nil, res, err
	}
	return p.answer(c, g, res, rec)
}

// privileged is the path of a privileged container (the runtime gave it
// every host device) with a request of its own: ownRequest's, with
// nothing given by its device nodes, which say nothing of its GPUs
// (classify read none). So its device-list mounts are taken as they are
// (it reaches every device anyway), NVIDIA_VISIBLE_DEVICES names what it
// asked for, and it always gets what is missing of the answer.
func (p *Path) privileged(c *call, g given, f request.Found) (*api.ContainerAdjustment, Result, error) {
	return p.ownRequest(c, g, f)
}

// ownRequest is the path of a container that asks for GPUs itself: an
// annotation, a CDI annotation, the device-list mounts or
// NVIDIA_VISIBLE_DEVICES. Its GPUs are booked for it, and the booking is
// recorded on the container; where the runtime gave it everything
// already, there is nothing to write the record on, and the booking goes
// back.
func (p *Path) ownRequest(c *call, g given, f request.Found) (*api.ContainerAdjustment, Result, error) {
	res := Result{Warnings: g.warnings, Request: request.Request{Source: f.Source}}
	void, note, err := p.authorize(c, f)
	if void != nil || err != nil {
		res.Selection.Note = note
		return void, res, err
	}
	if res.Request, err = p.parse(f); err != nil || res.Request.Kind == request.Nothing {
		return nil, res, err
	}
	if res.Selection.Note, err = p.reconcile(c, res.Request, g); res.Selection.Note != "" || err != nil {
		return nil, res, err
	}
	if res.Selection, err = p.selectDevices(res.Request); err != nil || !res.Selection.Inject {
		return nil, res, err
	}
	var rec alloc.Record
	if res.GPUs, res.Holding, rec, err = p.book(c, res.Request, res.Selection); err != nil {
		return nil, res, err
	}
	adj, res, err := p.answer(c, g, res, rec)
	if adj == nil && err == nil {
		p.release(c, res.Holding)
		res.Holding = nil
	}
	return adj, res, err
}

// live returns an error when the runtime's context is done: the runtime
// no longer waits for the answer. src is the request's source, when known.
func (c *call) live(src request.Source) error {
	err := c.ctx.Err()
	if err == nil {
		return nil
	}
	why := "the runtime cancelled the request"
	if errors.Is(err, context.DeadlineExceeded) {
		why = "the runtime's deadline passed"
	}
	msg := fmt.Sprintf("request abandoned: %s before nri-gpu answered; nothing injected, nothing booked", why)
	if src.Kind != request.NoSource {
		return &request.Error{Source: src, Msg: msg}
	}
	return errors.New("nri-gpu: " + msg)
}

// release gives back h, what the call booked. A pod's holding (a
// pod-level request) is left, not released: other containers of the pod
// may hold it too, and the pod's holding goes with its last member
// (alloc.Table.Leave). A claim's holding (Result.Claims) stays: it goes
// when the claim is unprepared.
func (p *Path) release(c *call, h *alloc.Holding) {
	if h == nil {
		return
	}
	if strings.HasPrefix(h.Holder.ID, alloc.PodHolderPrefix) {
		p.Table.Leave(c.ctr.GetId())
	} else {
		p.Table.Release(h.Holder.ID)
	}
}
