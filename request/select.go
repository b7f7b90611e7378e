package request

import (
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Selection is what a container gets: GPUs and driver capabilities.
type Selection struct {
	// Inject is false when the container is to be left untouched.
	Inject bool
	// GPUs are the GPUs asked for by name (or all of them); empty for a
	// count request.
	GPUs []inventory.GPU
	// Count, when positive, asks for that many GPUs, to be picked by the
	// allocator (which knows who holds what).
	Count int
	Caps  inventory.Capabilities
	// Note explains a request that was dropped without error (an image's
	// NVIDIA_VISIBLE_DEVICES=all on a node without GPUs); empty otherwise.
	Note string
}

// Select resolves r against the snapshot. An explicit request that cannot
// be met is an error naming the request's source and the bad token; an
// environment request for every GPU on a node that has none is dropped
// with a note, since images such as nvidia/cuda set it for every container.
func Select(r Request, snap *inventory.Snapshot) (Selection, error) {
	if r.Kind == Nothing {
		return Selection{}, nil
	}
	if snap.Vendor != "" && r.FromEnv {
		return Selection{Note: r.Source + " is NVIDIA's; the node serves " + snap.Vendor + " devices: not injected"}, nil
	}
	if !snap.Usable() {
		if r.FromEnv && (r.Kind == All || r.Kind == DriverOnly) {
			return Selection{Note: r.Source + " asks for the GPU driver, but the node has none: not injected"}, nil
		}
		return Selection{}, errorf(r.Source, "the node has no usable NVIDIA driver (see nri-gpu inventory)")
	}

	sel := Selection{Inject: true, Caps: r.Caps}
	switch r.Kind {
	case DriverOnly:
	case All:
		if snap.Empty() {
			if r.FromEnv {
				return Selection{Note: r.Source + "=all on a node without GPUs: not injected"}, nil
			}
			return Selection{}, errorf(r.Source, "all GPUs requested, but the node has none")
		}
		sel.GPUs = snap.GPUs
	case Count:
		if r.Count > len(snap.GPUs) {
			return Selection{}, errorf(r.Source, "count %d exceeds the node's %d GPUs (%s)", r.Count, len(snap.GPUs), snap.IndexRange())
		}
		sel.Count = r.Count
	case Devices:
		gpus := make([]inventory.GPU, 0, len(r.IDs))
		for _, id := range r.IDs {
			g, err := lookup(snap, id)
			if err != nil {
				return Selection{}, errorf(r.Source, "%s", err.Msg)
			}
			if !containsGPU(gpus, g.Index) {
				gpus = append(gpus, g)
			}
		}
		sel.GPUs = gpus
	}
	return sel, nil
}

func containsGPU(gpus []inventory.GPU, index int) bool {
	for _, g := range gpus {
		if g.Index == index {
			return true
		}
	}
	return false
}

// lookup finds the GPU a device ID names: a decimal index, a GPU UUID
// (case-insensitive) or a PCI bus id with a 4- or 8-digit domain.
func lookup(snap *inventory.Snapshot, id string) (inventory.GPU, *Error) {
	if snap.Vendor != "" {
		return lookupName(snap, id)
	}
	switch {
	case isDigits(id):
		if n, err := strconv.Atoi(id); err == nil && len(id) <= 6 {
			for _, g := range snap.GPUs {
				if g.Index == n {
					return g, nil
				}
			}
		}
		return inventory.GPU{}, &Error{Msg: "unknown GPU " + quote(id) + " (node has " + snap.IndexRange() + ")"}
	case len(id) > 4 && strings.EqualFold(id[:4], "GPU-"):
		for _, g := range snap.GPUs {
			if strings.EqualFold(g.UUID, id) {
				return g, nil
			}
		}
		return inventory.GPU{}, &Error{Msg: "unknown GPU " + quote(id) + " (no GPU of the node has this UUID; see nri-gpu inventory)"}
	case strings.HasPrefix(strings.ToUpper(id), "MIG-") || isMIGPair(id):
		return inventory.GPU{}, &Error{Msg: "MIG device " + quote(id) + " is not supported (request whole GPUs by index, UUID or bus id)"}
	case strings.Contains(id, ":"):
		bus, err := inventory.NormalizeBusID(id)
		if err == nil {
			for _, g := range snap.GPUs {
				if g.BusID == bus {
					return g, nil
				}
			}
		}
		return inventory.GPU{}, &Error{Msg: "unknown GPU " + quote(id) + " (no GPU of the node is at this PCI bus id; see nri-gpu inventory)"}
	}
	return inventory.GPU{}, &Error{Msg: "unknown device " + quote(id) + " (valid: an index " + snap.IndexRange() + ", a GPU-<uuid>, or a PCI bus id)"}
}

// lookupName finds a device of another vendor's CDI spec by its CDI name
// (or, as for GPUs, by its index).
func lookupName(snap *inventory.Snapshot, id string) (inventory.GPU, *Error) {
	names := make([]string, 0, len(snap.GPUs))
	for _, g := range snap.GPUs {
		if g.Name == id {
			return g, nil
		}
		names = append(names, g.Name)
	}
	if n, err := strconv.Atoi(id); err == nil && isDigits(id) {
		for _, g := range snap.GPUs {
			if g.Index == n {
				return g, nil
			}
		}
	}
	return inventory.GPU{}, &Error{Msg: "unknown device " + quote(id) + " (" + snap.Vendor + " devices of the node: " + quote(strings.Join(names, ",")) + ")"}
}

// isMIGPair reports whether id is a "<gpu>:<mig>" index pair.
func isMIGPair(id string) bool {
	a, b, ok := strings.Cut(id, ":")
	return ok && isDigits(a) && isDigits(b)
}

// quote quotes a user's token for a message, cutting very long ones.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.Quote(s)
}
