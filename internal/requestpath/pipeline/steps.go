package pipeline

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/require"
)

// The steps of the kinds' paths (pipeline.go), in the order the paths run
// them. Each reads what it is given and returns what the next needs; what
// the log and metrics need it records in the call's Result.

// given reads what the runtime put in the container, within its bounds:
// whether the container is privileged, and the GPUs whose device nodes it
// has.
func (p *Path) given(c *call) (given, error) {
	if n := len(c.ctr.GetLinux().GetDevices()); n > maxDevices {
		return given{}, fmt.Errorf("nri-gpu: container devices: %d device nodes (at most %d)", n, maxDevices)
	}
	if n := len(c.ctr.GetCDIDevices()); n > maxCDINames {
		return given{}, fmt.Errorf("nri-gpu: the runtime's CDI devices: the container has more than %d CDI devices", maxCDINames)
	}
	if isPrivileged(c.ctr) {
		return given{every: true}, nil
	}
	gpus, err := runtimeGPUs(p.Source.Devices(), c.ctr)
	return given{gpus: gpus}, err
}

// kubelet returns the GPUs of the kubelet's assignment, checked against
// the container's device nodes (kubeletAssignment); an assignment that is
// not trusted is recorded as a warning, and the container is classified
// as if it had none.
func (p *Path) kubelet(c *call, gv given) []inventory.GPU {
	kub, warn := kubeletAssignment(p.Source.Devices(), c.ctr, gv.every)
	if warn != "" {
		c.res.Warnings = append(c.res.Warnings, warn)
	}
	return kub
}

// runtimeSource names the runtime's own devices in the table's refusals.
const runtimeSource = "the GPUs the runtime gave the container (device plugin, --device or CDI)"

// kubeletSource is the source of the kubelet's assignments.
var kubeletSource = request.Source{Kind: request.Kubelet, Key: alloc.KubeletAnnotation}

// bookGiven books the GPUs (indices) the runtime gave the container, or
// the kubelet's assignment. They are the runtime's choice: the container
// keeps exactly those, and they are booked in the node's sharing mode and
// marked as the runtime's (alloc.Holding.Runtime), so that no count
// request hands them out again, on a shared node either. A conflict with
// an exclusive holding refuses the container, naming the holder, as for
// any request. Holdings rebuilds the booking at Synchronize the same way,
// without a record.
func (p *Path) bookGiven(c *call, idx []int, kubelet bool) error {
	source := runtimeSource
	if kubelet {
		source = kubeletSource.String()
	}
	h := HolderOf(c.pod, c.ctr)
	mode := p.Sharing
	if c.replicated {
		mode = sharing.Shared // replicas: shared whatever the node's mode
	}
	got, err := p.Table.Allocate(alloc.Request{Holder: h, Mode: mode, GPUs: idx, Source: source, Kubelet: kubelet, Runtime: true})
	if err != nil {
		return err
	}
	c.res.Holding = &alloc.Holding{Holder: h, Mode: mode, GPUs: got, Kubelet: kubelet, Runtime: true}
	return nil
}

// givenNote is the note of a container whose GPUs the runtime gave and
// which carries no request: booked, nothing injected.
func givenNote(h *alloc.Holding) string {
	return fmt.Sprintf("the runtime gives the container GPUs %s: booked (%s) as the runtime's choice", indices(h.GPUs), h.Mode)
}

// kubeletRequest is the request of a container that the kubelet gave GPUs:
// those GPUs, with the driver capabilities of its
// NVIDIA_DRIVER_CAPABILITIES (request.KubeletRequest).
func (p *Path) kubeletRequest(c *call, kub []inventory.GPU) (request.Request, error) {
	if err := c.live(); err != nil {
		return request.Request{}, err
	}
	err := request.CheckMounts(len(c.ctr.GetMounts()))
	if err == nil {
		c.res.Request, err = request.KubeletRequest(alloc.KubeletAnnotation, uuids(kub), c.ctr.GetEnv())
	}
	return c.res.Request, err
}

// find finds the carrier of the container's request, by key, without
// reading its value (request.Find); a container without one asks for
// nothing.
func (p *Path) find(c *call) (request.Found, error) {
	if err := c.live(); err != nil {
		return request.Found{}, err
	}
	if err := request.CheckMounts(len(c.ctr.GetMounts())); err != nil {
		return request.Found{}, err
	}
	f, err := request.Find(requestInput(c))
	c.res.Request.Source = f.Source
	return f, err
}

