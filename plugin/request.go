package plugin

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/policy"
	"github.com/nri-gpu/nri-gpu/request"
)

// HandleWithPolicy is the request path under a policy: it parses the
// container's request from every source, checks that the pod's namespace
// may use that source, selects from the prepared snapshot, books the GPUs
// in table (whose rules pick the GPUs of a count request, and may refuse
// the request), checks the image's NVIDIA_REQUIRE_* variables, and builds
// the adjustment, which records the booking in the container's annotation
// alloc.Annotation, leaving out what the runtime already gave the
// container. sharing is the node's policy for requests that do not say
// exclusive=. It touches no file. A nil adjustment with a nil error leaves
// the container untouched; an error changes nothing (a booking made on the
// way is released).
func HandleWithPolicy(prep *adjust.Prepared, table *alloc.Table, sharing alloc.Mode, pol policy.Policy, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, Result, error) {
	snap := prep.Snapshot()
	var res Result
	var err error
	res.Request, err = request.ParseInput(request.Input{
		Annotations: pod.GetAnnotations(),
		Name:        ctr.GetName(),
		Env:         ctr.GetEnv(),
		Mounts:      mounts(ctr),
	})
	if err != nil || res.Request.Kind == request.Nothing {
		return nil, res, err
	}
	r := &res.Request
	ns := pod.GetNamespace()
	if !pol.Allows(r.Origin, ns) {
		if r.Origin == policy.Env {
			// Ignored, and hidden from any other injector (the NVIDIA
			// runtime, a CDI hook) that would honour it.
			res.Selection.Note = fmt.Sprintf("%s ignored: not allowed in namespace %q (%s); set to void", r.Source, ns, pol.Setting(r.Origin))
			adj := &api.ContainerAdjustment{}
			adj.AddEnv(adjust.EnvVisibleDevices, "void")
			return adj, res, nil
		}
		return nil, res, &request.Error{Source: r.Source, Msg: fmt.Sprintf("not allowed in namespace %q (%s)", ns, pol.Setting(r.Origin))}
	}
	if cdi := runtimeCDIDevices(ctr); len(cdi) > 0 {
		res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container the CDI devices %s: nothing injected", r.Source, strings.Join(cdi, ", "))
		return nil, res, nil
	}
	res.Selection, err = request.Select(*r, snap)
	if err != nil || !res.Selection.Inject {
		return nil, res, err
	}
	gpus := res.Selection.GPUs
	// A container that already has GPU nodes from the runtime keeps
	// exactly those GPUs: nri-gpu books and adds none.
	existing := runtimeGPUs(snap, ctr)
	var rec alloc.Record
	switch {
	case len(existing) > 0:
		gpus = existing
	case r.Management:
		// Management tools (monitoring, node agents) see every GPU
		// without holding any: they neither wait for nor block the
		// workloads' bookings.
	case res.Selection.Count > 0 || len(gpus) > 0:
		mode := sharing
		if x := r.Exclusive; x != nil {
			mode = alloc.Shared
			if *x {
				mode = alloc.Exclusive
			}
		}
		req := alloc.Request{Holder: HolderOf(pod, ctr), Mode: mode, Count: res.Selection.Count, Source: r.Source,
			GPUs: make([]int, 0, len(gpus))}
		for _, g := range gpus {
			req.GPUs = append(req.GPUs, g.Index)
		}
		// Named GPUs are checked before they are booked.
		if res.Selection.Count == 0 {
			if err := checkRequirements(snap, ctr, gpus); err != nil {
				return nil, res, err
			}
		}
		got, err := table.Allocate(req)
		if err != nil {
			return nil, res, err
		}
		if res.Selection.Count > 0 {
			// Named GPUs keep the order the user gave; picked ones
			// come in index order.
			gpus = byIndex(snap, got)
		}
		res.Holding = &alloc.Holding{Holder: req.Holder, Mode: mode, GPUs: got}
		rec.Mode = mode.String()
		rec.GPUs = make([]string, 0, len(gpus))
		for _, g := range gpus {
			rec.GPUs = append(rec.GPUs, g.ID())
		}
	}
	if res.Holding == nil || res.Selection.Count > 0 {
		if err := checkRequirements(snap, ctr, gpus); err != nil {
			if res.Holding != nil {
				table.Release(res.Holding.Holder.ID)
				res.Holding = nil
			}
			return nil, res, err
		}
	}
	res.GPUs = gpus
	res.Edits = adjust.Build(prep, gpus, res.Selection.Caps)
	if r.Management {
		addControlNodes(&res.Edits, snap.Control)
		res.Edits.VisibleDevices = "void"
	}
	if have, n := dropExisting(&res.Edits, snap, ctr); have != "" {
		what := "the missing control nodes and driver files"
		if n == 0 {
			what = "the missing device nodes and driver files"
		}
		if len(res.Edits.Devices) == 0 && len(res.Edits.Mounts) == 0 {
			if res.Holding != nil {
				table.Release(res.Holding.Holder.ID)
				res.Holding = nil
			}
			res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container %s and every driver file: nothing injected", r.Source, have)
			return nil, res, nil
		}
		res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container %s: injected only %s (%d device nodes, %d mounts)", r.Source, have, what, len(res.Edits.Devices), len(res.Edits.Mounts))
	}
	adj := res.Edits.Adjustment(ctr.GetEnv())
	if res.Holding != nil {
		adj.AddAnnotation(alloc.Annotation, rec.Encode())
	}
	return adj, res, nil
}

