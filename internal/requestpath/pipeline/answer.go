package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/require"
)

// answer is the answer every kind gives once it knows the container's
// request, capabilities, GPUs and MPS share (res): the image's
// requirements checked (require), the edits made (build) and encoded
// (encode), and for an MPS client its daemon (mpsClient). rec is the
// record that goes on the answer: what the container holds by its own
// request, or that a management container holds nothing; none (the zero
// Record) for the kinds whose GPUs were given. Where the runtime already gives the
// container everything, the answer is nil (a note says so), unless it is
// an MPS client.
func (p *Path) answer(c *call, g given, res Result, rec alloc.Record) (*api.ContainerAdjustment, Result, error) {
	if err := p.require(c, res.GPUs); err != nil {
		return nil, res, err
	}
	var note string
	var end bool
	var err error
	res.Edits, note, end, err = p.build(c, res.Request, res.Selection.Caps, res.GPUs, g)
	if note != "" {
		res.Selection.Note = note
	}
	if err != nil || end && res.MPS == nil {
		return nil, res, err
	}
	var adj *api.ContainerAdjustment
	if !end {
		adj, res.Emit, res.BinariesAtUsrBin = p.encode(c, res, rec)
	}
	return p.mpsClient(c, adj, res.MPS), res, nil
}

// require checks the requirements the image states (NVIDIA_REQUIRE_*)
// against the node and the GPUs the container gets, once they are known:
// after booking, so that a count's picks are checked too. A requirement
// that does not hold refuses the container, and the booking is released.
func (p *Path) require(c *call, gpus []inventory.GPU) error {
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
// what the runtime already gives the container (dropExisting), with a
// note saying what it gave. When it gave everything already, end is set
// (a privileged container, which has every node of the host, is always
// given what is missing).
func (p *Path) build(c *call, r request.Request, caps inventory.Capabilities, gpus []inventory.GPU, g given) (e adjust.Edits, note string, end bool, err error) {
	e = p.Source.Edits(gpus, caps)
	if r.Management {
		addNodes(&e, p.Source.Control())
		e.VisibleDevices = "void"
	}
	mig, err := p.migManagement(c)
	if err != nil {
		return e, "", false, err
	}
	addNodes(&e, mig)
	have, n := dropExisting(&e, p.Source.Devices(), c.ctr, g)
	if have == "" {
		return e, "", false, nil
	}
	if len(e.Devices) == 0 && len(e.Mounts) == 0 && !g.privileged {
		return e, fmt.Sprintf("%s: the runtime already gives the container %s and every driver file: nothing injected", r.Source, have), true, nil
	}
	what := "the missing control nodes and driver files"
	if n == 0 {
		what = "the missing device nodes and driver files"
	}
	return e, fmt.Sprintf("%s: the runtime already gives the container %s: injected only %s (%d device nodes, %d mounts)", r.Source, have, what, len(e.Devices), len(e.Mounts)), false, nil
}

// encode turns the edits into the NRI adjustment, appending to the
// container's own LD_LIBRARY_PATH and PATH, and says how the devices went
// (Result.Emit) and whether the binaries went to /usr/bin
// (Result.BinariesAtUsrBin). With emit: cdi, GPUs that the runtime's
// specs define go as CDI device names instead, when the runtime resolves
// them. rec, unless none (the zero Record), goes in the container's
// annotation alloc.Annotation, from which the table is rebuilt after a
// restart.
func (p *Path) encode(c *call, res Result, rec alloc.Record) (*api.ContainerAdjustment, string, bool) {
	env := c.ctr.GetEnv()
	adj := res.Edits.Adjustment(env)
	emit := ""
	switch {
	case p.EmitCDI && res.MPS != nil:
		// An MPS client's pipe directory and limits are nri-gpu's
		// (mpsClient), not what a CDI spec of the GPU would add.
		emit = "edits (an MPS client: its pipe directory and limits are nri-gpu's)"
	case p.EmitCDI && !res.Request.Management && res.Selection.Note == "":
		// Management containers get control nodes that no GPU's CDI
		// device carries, and a container that has some of its devices
		// from the runtime gets only the missing ones: always edits.
		adj, emit = p.emitCDI(res, adj)
	}
	if rec.Mode != "" {
		adj.AddAnnotation(alloc.Annotation, rec.Encode())
	}
	return adj, emit, res.Edits.BinariesAtUsrBin(env)
}

// emitCDI returns the CDI form of the answer when the runtime can resolve
// it and its specs define every GPU of the container; otherwise the
// edits' adjustment adj, with the reason.
func (p *Path) emitCDI(res Result, adj *api.ContainerAdjustment) (*api.ContainerAdjustment, string) {
	if !p.RuntimeCDI {
		return adj, "edits (the runtime's NRI does not inject CDI devices)"
	}
	if len(res.GPUs) == 0 {
		return adj, "edits (no GPU to name)"
	}
	if why := migManagementNodes(p.Source.Snapshot().MIGControl, res.Edits.Devices); why != "" {
		return adj, "edits (" + why + ")"
	}
	names := make([]string, 0, len(res.GPUs))
	for _, g := range res.GPUs {
		n, ok := p.CDINames[g.UUID]
		if !ok {
			return adj, "edits (no CDI spec defines " + inventory.KindNVIDIA + "=" + g.UUID + ")"
		}
		names = append(names, n)
	}
	return adjust.CDIAdjustment(names, res.Edits.VisibleDevices), "cdi"
}

// addNodes adds the nodes that the edits lack (by path).
func addNodes(e *adjust.Edits, nodes []inventory.DeviceNode) {
	for _, n := range nodes {
		if !slices.ContainsFunc(e.Devices, func(d inventory.DeviceNode) bool { return d.Path == n.Path }) {
			e.Devices = append(e.Devices, n)
		}
	}
}

// dropExisting adjusts the edits to a container that already has NVIDIA
// device nodes from the runtime (a device plugin's --device, a runtime
// class, CDI resolved before NRI). When it has GPU nodes of the inventory
// (g.nodes), the runtime decided its GPUs: no GPU node is added (an
// image's NVIDIA_VISIBLE_DEVICES=all must not widen them) and
// NVIDIA_VISIBLE_DEVICES names the GPUs it has. A node it has (by number,
// hasNode) or whose path it has (another node there) and a mount
// destination it has are dropped. It says which nodes it had
// ("/dev/nvidia0, /dev/nvidiactl"; empty when none) and how many were
// GPUs. A privileged container has every node of the host (g.privileged,
// and no g.nodes): its GPU nodes decide nothing, and
// NVIDIA_VISIBLE_DEVICES stays as the request made it.
func dropExisting(e *adjust.Edits, devs []inventory.GPU, ctr *api.Container, g given) (string, int) {
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
	isGPU := map[string]bool{}
	for _, g := range devs {
		isGPU[g.Node.Path] = true
		if g.MIG != nil {
			isGPU[g.MIG.GINode.Path], isGPU[g.MIG.CINode.Path] = true, true
		}
	}
	kept := e.Devices[:0:0]
	for _, n := range e.Devices {
		if !hasNode(have, n) && !hasPath(have, n.Path) && (len(g.nodes) == 0 || !isGPU[n.Path]) {
			kept = append(kept, n)
		}
	}
	e.Devices = kept
	if len(g.nodes) > 0 && e.VisibleDevices != "void" {
		e.VisibleDevices = strings.Join(uuids(g.nodes), ",")
	}
	// One pass over the container's mounts (bounded by
	// request.MaxMounts), against the edits' few dozen destinations.
	dst := make(map[string]bool, len(e.Mounts))
	for _, m := range e.Mounts {
		dst[m.Destination] = false
	}
	// Binaries the runtime put at /usr/bin (a CDI spec of layout:
	// toolkit, as nri-gpu cdi generate writes) need no binary directory.
	usrBin := e.UsrBin()
	for _, m := range usrBin {
		dst[m.Destination] = false
	}
	for _, cm := range ctr.GetMounts() {
		if _, ok := dst[cm.GetDestination()]; ok {
			dst[cm.GetDestination()] = true
		}
	}
	haveBin := len(usrBin) > 0
	for _, m := range usrBin {
		haveBin = haveBin && dst[m.Destination]
	}
	n := len(e.Mounts)
	if haveBin {
		e.DropBinaryDirs()
	}
	ms := e.Mounts[:0:0]
	for _, m := range e.Mounts {
		if !dst[m.Destination] {
			ms = append(ms, m)
		}
	}
	// Files counts for logging; a dropped mount is one file or one
	// directory of them, so the count is a lower bound then.
	e.Files = max(0, e.Files-(n-len(ms)))
	e.Mounts = ms
	return strings.Join(nv, ", "), len(g.nodes)
}

// hasPath reports whether the devices have a node at path.
func hasPath(have []*api.LinuxDevice, path string) bool {
	return slices.ContainsFunc(have, func(d *api.LinuxDevice) bool { return d.GetPath() == path })
}
