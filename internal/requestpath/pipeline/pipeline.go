// Package pipeline is nri-gpu's request path: what happens to one
// container between the runtime's CreateContainer event and the plugin's
// answer. A Path holds what the path needs (the node's device source, the
// allocation table, the sharing mode, the policy, the prepared Dynamic
// Resource Allocation claims). Handle decides once what
// kind of container it has (serve), from what the runtime gave the
// container and what it carries, and runs that kind's path: one function
// that reads top to bottom as named steps, each a method of Path. Then
// every kind's answer gets the IMEX channels the container asks for
// (imex), a request of its own.
//
// The kinds, in the order serve tries them, and each kind's steps
// (docs/kinds_test.go checks this block against the code):
//
// <!-- request path kinds: serve's order; each kind's steps -->
//
//	kubeletAssigned  replicas, bookGiven, kubeletRequest, reconcile, selectDevices, keepGiven, require, build, encode, mpsClient
//	claimAssigned    claimMPS, bookClaims, claimRequest, reconcile, selectDevices, keepClaimed, require, build, encode, mpsClient
//	runtimeGiven     bookGiven, find, authorizeGiven, parse, reconcile, selectDevices, keepGiven, require, build, encode
//	none             -
//	management       authorize, parse, reconcile, selectDevices, checkManagement, require, build, encode
//	privileged       ownRequest
//	ownRequest       authorize, parse, reconcile, selectDevices, book, require, build, release, encode
//
// A step either hands its result to the next, ends the path with an
// answer (a note, or an adjustment that only hides NVIDIA_VISIBLE_DEVICES),
// or fails it with an error that names the request's source; an error
// releases what the call booked, so a refused container holds nothing.
// Nothing here touches a file: the device source was discovered and
// prepared before.
//
// Every step's work is linear in what it reads and bounded whatever the
// container holds (request.MaxEnvEntries, request.MaxMounts, the bounds
// of package require, maxAnnotations, maxDevices): a request costs well
// under a millisecond, within the runtime's 2 s. Each step that does work
// first checks the runtime's context, and the path stops there once it is
// done (the runtime stopped waiting).
package pipeline

