// Package pipeline is nri-gpu's request path: what happens to one
// container between the runtime's CreateContainer event and the plugin's
// answer. A Path holds what the path needs (the node's device source, the
// allocation table, the sharing mode, the policy); Handle runs the stages
// in order, each a method that reads and fills one call:
//
//	hold       the GPUs the runtime gave the container (its device nodes, CDI devices), booked as the runtime's choice
//	find       which source carries the container's request, by key, its value not read (package request)
//	authorize  whether the pod's namespace may use that source (package policy)
//	parse      the request, from the source's value: only an allowed source's is read (package request)
//	reconcile  what the runtime already gave the container: CDI devices, GPU device nodes
//	select     the devices the request names, looked up in the device source
//	book       the GPUs in the allocation table (package alloc), which picks those of a count
//	require    the image's NVIDIA_REQUIRE_* variables against the driver and the GPUs
//	build      the edits for the devices and capabilities, less what the container has
//	encode     the NRI adjustment, with the booking's record as an annotation
//
// A stage either passes the call on, ends it with an answer (a note, or an
// adjustment that only hides NVIDIA_VISIBLE_DEVICES), or fails it with an
// error that names the request's source; an error releases what the call
// booked, so a refused container holds nothing. Nothing here touches a
// file: the device source was discovered and prepared before.
//
// Every stage's work is linear in what it reads and bounded whatever the
// container holds (request.MaxEnvEntries, request.MaxMounts, the bounds
// of package require, maxAnnotations, maxDevices): a request costs well
// under a millisecond, within the runtime's 2 s. Handle also stops
// between stages once the runtime's context is done.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/policy"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/require"
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
	Sharing alloc.Mode
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
	Edits   adjust.Edits
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
}

// Injected reports whether the answer gives the container devices or
// driver files (an answer may also only hide NVIDIA_VISIBLE_DEVICES).
func (r *Result) Injected() bool { return len(r.Edits.Devices) > 0 || len(r.Edits.Mounts) > 0 }

// call is one container's way through the path.
type call struct {
	ctx context.Context
	pod *api.PodSandbox
	ctr *api.Container
	res Result
	// found is the request's carrier (find), parsed once authorized.
	found request.Found
	// given are the inventory's GPUs whose nodes the runtime gave the
	// container already (reconcile).
	given []inventory.GPU
	// privileged is set for a container that the runtime gave every
	// host device (privileged): its device nodes say nothing of its GPUs.
	privileged bool
	// runtimeBooked is set when the hold stage booked the GPUs the
	// runtime gave the container: the runtime decided them.
	runtimeBooked bool
	// kubelet are the GPUs of the kubelet's assignment, checked against
	// the container's device nodes (kubeletAssignment); the hold stage
	// booked them, and they are the container's request.
	kubelet []inventory.GPU
	// joined is set when the container joined its pod's holding (a
	// pod-level request that an earlier container of the pod booked):
	// the holding is the pod's, and the call does not release it.
	joined bool
	// rec is the booking's record, for the container's annotation.
	rec alloc.Record
	// adj is the answer; done ends the path with it.
	adj  *api.ContainerAdjustment
	done bool
}

// Handle runs the path for container ctr of pod. A nil adjustment with a
// nil error leaves the container untouched; an error changes nothing (a
// booking made on the way is released). ctx is the runtime's request: once
// it is done (the runtime stopped waiting), Handle stops at the next stage
// with an error, and releases what it booked.
func (p *Path) Handle(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, Result, error) {
	c := call{ctx: ctx, pod: pod, ctr: ctr}
	err := p.run(&c)
	if err == nil {
		err = p.imex(&c) // IMEX channels: a request of their own (imex.go)
	}
	if err != nil {
		p.release(&c)
		return nil, c.res, err
	}
	return c.adj, c.res, nil
}

// Stages of the path, in order.
const (
	stageHold = iota
	stageFind
	stageAuthorize
	stageParse
	stageReconcile
	stageSelect
	stageBook
	stageRequire
	stageBuild
	stageEncode
	stages
)

// run runs the stages in order, until one fails or ends the call, and
// stops when the runtime no longer waits for the answer.
func (p *Path) run(c *call) error {
	for s := 0; s < stages; s++ {
		if err := p.live(c); err != nil {
			return err
		}
		if err := p.stage(s, c); err != nil || c.done {
			return err
		}
	}
	return nil
}

