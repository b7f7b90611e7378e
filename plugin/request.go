package plugin

import (
	"fmt"
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
	var rec alloc.Record
	if res.Selection.Count > 0 || len(gpus) > 0 {
		mode := sharing
		if x := r.Exclusive; x != nil {
			mode = alloc.Shared
			if *x {
				mode = alloc.Exclusive
			}
		}
		req := alloc.Request{Holder: HolderOf(pod, ctr), Mode: mode, Count: res.Selection.Count, Source: r.Source}
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
	if have := dropExisting(&res.Edits, ctr); have != "" {
		if len(res.Edits.Devices) == 0 && len(res.Edits.Mounts) == 0 {
			if res.Holding != nil {
				table.Release(res.Holding.Holder.ID)
				res.Holding = nil
			}
			res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container %s and every driver file: nothing injected", r.Source, have)
			return nil, res, nil
		}
		res.Selection.Note = fmt.Sprintf("%s: the runtime already gives the container %s: injected only the missing %d device nodes and %d driver files", r.Source, have, len(res.Edits.Devices), len(res.Edits.Mounts))
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
// into the container itself (from its CRI request or CDI annotations).
func runtimeCDIDevices(ctr *api.Container) []string {
	var out []string
	for _, d := range ctr.GetCDIDevices() {
		name := d.GetName()
		if strings.HasPrefix(name, request.CDIKindGPU+"=") || strings.HasPrefix(name, request.CDIKindManagement+"=") {
			out = append(out, name)
		}
	}
	return out
}

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

// dropExisting removes from the edits the device nodes (by path or by
// number) and mount destinations the container already has, and says
// which NVIDIA device nodes it had ("/dev/nvidia0, /dev/nvidiactl"); empty
// when it had none.
func dropExisting(e *adjust.Edits, ctr *api.Container) string {
	have := ctr.GetLinux().GetDevices()
	var nv []string
	for _, d := range have {
		if strings.HasPrefix(d.GetPath(), "/dev/nvidia") {
			nv = append(nv, d.GetPath())
		}
	}
	if len(nv) == 0 {
		return ""
	}
	devs := e.Devices[:0:0]
	for _, n := range e.Devices {
		dup := false
		for _, d := range have {
			dup = dup || d.GetPath() == n.Path || d.GetType() == "c" && d.GetMajor() == n.Major && d.GetMinor() == n.Minor
		}
		if !dup {
			devs = append(devs, n)
		}
	}
	e.Devices = devs
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
	return strings.Join(nv, ", ")
}