import (
	"context"
	"errors"
	"fmt"
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

// Result tells what Handle decided, for logging, metrics, the pod's
// Events and nri-gpu explain.
type Result struct {
	// Kind is the kind of container serve decided (kubeletAssigned,
	// claimAssigned, runtimeGiven, none, management, privileged,
	// ownRequest); empty when the path failed before deciding.
	Kind      string
	Request   request.Request
	Selection request.Selection
	// Voided is set when the policy refused the container's
	// NVIDIA_VISIBLE_DEVICES and the answer only sets it to void
	// (authorize); Selection.Note says why.
	Voided bool
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
	// container: a kubelet annotation that was not trusted.
	Warnings []string
	// MPS is the MPS share the container is a client of (the kubelet gave
	// it a replica of a GPU shared with MPS); nil otherwise.
	MPS *sharing.Share
}

// Injected reports whether the answer gives the container devices or
// driver files (an answer may also only hide NVIDIA_VISIBLE_DEVICES).
func (r *Result) Injected() bool { return len(r.Edits.Devices) > 0 || len(r.Edits.Mounts) > 0 }

// call is one container's way through the path: what the runtime sent,
// and the Result, which the steps fill as they decide.
type call struct {
	ctx context.Context
	pod *api.PodSandbox
	ctr *api.Container
	res Result
	// replicated is set when every device of the kubelet's assignment is
	// shared as the device plugin's replicas (replicas): booked shared.
	replicated bool
}

// given is what the runtime put in the container before nri-gpu saw it,
// read once, when the container is classified (serve).
type given struct {
	// every is set for a privileged container: the runtime gave it every
	// host device (isPrivileged), so its device nodes say nothing of its
	// GPUs.
	every bool
	// gpus are the devices whose nodes the container has from the
	// runtime, in index order (runtimeGPUs); none when every is set.
	gpus []inventory.GPU
}

// Handle runs the path for container ctr of pod. A nil adjustment with a
// nil error leaves the container untouched; an error changes nothing (a
// booking made on the way is released). ctx is the runtime's request: once
// it is done (the runtime stopped waiting), Handle stops at the next step
// with an error, and releases what it booked.
func (p *Path) Handle(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, Result, error) {
	c := call{ctx: ctx, pod: pod, ctr: ctr}
	adj, err := p.serve(&c)
	if err == nil {
		adj, err = p.imex(&c, adj) // IMEX channels: a request of their own, for every kind (imex.go)
	}
	if err != nil {
		p.release(&c)
		return nil, c.res, err
	}
	return adj, c.res, nil
}

// serve decides, once, what kind of container c is, and runs that kind's
// path. The kinds, in the order they are tried:
//
//   - kubeletAssigned: nri-gpu's device plugin gave it GPUs through the
//     kubelet (its annotations, backed by the GPUs' device nodes);
//   - claimAssigned: prepared Dynamic Resource Allocation claims gave it
//     devices (the runtime applied their CDI devices: the device nodes,
//     and an environment entry per device naming its claim);
//   - runtimeGiven: the runtime gave it GPUs itself (their device nodes,
//     unless it is privileged, or CDI devices of the source's kind);
//   - none: it asks for nothing, and is left untouched;
//   - management: its carrier asks for management.nvidia.com/gpu=all;
//   - privileged: a privileged container with a request of its own;
//   - ownRequest: a request of its own (an annotation, a CDI annotation,
//     the device-list mounts, NVIDIA_VISIBLE_DEVICES).
//
// A new kind is one more case here, where its precedence puts it, and one
// more function like those below.
func (p *Path) serve(c *call) (*api.ContainerAdjustment, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	gv, err := p.given(c)
	if err != nil {
		return nil, err
	}
	if kub := p.kubelet(c, gv); kub != nil {
		c.res.Kind = "kubeletAssigned"
		return p.kubeletAssigned(c, gv, kub)
	}
	if held := p.claimedDevices(c); len(held) > 0 {
		c.res.Kind = "claimAssigned"
		return p.claimAssigned(c, gv, held)
	}
	if idx, _ := foreignGPUs(p.Source, c.ctr, gv.every, HolderOf(c.pod, c.ctr), nil); len(idx) > 0 {
		c.res.Kind = "runtimeGiven"
		return p.runtimeGiven(c, gv, idx)
	}
	f, err := p.find(c)
	if err == nil {
		c.res.Kind = ownKind(f, gv)
	}
	switch {
	case err != nil || f.Source.Kind == request.NoSource:
		return nil, err
	case f.Management:
		return p.management(c, gv, f)
	case gv.every:
		return p.privileged(c, f)
	}
	return p.ownRequest(c, gv, f)
}

// ownKind names the kind serve gives a container that neither the
// kubelet, claims nor the runtime gave GPUs, in serve's order.
func ownKind(f request.Found, gv given) string {
	switch {
	case f.Source.Kind == request.NoSource:
		return "none"
	case f.Management:
		return "management"
	case gv.every:
		return "privileged"
	}
	return "ownRequest"
}

// kubeletAssigned is the path of a container whose GPUs nri-gpu's device
// plugin gave it through the kubelet (kubeletAssignment checked them
// against its device nodes). They are its request, booked as the
// kubelet's; the pod's own carriers are not read.
func (p *Path) kubeletAssigned(c *call, gv given, kub []inventory.GPU) (*api.ContainerAdjustment, error) {
	mps, err := p.replicas(c, kub)
	if err != nil {
		return nil, err
	}
	if err := p.bookGiven(c, indexes(kub), true); err != nil {
		return nil, err
	}
	r, err := p.kubeletRequest(c, kub)
	if err != nil {
		return nil, err
	}
	if end, err := p.reconcile(c, r, gv); end || err != nil {
		return nil, err
	}
	sel, err := p.selectDevices(c, r)
	if err != nil || !sel.Inject {
		return nil, err
	}
	gpus := p.keepGiven(c, gv)
	if err := p.require(c, gpus); err != nil {
		return nil, err
	}
	e, end, err := p.build(c, r, sel.Caps, gpus, gv)
	if err != nil || end && mps == nil {
		return nil, err
	}
	var adj *api.ContainerAdjustment
	if !end {
		if adj, err = p.encode(c, r, e, nil); err != nil {
			return nil, err
		}
	}
	return p.mpsClient(c, adj, mps)
}

// claimAssigned is the path of a container whose devices prepared
// Dynamic Resource Allocation claims gave it: the runtime applied the
// claims' CDI devices (device nodes and an environment entry naming each
// device's claim; claimedDevices checked them against each other). They
// are its request, booked by claim, once whatever containers and pods
// share the claim; it gets the driver files of the live inventory, and
// NVIDIA_VISIBLE_DEVICES names them, so that an image's "all" does not
// widen them. The pod's own carriers are not read.
func (p *Path) claimAssigned(c *call, gv given, held []claimed) (*api.ContainerAdjustment, error) {
	mps, err := p.claimMPS(c, gv, held)
	if err != nil {
		return nil, err
	}
	if err := p.bookClaims(c, gv, held); err != nil {
		return nil, err
	}
	r, err := p.claimRequest(c, held)
	if err != nil {
		return nil, err
	}
	if end, err := p.reconcile(c, r, gv); end || err != nil {
		return nil, err
	}
	sel, err := p.selectDevices(c, r)
	if err != nil || !sel.Inject {
		return nil, err
	}
	gpus := p.keepClaimed(c, gv, held)
	if err := p.require(c, gpus); err != nil {
		return nil, err
	}
	e, end, err := p.build(c, r, sel.Caps, gpus, gv)
	if err != nil || end && mps == nil {
		return nil, err
	}
	var adj *api.ContainerAdjustment
	if !end {
		if adj, err = p.encode(c, r, e, nil); err != nil {
			return nil, err
		}
	}
	return p.mpsClient(c, adj, mps)
}

// runtimeGiven is the path of a container that the runtime gave GPUs
// itself: their device nodes (a device plugin's DeviceSpecs, --device) or
// CDI devices of the source's kind. They are the runtime's choice: booked
// as such and kept exactly, never widened; the container's carrier, when
// it has one, brings their driver files.
func (p *Path) runtimeGiven(c *call, gv given, idx []int) (*api.ContainerAdjustment, error) {
	if err := p.bookGiven(c, idx, false); err != nil {
		return nil, err
	}
	f, err := p.find(c)
	if err != nil {
		return nil, err
	}
	if f.Source.Kind == request.NoSource {
		c.res.Selection.Note = givenNote(c.res.Holding)
		return nil, nil
	}
	if void, err := p.authorizeGiven(c, f, gv); void != nil || err != nil {
		return void, err
	}
	r, err := p.parse(c, f)
	if err != nil || r.Kind == request.Nothing {
		return nil, err
	}
	if end, err := p.reconcile(c, r, gv); end || err != nil {
		return nil, err
	}
	sel, err := p.selectDevices(c, r)
	if err != nil || !sel.Inject {
		return nil, err
	}
	gpus := p.keepGiven(c, gv)
	if err := p.require(c, gpus); err != nil {
		return nil, err
	}
	e, end, err := p.build(c, r, sel.Caps, gpus, gv)
	if end || err != nil {
		return nil, err
	}
	return p.encode(c, r, e, nil)
}

// management is the path of a management request
// (management.nvidia.com/gpu=all, in a CDI annotation or the device-list
// mounts): every GPU and every control node, NVIDIA_VISIBLE_DEVICES void.
// It books nothing, but is refused beside an exclusive holder.
func (p *Path) management(c *call, gv given, f request.Found) (*api.ContainerAdjustment, error) {
	if void, err := p.authorize(c, f); void != nil || err != nil {
		return void, err
	}
	r, err := p.parse(c, f)
	if err != nil {
		return nil, err
	}
	if end, err := p.reconcile(c, r, gv); end || err != nil {
		return nil, err
	}
	sel, err := p.selectDevices(c, r)
	if err != nil || !sel.Inject {
		return nil, err
	}
	if err := p.checkManagement(c, r, sel); err != nil {
		return nil, err
	}
	if err := p.require(c, sel.GPUs); err != nil {
		return nil, err
	}
	e, end, err := p.build(c, r, sel.Caps, sel.GPUs, gv)
	if end || err != nil {
		return nil, err
	}
	return p.encode(c, r, e, nil)
}

// privileged is the path of a privileged container (the runtime gave it
// every host device) with a request of its own: ownRequest's, with
// nothing given by its device nodes, which say nothing of its GPUs. So
// its device-list mounts are taken as they are (it reaches every device
// anyway), NVIDIA_VISIBLE_DEVICES names what it asked for, and it always
// gets what is missing of the answer.
func (p *Path) privileged(c *call, f request.Found) (*api.ContainerAdjustment, error) {
	return p.ownRequest(c, given{every: true}, f)
}

// ownRequest is the path of a container that asks for GPUs itself: an
// annotation, a CDI annotation, the device-list mounts or
// NVIDIA_VISIBLE_DEVICES. Its GPUs are booked for it, and the booking is
// recorded on the container.
func (p *Path) ownRequest(c *call, gv given, f request.Found) (*api.ContainerAdjustment, error) {
	if void, err := p.authorize(c, f); void != nil || err != nil {
		return void, err
	}
	r, err := p.parse(c, f)
	if err != nil || r.Kind == request.Nothing {
		return nil, err
	}
	if end, err := p.reconcile(c, r, gv); end || err != nil {
		return nil, err
	}
	sel, err := p.selectDevices(c, r)
	if err != nil || !sel.Inject {
		return nil, err
	}
	gpus, rec, err := p.book(c, r, sel)
	if err != nil {
		return nil, err
	}
	if err := p.require(c, gpus); err != nil {
		return nil, err
	}
	e, end, err := p.build(c, r, sel.Caps, gpus, gv)
	if end {
		p.release(c) // nothing to write the record on: the booking goes back
	}
	if end || err != nil {
		return nil, err
	}
	return p.encode(c, r, e, &rec)
}

// live returns an error when the runtime's context is done: the runtime
// no longer waits for the answer.
func (c *call) live() error {
	err := c.ctx.Err()
	if err == nil {
		return nil
	}
	why := "the runtime cancelled the request"
	if errors.Is(err, context.DeadlineExceeded) {
		why = "the runtime's deadline passed"
	}
	msg := fmt.Sprintf("request abandoned: %s before nri-gpu answered; nothing injected, nothing booked", why)
	if src := c.res.Request.Source; src.Kind != request.NoSource {
		return &request.Error{Source: src, Msg: msg}
	}
	return errors.New("nri-gpu: " + msg)
}

// release gives back what the call booked. A pod's holding (a pod-level
// request) is left, not released: other containers of the pod may hold it
// too, and the pod's holding goes with its last member (alloc.Table.Leave).
// A claim's holding (Result.Claims) stays: it goes when the claim is
// unprepared.
func (p *Path) release(c *call) {
	h := c.res.Holding
	if h == nil {
		return
	}
	if strings.HasPrefix(h.Holder.ID, alloc.PodHolderPrefix) {
		p.Table.Leave(c.ctr.GetId())
	} else {
		p.Table.Release(h.Holder.ID)
	}
	c.res.Holding = nil
}
