package adjust

import (
	"errors"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/require"
)

// Source is where a node's devices come from, and all that the request
// path knows of them: NVIDIA discovery (Prepared) or another vendor's CDI
// specs (package cdisource). A new kind of device is a new implementation;
// no consumer branches on which one it has. Implementations are immutable
// and safe for concurrent use; none does I/O.
type Source interface {
	// Snapshot is the discovery the source serves.
	Snapshot() *inventory.Snapshot
	// Kind is the CDI kind of the devices, "nvidia.com/gpu".
	Kind() string
	// Devices lists the devices that may be handed out, by index.
	Devices() []inventory.GPU
	// Lookup finds the device an ID of a request names. The error says
	// what the node has (it does not name the request's source).
	Lookup(id string) (inventory.GPU, error)
	// Problem says why no request can be served (no driver); empty when
	// requests can be served.
	Problem() string
	// Edits returns the edits that give a container devs (from Devices)
	// with the driver capabilities caps.
	Edits(devs []inventory.GPU, caps inventory.Capabilities) Edits
	// Control returns the node-wide device nodes that management
	// containers get besides their devices.
	Control() []inventory.DeviceNode
	// Check checks the requirements a container's environment states
	// (NVIDIA_REQUIRE_*) against the node and devs.
	Check(env []string, devs []inventory.GPU) error
}

// Prepared is the Source of NVIDIA GPUs found by discovery.
var _ Source = (*Prepared)(nil)

// Kind returns nvidia.com/gpu.
func (p *Prepared) Kind() string { return inventory.KindNVIDIA }

// Devices returns the snapshot's GPUs without MIG, then its MIG devices
// (inventory.Snapshot.Units).
func (p *Prepared) Devices() []inventory.GPU { return p.units }

// Problem says that the node has no usable driver: none loaded, or no
// control node.
func (p *Prepared) Problem() string {
	if p.snap.DriverVersion == "" || p.snap.Control.Ctl == nil {
		return "the node has no usable NVIDIA driver (see nri-gpu inventory)"
	}
	return ""
}

// Control returns the driver's node-wide device nodes that exist, with the
// MIG management capabilities (config, monitor) where MIG is in use.
func (p *Prepared) Control() []inventory.DeviceNode {
	c := p.snap.Control
	var out []inventory.DeviceNode
	mc := p.snap.MIGControl
	for _, n := range [...]*inventory.DeviceNode{c.Ctl, c.UVM, c.UVMTools, c.Modeset, mc.Config, mc.Monitor} {
		if n != nil {
			out = append(out, *n)
		}
	}
	return out
}

// Check checks the NVIDIA_REQUIRE_* variables of env against the driver
// and the GPUs.
func (p *Prepared) Check(env []string, devs []inventory.GPU) error {
	cuda, _ := inventory.CUDAVersion(p.snap.DriverVersion)
	return require.Check(env, require.NodeFacts{CUDA: cuda, Driver: p.snap.DriverVersion}, devs)
}