// authorize checks that the pod's namespace may use the request's carrier,
// before its value is read. A denied NVIDIA_VISIBLE_DEVICES is ignored,
// and set to void so that no other injector (the NVIDIA runtime, a CDI
// hook) honours it: that answer, returned, ends the path. Any other denied
// carrier refuses the container.
func (p *Path) authorize(c *call, f request.Found) (*api.ContainerAdjustment, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	return p.allow(c, f.PolicySource(), f.Source)
}

// authorizeGiven is authorize for a container whose GPUs the runtime gave.
// NVIDIA_VISIBLE_DEVICES and the device plugin's mount list are also what
// a device plugin (NVIDIA's, DEVICE_LIST_STRATEGY envvar or volume-mounts)
// hands the kubelet: where the runtime gave the container GPU device nodes
// as well (its PASS_DEVICE_SPECS=true), which a pod cannot add to its
// spec, the nodes decide its GPUs (keepGiven) and the variable or list is
// not a request of the pod's author: it is served, whatever the policy,
// with the driver files of those GPUs only.
func (p *Path) authorizeGiven(c *call, f request.Found, gv given) (*api.ContainerAdjustment, error) {
	if src := f.PolicySource(); (src == policy.Env || src == policy.DeviceList) && len(gv.gpus) > 0 {
		return nil, c.live()
	}
	return p.authorize(c, f)
}

// allow decides on the policy source src of the carrier from (see
// authorize).
func (p *Path) allow(c *call, src policy.Source, from request.Source) (*api.ContainerAdjustment, error) {
	ns := c.pod.GetNamespace()
	if p.Policy.Allows(src, ns) {
		return nil, nil
	}
	if src == policy.Env {
		c.res.Selection.Note = fmt.Sprintf("%s ignored: not allowed in namespace %q (%s); set to void", from, ns, p.Policy.Setting(src))
		c.res.Voided = true
		adj := &api.ContainerAdjustment{}
		adj.AddEnv(adjust.EnvVisibleDevices, "void")
		return adj, nil
	}
	return nil, &request.Error{Source: from, Msg: fmt.Sprintf("not allowed in namespace %q (%s)", ns, p.Policy.Setting(src))}
}

// parse parses the authorized carrier's value into the request. Find
// names the carrier's class (management or not, request.Found.Management)
// as the parse will; a parse that disagrees would have been authorized as
// the wrong class, and is refused.
func (p *Path) parse(c *call, f request.Found) (request.Request, error) {
	if err := c.live(); err != nil {
		return request.Request{}, err
	}
	r, err := f.Parse()
	c.res.Request = r
	if err == nil && r.Kind != request.Nothing && r.PolicySource() != f.PolicySource() {
		err = &request.Error{Source: f.Source, Msg: fmt.Sprintf("reads as a %s but parses as a %s: refused", f.PolicySource(), r.PolicySource())}
	}
	return r, err
}

// reconcile looks at what the runtime already gives the container. CDI
// devices of NVIDIA's kinds are the runtime's answer: nothing is added,
// and end is set. A device plugin's mount list that the policy does not
// trust alone is refused unless the runtime gave GPU device nodes
// (deviceListBacked).
func (p *Path) reconcile(c *call, r request.Request, gv given) (end bool, err error) {
	if err := c.live(); err != nil {
		return false, err
	}
	cdi, err := runtimeCDIDevices(c.ctr)
	if err != nil {
		return false, err
	}
	if len(cdi) > 0 {
		c.res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container the CDI devices %s: nothing injected", r.Source, strings.Join(cdi, ", "))
		return true, nil
	}
	return false, p.deviceListBacked(c, r, gv)
}

// deviceListBacked refuses a device plugin's mount list that the policy
// does not trust on its own in the pod's namespace (policy.TrustsDeviceList)
// unless the runtime gave the container GPU device nodes: a pod allowed
// hostPath volumes can mount /dev/null at
// /var/run/nvidia-container-devices/<ID> itself, but cannot add device
// nodes to its spec. With the nodes, they decide the container's GPUs
// (keepGiven), whatever the list names. A privileged container's list is
// taken as it is: it reaches every device of the node anyway.
func (p *Path) deviceListBacked(c *call, r request.Request, gv given) error {
	ns := c.pod.GetNamespace()
	if r.PolicySource() != policy.DeviceList || len(gv.gpus) > 0 || gv.every || p.Policy.TrustsDeviceList(ns) {
		return nil
	}
	return &request.Error{Source: r.Source, Msg: fmt.Sprintf("not allowed in namespace %q without the GPUs' device nodes from the runtime "+
		"(%s; the NVIDIA device plugin passes them with PASS_DEVICE_SPECS=true)", ns, p.Policy.Setting(policy.DeviceList))}
}