// stage runs stage s. (A switch of direct calls rather than a table of
// functions: the call then stays on the stack.)
func (p *Path) stage(s int, c *call) error {
	switch s {
	case stageHold:
		return p.hold(c)
	case stageFind:
		return p.find(c)
	case stageAuthorize:
		return p.authorize(c)
	case stageParse:
		return p.parse(c)
	case stageReconcile:
		return p.reconcile(c)
	case stageSelect:
		return p.selectDevices(c)
	case stageBook:
		return p.book(c)
	case stageRequire:
		return p.require(c)
	case stageBuild:
		return p.build(c)
	default:
		return p.encode(c)
	}
}

// live returns an error when the runtime's context is done.
func (p *Path) live(c *call) error {
	if err := c.ctx.Err(); err != nil {
		return p.abandoned(c, err)
	}
	return nil
}

// abandoned is the error of a call whose context is done: the runtime no
// longer waits for the answer.
func (p *Path) abandoned(c *call, err error) error {
	why := "the runtime cancelled the request"
	if errors.Is(err, context.DeadlineExceeded) {
		why = "the runtime's deadline passed"
	}
	msg := fmt.Sprintf("request abandoned: %s before nri-gpu answered; nothing injected, nothing booked", why)
	if c.found.Source.Kind == request.NoSource {
		return errors.New("nri-gpu: " + msg)
	}
	return &request.Error{Source: c.found.Source, Msg: msg}
}

// release gives back what the call booked; a pod's holding that the call
// joined stays, since other containers of the pod hold it.
func (p *Path) release(c *call) {
	if c.res.Holding != nil {
		if c.joined {
			p.Table.Leave(c.ctr.GetId())
		} else {
			p.Table.Release(c.res.Holding.Holder.ID)
		}
		c.res.Holding = nil
	}
}

// runtimeSource names the runtime's own devices in the table's refusals.
const runtimeSource = "the GPUs the runtime gave the container (device plugin, --device or CDI)"

// hold books the GPUs the runtime itself gave the container, before its
// request is looked at: their device nodes (a device plugin's DeviceSpecs,
// --device) and CDI devices of the source's kind. They are the runtime's
// (the kubelet's) choice: the container keeps exactly those, and they are
// booked in the node's sharing mode and marked as the runtime's
// (alloc.Holding.Runtime), so that no count request hands them out again,
// on a shared node either. A conflict with an exclusive holding refuses the container,
// naming the holder, as for any request. A privileged container (one the
// runtime gave every host device, see privileged) has no GPU from its
// device nodes; a container without any books nothing. The booking is
// rebuilt at Synchronize the same way (Holdings), without a record.
func (p *Path) hold(c *call) error {
	c.privileged = privileged(c.ctr)
	if n := len(c.ctr.GetLinux().GetDevices()); n > maxDevices {
		return fmt.Errorf("nri-gpu: container devices: %d device nodes (at most %d)", n, maxDevices)
	}
	if n := len(c.ctr.GetCDIDevices()); n > maxCDINames {
		return fmt.Errorf("nri-gpu: the runtime's CDI devices: the container has more than %d CDI devices", maxCDINames)
	}
	h := HolderOf(c.pod, c.ctr)
	kub, warn := kubeletAssignment(p.Source.Devices(), c.ctr, c.privileged)
	if warn != "" {
		c.res.Warnings = append(c.res.Warnings, warn)
	}
	var idx []int
	source := runtimeSource
	if kub != nil {
		for _, g := range kub {
			idx = append(idx, g.Index)
		}
		source = kubeletSource.String()
	} else {
		idx, _ = foreignGPUs(p.Source, c.ctr, c.privileged, h, nil)
	}
	if len(idx) == 0 {
		return nil
	}
	got, err := p.Table.Allocate(alloc.Request{Holder: h, Mode: p.Sharing, GPUs: idx, Source: source, Kubelet: kub != nil, Runtime: true})
	if err != nil {
		return err
	}
	c.res.Holding = &alloc.Holding{Holder: h, Mode: p.Sharing, GPUs: got, Kubelet: kub != nil, Runtime: true}
	c.runtimeBooked = true
	c.kubelet = kub
	return nil
}

// kubeletSource is the source of the kubelet's assignments.
var kubeletSource = request.Source{Kind: request.Kubelet, Key: alloc.KubeletAnnotation}

// find finds the carrier of the container's request, by key, without
// reading its value; a container without one is left untouched.
func (p *Path) find(c *call) error {
	err := request.CheckMounts(len(c.ctr.GetMounts()))
	if err != nil {
		return err
	}
	if c.kubelet != nil {
		// The kubelet decided the container's GPUs: they are its
		// request, and the pod's own carriers are not read.
		c.res.Request, err = request.KubeletRequest(alloc.KubeletAnnotation, uuids(c.kubelet), c.ctr.GetEnv())
		return err
	}
	c.found, err = request.Find(requestInput(c))
	c.res.Request.Source = c.found.Source
	c.done = err == nil && c.found.Source.Kind == request.NoSource
	if c.done && c.runtimeBooked {
		c.res.Selection.Note = fmt.Sprintf("the runtime gives the container GPUs %s: booked (%s) as the runtime's choice", indices(c.res.Holding.GPUs), c.res.Holding.Mode)
	}
	return err
}