// Lookup finds the GPU a device ID names: a decimal index, a GPU UUID
// (case-insensitive) or a PCI bus id with a 4- or 8-digit domain; or the
// MIG device a MIG-<uuid> or a <gpu>:<mig> index pair names. A GPU with
// MIG enabled is not handed out whole: naming it is an error that says
// which MIG devices to ask for instead.
func (p *Prepared) Lookup(id string) (inventory.GPU, error) {
	snap := p.snap
	var g inventory.GPU
	found := false
	switch {
	case isDigits(id):
		if n, err := strconv.Atoi(id); err == nil && len(id) <= 6 {
			g, found = gpuWhere(snap.GPUs, func(g inventory.GPU) bool { return g.Index == n })
		}
		if !found {
			return inventory.GPU{}, errors.New("unknown GPU " + quote(id) + " (node has " + inventory.IndexRange(snap.GPUs) + ")")
		}
	case len(id) > 4 && strings.EqualFold(id[:4], "GPU-"):
		if g, found = gpuWhere(snap.GPUs, func(g inventory.GPU) bool { return strings.EqualFold(g.UUID, id) }); !found {
			return inventory.GPU{}, errors.New("unknown GPU " + quote(id) + " (no GPU of the node has this UUID; see nri-gpu inventory)")
		}
	case len(id) > 4 && strings.EqualFold(id[:4], "MIG-"):
		if u, ok := gpuWhere(p.units, func(g inventory.GPU) bool { return g.MIG != nil && strings.EqualFold(g.UUID, id) }); ok {
			return u, nil
		}
		return inventory.GPU{}, errors.New("unknown MIG device " + quote(id) + " (no MIG device of the node has this UUID" + p.migHint() + "; see nri-gpu inventory)")
	case isMIGPair(id):
		a, b, _ := strings.Cut(id, ":")
		gi, err1 := strconv.Atoi(a)
		mi, err2 := strconv.Atoi(b)
		if err1 == nil && err2 == nil && len(a) <= 6 && len(b) <= 6 {
			if u, ok := gpuWhere(p.units, func(g inventory.GPU) bool { return g.MIG != nil && g.MIG.Parent == gi && g.MIG.Index == mi }); ok {
				return u, nil
			}
		}
		return inventory.GPU{}, errors.New("unknown MIG device " + quote(id) + " (" + p.migHint()[2:] + "; see nri-gpu inventory)")
	case strings.Contains(id, ":"):
		bus, err := inventory.NormalizeBusID(id)
		if err == nil {
			g, found = gpuWhere(snap.GPUs, func(g inventory.GPU) bool { return g.BusID == bus })
		}
		if !found {
			return inventory.GPU{}, errors.New("unknown GPU " + quote(id) + " (no GPU of the node is at this PCI bus id; see nri-gpu inventory)")
		}
	default:
		return inventory.GPU{}, errors.New("unknown device " + quote(id) + " (valid: an index " + inventory.IndexRange(snap.GPUs) + ", a GPU-<uuid>, a PCI bus id, a MIG-<uuid> or <gpu>:<mig>)")
	}
	if g.MIGEnabled {
		return inventory.GPU{}, errors.New("GPU " + quote(id) + " (index " + strconv.Itoa(g.Index) + ") has MIG enabled and is not handed out whole; " + p.migOf(g.Index))
	}
	return g, nil
}

// migOf says which MIG devices of the GPU with index i to ask for.
func (p *Prepared) migOf(i int) string {
	var mine []inventory.GPU
	for _, u := range p.units {
		if u.MIG != nil && u.MIG.Parent == i {
			mine = append(mine, u)
		}
	}
	if len(mine) == 0 {
		return "it has no MIG device"
	}
	return "request one of its MIG devices " + inventory.IndexRange(mine) + " (or their MIG-<uuid>)"
}

// migHint lists the node's MIG devices for a message: ", node has 0:0-0:6".
func (p *Prepared) migHint() string {
	var migs []inventory.GPU
	for _, u := range p.units {
		if u.MIG != nil {
			migs = append(migs, u)
		}
	}
	if len(migs) == 0 {
		return ", the node has no MIG device"
	}
	return ", node has MIG devices " + inventory.IndexRange(migs)
}

func gpuWhere(gpus []inventory.GPU, f func(inventory.GPU) bool) (inventory.GPU, bool) {
	for _, g := range gpus {
		if f(g) {
			return g, true
		}
	}
	return inventory.GPU{}, false
}

// isMIGPair reports whether id is a "<gpu>:<mig>" index pair.
func isMIGPair(id string) bool {
	a, b, ok := strings.Cut(id, ":")
	return ok && isDigits(a) && isDigits(b)
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// quote quotes a user's token for a message, cutting very long ones.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.Quote(s)
}
