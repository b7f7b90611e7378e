package request

import (
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/adjust"
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

// Select resolves r against the node's device source. An explicit request
// that cannot be met is an error naming the request's source and the bad
// token; an environment request for every GPU on a node that has none is
// dropped with a note, since images such as nvidia/cuda set it for every
// container.
func Select(r Request, src adjust.Source) (Selection, error) {
	if r.Kind == Nothing {
		return Selection{}, nil
	}
	fromEnv := r.Source.Kind == Env
	if k := r.DeviceKind(); k != "" && k != src.Kind() {
		return Selection{Note: r.Source.String() + " names " + k + " devices; the node serves " + src.Kind() + " devices: not injected"}, nil
	}
	if problem := src.Problem(); problem != "" {
		if fromEnv && (r.Kind == All || r.Kind == DriverOnly) {
			return Selection{Note: r.Source.String() + " asks for the GPU driver, but the node has none: not injected"}, nil
		}
		return Selection{}, errorf(r.Source, "%s", problem)
	}

	devs := src.Devices()
	sel := Selection{Inject: true, Caps: r.Caps}
	switch r.Kind {
	case DriverOnly:
	case All:
		if len(devs) == 0 {
			if fromEnv {
				return Selection{Note: r.Source.String() + "=all on a node without GPUs: not injected"}, nil
			}
			return Selection{}, errorf(r.Source, "all GPUs requested, but the node has none")
		}
		sel.GPUs = devs
	case Count:
		whole := wholeGPUs(devs)
		if r.Count > len(whole) {
			if mig := migEnabled(src.Snapshot()); len(mig) > 0 {
				return Selection{}, errorf(r.Source, "count %d exceeds the node's %d whole GPUs (%s): GPUs %s have MIG enabled and are not handed out whole; name their MIG devices (%s, or MIG-<uuid>)",
					r.Count, len(whole), inventory.IndexRange(whole), inventory.IndexRange(mig), inventory.IndexRange(devs[len(whole):]))
			}
			return Selection{}, errorf(r.Source, "count %d exceeds the node's %d GPUs (%s)", r.Count, len(devs), inventory.IndexRange(devs))
		}
		sel.Count = r.Count
	case Devices:
		gpus := make([]inventory.GPU, 0, len(r.IDs))
		for _, id := range r.IDs {
			g, err := src.Lookup(id)
			if err != nil {
				return Selection{}, errorf(r.Source, "%v%s", err, listForms(r.Source, id))
			}
			if !containsGPU(gpus, g.Index) {
				gpus = append(gpus, g)
			}
		}
		sel.GPUs = gpus
	}
	return sel, nil
}

// listForms adds, to the error of an unknown ID in a device list read as
// the NVIDIA toolkit reads NVIDIA_VISIBLE_DEVICES (the variable, the
// device plugin's mounts), the list's special values, which are not IDs;
// and the one id differs from only in case, which the toolkit does not
// take either.
func listForms(src Source, id string) string {
	if src.Kind != Env && src.Kind != DeviceList {
		return ""
	}
	const forms = "; the list may also be all, none or void (lower case)"
	for _, v := range []string{"all", "none", "void"} {
		if strings.EqualFold(id, v) {
			return forms + ": did you mean " + strconv.Quote(v) + "?"
		}
	}
	return forms
}

// wholeGPUs returns the GPUs of devs that are not MIG devices (which
// Devices lists last).
func wholeGPUs(devs []inventory.GPU) []inventory.GPU {
	for i, g := range devs {
		if g.MIG != nil {
			return devs[:i]
		}
	}
	return devs
}

// migEnabled returns the snapshot's GPUs that have MIG enabled.
func migEnabled(s *inventory.Snapshot) []inventory.GPU {
	var out []inventory.GPU
	for _, g := range s.GPUs {
		if g.MIGEnabled {
			out = append(out, g)
		}
	}
	return out
}

func containsGPU(gpus []inventory.GPU, index int) bool {
	for _, g := range gpus {
		if g.Index == index {
			return true
		}
	}
	return false
}

// quote quotes a user's token for a message, cutting very long ones.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.Quote(s)
}