// authorize checks that the pod's namespace may use the request's source,
// before its value is read. A denied NVIDIA_VISIBLE_DEVICES is ignored,
// and set to void so that no other injector (the NVIDIA runtime, a CDI
// hook) honours it; any other denied source refuses the container.
//
// NVIDIA_VISIBLE_DEVICES and the device plugin's mount list are also
// what a device plugin (NVIDIA's, DEVICE_LIST_STRATEGY envvar or
// volume-mounts) hands the kubelet: where the runtime gave the container
// GPU device nodes as well (its PASS_DEVICE_SPECS=true), which a pod
// cannot add to its spec, the nodes decide its GPUs (hold booked them,
// reconcile keeps exactly them) and the variable or list is not a request
// of the pod's author: it is served, whatever the policy, with the driver
// files of those GPUs only.
func (p *Path) authorize(c *call) error {
	if c.kubelet != nil {
		return nil
	}
	src := c.found.PolicySource()
	if (src == policy.Env || src == policy.DeviceList) && c.runtimeBooked && !c.privileged && len(c.ctr.GetLinux().GetDevices()) > 0 {
		if given, err := runtimeGPUs(p.Source.Devices(), c.ctr); err == nil && len(given) > 0 {
			return nil
		}
	}
	return p.allow(c, src, c.found.Source)
}

func (p *Path) allow(c *call, src policy.Source, from request.Source) error {
	ns := c.pod.GetNamespace()
	if p.Policy.Allows(src, ns) {
		return nil
	}
	if src == policy.Env {
		c.res.Selection.Note = fmt.Sprintf("%s ignored: not allowed in namespace %q (%s); set to void", from, ns, p.Policy.Setting(src))
		c.adj = &api.ContainerAdjustment{}
		c.adj.AddEnv(adjust.EnvVisibleDevices, "void")
		c.done = true
		return nil
	}
	return &request.Error{Source: from, Msg: fmt.Sprintf("not allowed in namespace %q (%s)", ns, p.Policy.Setting(src))}
}

// parse parses the allowed source's value into the request. Where the
// request's class differs from the one find saw (a CDI list that find took
// for a management request, or the reverse), it is authorized again.
func (p *Path) parse(c *call) error {
	if c.kubelet != nil {
		return nil
	}
	var err error
	c.res.Request, err = c.found.Parse()
	if err != nil {
		return err
	}
	r := &c.res.Request
	c.done = r.Kind == request.Nothing
	if !c.done && r.PolicySource() != c.found.PolicySource() {
		return p.allow(c, r.PolicySource(), r.Source)
	}
	return nil
}

// reconcile looks at what the runtime already gives the container. CDI
// devices of NVIDIA's kinds are the runtime's answer: nothing is added.
// GPU device nodes (a device plugin's --device, a runtime class) decide
// the container's GPUs: they are kept (hold booked them), and no other
// GPU is added.
func (p *Path) reconcile(c *call) error {
	cdi, err := runtimeCDIDevices(c.ctr)
	if err != nil {
		return err
	}
	if len(cdi) > 0 {
		c.res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container the CDI devices %s: nothing injected", c.res.Request.Source, strings.Join(cdi, ", "))
		c.done = true
		return nil
	}
	if !c.privileged {
		if c.given, err = runtimeGPUs(p.Source.Devices(), c.ctr); err != nil {
			return err
		}
	}
	return p.deviceListBacked(c)
}

// deviceListBacked refuses a device plugin's mount list that the policy
// does not trust on its own in the pod's namespace (policy.TrustsDeviceList)
// unless the runtime gave the container GPU device nodes: a pod allowed
// hostPath volumes can mount /dev/null at
// /var/run/nvidia-container-devices/<ID> itself, but cannot add device
// nodes to its spec. With the nodes, they decide the container's GPUs
// (book), whatever the list names. A privileged container's list is taken
// as it is: it reaches every device of the node anyway.
func (p *Path) deviceListBacked(c *call) error {
	r := &c.res.Request
	ns := c.pod.GetNamespace()
	if r.PolicySource() != policy.DeviceList || len(c.given) > 0 || c.privileged || p.Policy.TrustsDeviceList(ns) {
		return nil
	}
	return &request.Error{Source: r.Source, Msg: fmt.Sprintf("not allowed in namespace %q without the GPUs' device nodes from the runtime "+
		"(%s; the NVIDIA device plugin passes them with PASS_DEVICE_SPECS=true)", ns, p.Policy.Setting(policy.DeviceList))}
}