// checkRequirements checks the container's NVIDIA_REQUIRE_* variables
// against the node and the GPUs it is to get. They are NVIDIA's: another
// vendor's devices (cdiImport) are not checked.
func checkRequirements(snap *inventory.Snapshot, ctr *api.Container, gpus []inventory.GPU) error {
	if snap.Vendor != "" {
		return nil
	}
	cuda, _ := inventory.CUDAVersion(snap.DriverVersion)
	return request.CheckRequirements(ctr.GetEnv(), request.NodeFacts{CUDA: cuda, Driver: snap.DriverVersion}, gpus)
}

// runtimeGPUs returns the GPUs of the inventory whose device nodes the
// container already has from the runtime, in index order.
func runtimeGPUs(snap *inventory.Snapshot, ctr *api.Container) []inventory.GPU {
	have := ctr.GetLinux().GetDevices()
	if len(have) == 0 {
		return nil
	}
	var out []inventory.GPU
	for _, g := range snap.GPUs {
		if hasNode(have, g.Node) {
			out = append(out, g)
		}
	}
	return out
}

// hasNode reports whether the devices hold n, by path or by number.
func hasNode(have []*api.LinuxDevice, n inventory.DeviceNode) bool {
	for _, d := range have {
		if d.GetPath() == n.Path || d.GetType() == "c" && d.GetMajor() == n.Major && d.GetMinor() == n.Minor {
			return true
		}
	}
	return false
}

// mounts returns the container's mounts as the request package sees them.
func mounts(ctr *api.Container) []request.Mount {
	ms := ctr.GetMounts()
	if len(ms) == 0 {
		return nil
	}
	out := make([]request.Mount, len(ms))
	for i, m := range ms {
		out[i] = request.Mount{Source: m.GetSource(), Destination: m.GetDestination()}
	}
	return out
}

// runtimeCDIDevices returns the NVIDIA CDI devices the runtime injects
// into the container itself: those NRI lists (containerd 2.4), and those
// named by the container's cdi.k8s.io/ annotations, the form in which the
// CRI plugin passes a container's CDI devices (older runtimes do not list
// them in NRI).
func runtimeCDIDevices(ctr *api.Container) []string {
	var out []string
	add := func(name string) {
		name = strings.TrimSpace(name)
		if (strings.HasPrefix(name, request.CDIKindGPU+"=") || strings.HasPrefix(name, request.CDIKindManagement+"=")) && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for _, d := range ctr.GetCDIDevices() {
		add(d.GetName())
	}
	for key, val := range ctr.GetAnnotations() {
		if strings.HasPrefix(key, cdiAnnotationPrefix) && len(val) <= 4096 {
			for _, name := range strings.Split(val, ",") {
				add(name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// cdiAnnotationPrefix is the CDI project's annotation prefix for device
// requests on a container.
const cdiAnnotationPrefix = "cdi.k8s.io/"

// addControlNodes adds every control node of the node that the edits lack.
func addControlNodes(e *adjust.Edits, c inventory.ControlNodes) {
	for _, n := range [...]*inventory.DeviceNode{c.Ctl, c.UVM, c.UVMTools, c.Modeset} {
		if n == nil {
			continue
		}
		found := false
		for _, d := range e.Devices {
			found = found || d.Path == n.Path
		}
		if !found {
			e.Devices = append(e.Devices, *n)
		}
	}
}

// dropExisting adjusts the edits to a container that already has NVIDIA
// device nodes from the runtime (a device plugin's --device, a runtime
// class, CDI resolved before NRI). When it has GPU nodes of the inventory,
// the runtime decided its GPUs: no GPU node is added (an image's
// NVIDIA_VISIBLE_DEVICES=all must not widen them) and
// NVIDIA_VISIBLE_DEVICES names the GPUs it has. Device nodes (by path or
// number) and mount destinations it already has are dropped. It says which
// nodes it had ("/dev/nvidia0, /dev/nvidiactl"; empty when none) and how
// many were GPUs.
func dropExisting(e *adjust.Edits, snap *inventory.Snapshot, ctr *api.Container) (string, int) {
	have := ctr.GetLinux().GetDevices()
	var nv []string
	for _, d := range have {
		if strings.HasPrefix(d.GetPath(), "/dev/nvidia") {
			nv = append(nv, d.GetPath())
		}
	}
	if len(nv) == 0 {
		return "", 0
	}
	present := func(n inventory.DeviceNode) bool { return hasNode(have, n) }
	var uuids []string
	isGPU := map[string]bool{}
	for _, g := range snap.GPUs {
		isGPU[g.Node.Path] = true
		if present(g.Node) {
			uuids = append(uuids, g.UUID)
		}
	}
	devs := e.Devices[:0:0]
	for _, n := range e.Devices {
		if !present(n) && !(len(uuids) > 0 && isGPU[n.Path]) {
			devs = append(devs, n)
		}
	}
	e.Devices = devs
	if len(uuids) > 0 && e.VisibleDevices != "void" {
		e.VisibleDevices = strings.Join(uuids, ",")
	}
	ms := e.Mounts[:0:0]
	for _, m := range e.Mounts {
		dup := false
		for _, cm := range ctr.GetMounts() {
			dup = dup || cm.GetDestination() == m.Destination
		}
		if !dup {
			ms = append(ms, m)
		}
	}
	// Files counts for logging; a dropped mount is one file or one
	// directory of them, so the count is a lower bound then.
	e.Files = max(0, e.Files-(len(e.Mounts)-len(ms)))
	e.Mounts = ms
	return strings.Join(nv, ", "), len(uuids)
}