// selectDevices resolves the request against the device source
// (request.Select). A selection that injects nothing (Inject unset, with
// a note) ends the path.
func (p *Path) selectDevices(c *call, r request.Request) (request.Selection, error) {
	if err := c.live(); err != nil {
		return request.Selection{}, err
	}
	var err error
	c.res.Selection, err = request.Select(r, p.Source)
	c.res.GPUs = c.res.Selection.GPUs
	return c.res.Selection, err
}

// keepGiven returns the GPUs the runtime decided (bookGiven booked them),
// whatever the request named: those whose device nodes the container has,
// else (CDI devices, whose nodes the runtime adds after NRI) those booked.
func (p *Path) keepGiven(c *call, gv given) []inventory.GPU {
	c.res.GPUs = gv.gpus
	if len(gv.gpus) == 0 {
		c.res.GPUs = byIndex(p.Source.Devices(), c.res.Holding.GPUs)
	}
	return c.res.GPUs
}

// book books the GPUs the request names or, for a count, those the table
// picks, and returns the GPUs the container gets and the booking's record
// (empty when nothing was booked: a request for the driver alone). A
// pod-level request (gpus.nri-gpu.dev/pod: a count or named GPUs) is the
// pod's: booked once, by its first container, for the pod
// (alloc.PodHolder), and every later container of the pod joins that
// holding and gets its GPUs, so that an exclusive pod-level request does
// not refuse the pod's own sidecar.
func (p *Path) book(c *call, r request.Request, sel request.Selection) ([]inventory.GPU, alloc.Record, error) {
	if err := c.live(); err != nil {
		return nil, alloc.Record{}, err
	}
	if sel.Count == 0 && len(sel.GPUs) == 0 {
		return sel.GPUs, alloc.Record{}, nil
	}
	mode := p.Sharing
	if x := r.Exclusive; x != nil {
		mode = sharing.Shared
		if *x {
			mode = sharing.Exclusive
		}
	}
	req := alloc.Request{Holder: HolderOf(c.pod, c.ctr), Mode: mode, Count: sel.Count, Source: r.Source.String(), GPUs: indexes(sel.GPUs)}
	podLevel := r.Source.Kind == request.PodAnnotation
	var got []int
	var err error
	if podLevel {
		req.Member = req.Holder.ID
		req.Holder = alloc.PodHolder(req.Holder.PodID, req.Holder.Namespace, req.Holder.Pod)
		var h alloc.Holding
		h, _, err = p.Table.Join(req)
		got, mode = h.GPUs, h.Mode
	} else {
		got, err = p.Table.Allocate(req)
	}
	if err != nil {
		return nil, alloc.Record{}, err
	}
	if sel.Count > 0 {
		// Named GPUs keep the order the user gave; picked ones come in
		// index order.
		c.res.GPUs = byIndex(p.Source.Devices(), got)
	}
	c.res.Holding = &alloc.Holding{Holder: req.Holder, Mode: mode, GPUs: got}
	rec := alloc.Record{Mode: mode.String(), Pod: podLevel, GPUs: make([]string, 0, len(c.res.GPUs))}
	for _, g := range c.res.GPUs {
		rec.GPUs = append(rec.GPUs, g.ID())
	}
	return c.res.GPUs, rec, nil
}

// checkManagement refuses a management container where it would reach a
// GPU that another container holds exclusively. It books nothing: a
// monitoring agent that held every GPU shared would keep every exclusive
// request off the node. (A management container that is already running
// when an exclusive holder comes keeps its view: management namespaces
// are the operator's, policy.managementNamespaces.)
func (p *Path) checkManagement(c *call, r request.Request, sel request.Selection) error {
	if err := c.live(); err != nil {
		return err
	}
	return p.Table.Check(alloc.Request{Holder: HolderOf(c.pod, c.ctr), Mode: sharing.Shared, Source: r.Source.String(), GPUs: indexes(sel.GPUs)})
}