// selectDevices resolves the request against the device source.
func (p *Path) selectDevices(c *call) error {
	var err error
	c.res.Selection, err = request.Select(c.res.Request, p.Source)
	c.done = err == nil && !c.res.Selection.Inject
	c.res.GPUs = c.res.Selection.GPUs
	return err
}

// book decides the container's GPUs and books them: the runtime's own
// when it gave some (booked by hold: the runtime decided), none for a
// management container (it sees every GPU and holds none, but is refused
// while another container holds one of them exclusively), else those
// named or, for a count, those the table picks. A pod-level request
// (gpus.nri-gpu.dev/pod: a count or named GPUs) is the pod's: booked once,
// by its first container, for the pod (alloc.PodHolder), and every later
// container of the pod joins that holding and gets its GPUs, so that an
// exclusive pod-level request does not refuse the pod's own sidecar.
func (p *Path) book(c *call) error {
	r, sel := &c.res.Request, &c.res.Selection
	switch {
	case c.runtimeBooked:
		c.res.GPUs = c.given
		if len(c.given) == 0 {
			c.res.GPUs = byIndex(p.Source.Devices(), c.res.Holding.GPUs)
		}
		return nil
	case r.Management:
		return p.checkManagement(c)
	case sel.Count == 0 && len(sel.GPUs) == 0:
		return nil
	}
	mode := p.Sharing
	if x := r.Exclusive; x != nil {
		mode = alloc.Shared
		if *x {
			mode = alloc.Exclusive
		}
	}
	req := alloc.Request{Holder: HolderOf(c.pod, c.ctr), Mode: mode, Count: sel.Count, Source: r.Source.String(),
		GPUs: make([]int, 0, len(sel.GPUs))}
	for _, g := range sel.GPUs {
		req.GPUs = append(req.GPUs, g.Index)
	}
	podLevel := r.Source.Kind == request.PodAnnotation
	var got []int
	var err error
	if podLevel {
		req.Member = req.Holder.ID
		req.Holder = alloc.PodHolder(req.Holder.PodID, req.Holder.Namespace, req.Holder.Pod)
		var h alloc.Holding
		h, c.joined, err = p.Table.Join(req)
		got, mode = h.GPUs, h.Mode
	} else {
		got, err = p.Table.Allocate(req)
	}
	if err != nil {
		return err
	}
	if sel.Count > 0 {
		// Named GPUs keep the order the user gave; picked ones come in
		// index order.
		c.res.GPUs = byIndex(p.Source.Devices(), got)
	}
	c.res.Holding = &alloc.Holding{Holder: req.Holder, Mode: mode, GPUs: got}
	c.rec.Mode = c.res.Holding.Mode.String()
	c.rec.Pod = podLevel
	c.rec.GPUs = make([]string, 0, len(c.res.GPUs))
	for _, g := range c.res.GPUs {
		c.rec.GPUs = append(c.rec.GPUs, g.ID())
	}
	return nil
}

// checkManagement refuses a management container where it would reach a
// GPU that another container holds exclusively. It books nothing: a
// monitoring agent that held every GPU shared would keep every exclusive
// request off the node. (A management container that is already running
// when an exclusive holder comes keeps its view: management namespaces
// are the operator's, policy.managementNamespaces.)
func (p *Path) checkManagement(c *call) error {
	req := alloc.Request{Holder: HolderOf(c.pod, c.ctr), Mode: alloc.Shared, Source: c.res.Request.Source.String(),
		GPUs: make([]int, 0, len(c.res.Selection.GPUs))}
	for _, g := range c.res.Selection.GPUs {
		req.GPUs = append(req.GPUs, g.Index)
	}
	return p.Table.Check(req)
}

// require checks the requirements the image states (NVIDIA_REQUIRE_*)
// against the node and the GPUs the container gets, once they are known:
// after booking, so that a count's picks are checked too. A requirement
// that does not hold refuses the container, and the booking is released.
func (p *Path) require(c *call) error {
	err := p.Source.Check(c.ctr.GetEnv(), c.res.GPUs)
	if err == nil {
		return nil
	}
	var re *require.Error
	if errors.As(err, &re) {
		return &request.Error{Source: request.Source{Kind: request.Env, Key: re.Variable}, Msg: re.Msg}
	}
	return err
}

// build makes the edits: the device source's for the GPUs and
// capabilities, every control node for a management container, less what
// the runtime already gives the container.
func (p *Path) build(c *call) error {
	r := &c.res.Request
	e := p.Source.Edits(c.res.GPUs, c.res.Selection.Caps)
	if r.Management {
		addNodes(&e, p.Source.Control())
		e.VisibleDevices = "void"
	}
	mig, err := p.migManagement(c)
	if err != nil {
		return err
	}
	addNodes(&e, mig)
	have, n := dropExisting(&e, p.Source.Devices(), c.ctr, c.privileged)
	c.res.Edits = e
	if have == "" {
		return nil
	}
	if len(e.Devices) == 0 && len(e.Mounts) == 0 && !c.privileged {
		// Nothing to write the booking's record on: a booking of this
		// call's own goes back (the runtime's stays, rebuilt without
		// a record; a pod's stays with the pod).
		if !c.runtimeBooked {
			p.release(c)
		}
		c.res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container %s and every driver file: nothing injected", r.Source, have)
		c.done = true
		return nil
	}
	what := "the missing control nodes and driver files"
	if n == 0 {
		what = "the missing device nodes and driver files"
	}
	c.res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container %s: injected only %s (%d device nodes, %d mounts)", r.Source, have, what, len(e.Devices), len(e.Mounts))
	return nil
}

// encode turns the edits into the NRI adjustment, appending to the
// container's own LD_LIBRARY_PATH and PATH, and records the booking in the
// container's annotation alloc.Annotation, from which the table is
// rebuilt after a restart. With emit: cdi, GPUs that the runtime's specs
// define go as CDI device names instead, when the runtime resolves them.
func (p *Path) encode(c *call) error {
	c.adj = c.res.Edits.Adjustment(c.ctr.GetEnv())
	c.res.BinariesAtUsrBin = c.res.Edits.BinariesAtUsrBin(c.ctr.GetEnv())
	if p.EmitCDI && !c.res.Request.Management && c.res.Selection.Note == "" {
		// Management containers get control nodes that no GPU's CDI
		// device carries, and a container that has some of its devices
		// from the runtime gets only the missing ones: always edits.
		c.adj, c.res.Emit = p.emitCDI(c)
	}
	if c.res.Holding != nil && !c.runtimeBooked {
		c.adj.AddAnnotation(alloc.Annotation, c.rec.Encode())
	}
	return nil
}

// emitCDI returns the CDI form of the answer when the runtime can resolve
// it and its specs define every GPU of the container; otherwise the
// edits, with the reason.
func (p *Path) emitCDI(c *call) (*api.ContainerAdjustment, string) {
	if !p.RuntimeCDI {
		return c.adj, "edits (the runtime's NRI does not inject CDI devices)"
	}
	if len(c.res.GPUs) == 0 {
		return c.adj, "edits (no GPU to name)"
	}
	if why := migManagementNodes(p.Source.Snapshot().MIGControl, c.res.Edits.Devices); why != "" {
		return c.adj, "edits (" + why + ")"
	}
	names := make([]string, 0, len(c.res.GPUs))
	for _, g := range c.res.GPUs {
		n, ok := p.CDINames[g.UUID]
		if !ok {
			return c.adj, "edits (no CDI spec defines " + inventory.KindNVIDIA + "=" + g.UUID + ")"
		}
		names = append(names, n)
	}
	return adjust.CDIAdjustment(names, c.res.Edits.VisibleDevices), "cdi"
}

// indices writes GPU indices as "0, 2".
func indices(idx []int) string {
	s := make([]string, len(idx))
	for i, g := range idx {
		s[i] = inventory.UnitLabel(g)
	}
	return strings.Join(s, ", ")
}

// byIndex returns the devices of the given indices, in that order.
func byIndex(devs []inventory.GPU, idx []int) []inventory.GPU {
	out := make([]inventory.GPU, 0, len(idx))
	for _, i := range idx {
		for _, g := range devs {
			if g.Index == i {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// mounts returns the container's mounts that may be the device plugin's
// device list, as the request package sees them: only those whose
// destination names its directory (request.DeviceListName), so that a
// container's other mounts cost no copy.
func mounts(ctr *api.Container) []inventory.Mount {
	n := 0
	for _, m := range ctr.GetMounts() {
		if strings.Contains(m.GetDestination(), request.DeviceListName) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]inventory.Mount, 0, n)
	for _, m := range ctr.GetMounts() {
		if strings.Contains(m.GetDestination(), request.DeviceListName) {
			out = append(out, inventory.Mount{Source: m.GetSource(), Destination: m.GetDestination()})
		}
	}
	return out
}