// require checks the requirements the image states (NVIDIA_REQUIRE_*)
// against the node and the GPUs the container gets, once they are known:
// after booking, so that a count's picks are checked too. A requirement
// that does not hold refuses the container, and the booking is released.
func (p *Path) require(c *call, gpus []inventory.GPU) error {
	if err := c.live(); err != nil {
		return err
	}
	err := p.Source.Check(c.ctr.GetEnv(), gpus)
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
// capabilities, every control node for a management request (and
// NVIDIA_VISIBLE_DEVICES void), the MIG management nodes asked for, less
// what the runtime already gives the container (dropExisting). When the
// runtime gave it everything already, end is set (the path ends with a
// note; a privileged container, which has every node of the host, is
// always given what is missing).
func (p *Path) build(c *call, r request.Request, caps inventory.Capabilities, gpus []inventory.GPU, gv given) (e adjust.Edits, end bool, err error) {
	if err := c.live(); err != nil {
		return e, false, err
	}
	e = p.Source.Edits(gpus, caps)
	if r.Management {
		addNodes(&e, p.Source.Control())
		e.VisibleDevices = "void"
	}
	mig, err := p.migManagement(c)
	if err != nil {
		return e, false, err
	}
	addNodes(&e, mig)
	have, n := dropExisting(&e, p.Source.Devices(), c.ctr, gv)
	c.res.Edits = e
	if have == "" {
		return e, false, nil
	}
	if len(e.Devices) == 0 && len(e.Mounts) == 0 && !gv.every {
		c.res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container %s and every driver file: nothing injected", r.Source, have)
		return e, true, nil
	}
	what := "the missing control nodes and driver files"
	if n == 0 {
		what = "the missing device nodes and driver files"
	}
	c.res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container %s: injected only %s (%d device nodes, %d mounts)", r.Source, have, what, len(e.Devices), len(e.Mounts))
	return e, false, nil
}

// encode turns the edits into the NRI adjustment, appending to the
// container's own LD_LIBRARY_PATH and PATH. With emit: cdi, GPUs that the
// runtime's specs define go as CDI device names instead, when the runtime
// resolves them. rec, the record of a booking of the call's own, goes in
// the container's annotation alloc.Annotation, from which the table is
// rebuilt after a restart; nil where the GPUs are the runtime's choice or
// nothing is booked.
func (p *Path) encode(c *call, r request.Request, e adjust.Edits, rec *alloc.Record) (*api.ContainerAdjustment, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	adj := e.Adjustment(c.ctr.GetEnv())
	c.res.BinariesAtUsrBin = e.BinariesAtUsrBin(c.ctr.GetEnv())
	switch {
	case p.EmitCDI && c.res.MPS != nil:
		// An MPS client's pipe directory and limits are nri-gpu's
		// (mpsClient), not what a CDI spec of the GPU would add.
		c.res.Emit = "edits (an MPS client: its pipe directory and limits are nri-gpu's)"
	case p.EmitCDI && !r.Management && c.res.Selection.Note == "":
		// Management containers get control nodes that no GPU's CDI
		// device carries, and a container that has some of its devices
		// from the runtime gets only the missing ones: always edits.
		adj, c.res.Emit = p.emitCDI(c, adj)
	}
	if rec != nil && c.res.Holding != nil {
		adj.AddAnnotation(alloc.Annotation, rec.Encode())
	}
	return adj, nil
}

// emitCDI returns the CDI form of the answer when the runtime can resolve
// it and its specs define every GPU of the container; otherwise the
// edits' adjustment adj, with the reason.
func (p *Path) emitCDI(c *call, adj *api.ContainerAdjustment) (*api.ContainerAdjustment, string) {
	if !p.RuntimeCDI {
		return adj, "edits (the runtime's NRI does not inject CDI devices)"
	}
	if len(c.res.GPUs) == 0 {
		return adj, "edits (no GPU to name)"
	}
	if why := migManagementNodes(p.Source.Snapshot().MIGControl, c.res.Edits.Devices); why != "" {
		return adj, "edits (" + why + ")"
	}
	names := make([]string, 0, len(c.res.GPUs))
	for _, g := range c.res.GPUs {
		n, ok := p.CDINames[g.UUID]
		if !ok {
			return adj, "edits (no CDI spec defines " + inventory.KindNVIDIA + "=" + g.UUID + ")"
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

// indexes returns the GPUs' indices, in their order.
func indexes(gs []inventory.GPU) []int {
	out := make([]int, 0, len(gs))
	for _, g := range gs {
		out = append(out, g.Index)
	}
	return out
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
