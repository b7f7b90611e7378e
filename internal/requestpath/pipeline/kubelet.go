package pipeline

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// maxKubeletAnnotation bounds the value of alloc.KubeletAnnotation that is
// read: a UUID is 40 bytes, and a node has a few dozen GPUs at most.
const maxKubeletAnnotation = 4096

// kubeletAssignment returns the GPUs the kubelet assigned the container,
// in index order: those its annotation alloc.KubeletAnnotation names
// (UUIDs, as nri-gpu's device plugin writes them in Allocate), when the
// container has the device nodes of exactly those GPUs, which the kubelet
// adds from the same Allocate answer. The annotation alone is no proof: a
// runtime that passes pod annotations on to containers lets a pod author
// write it, but a non-privileged pod cannot add device nodes to its spec.
// So an annotation whose GPUs differ from those of the container's device
// nodes, or on a privileged container (which has every node of the host),
// is ignored, and warn says why; the container is then handled as if it
// had no annotation. Without the annotation it returns nothing and no
// warning.
func kubeletAssignment(devs []inventory.GPU, ctr *api.Container, privileged bool) (gpus []inventory.GPU, warn string) {
	val, ok := ctr.GetAnnotations()[alloc.KubeletAnnotation]
	if !ok {
		return nil, ""
	}
	ignored := "annotation " + alloc.KubeletAnnotation + " ignored: "
	switch {
	case privileged:
		return nil, ignored + "the container is privileged (the runtime gave it every host device), so its device nodes cannot back the kubelet's assignment"
	case len(val) > maxKubeletAnnotation:
		return nil, fmt.Sprintf("%svalue is %d bytes long (at most %d)", ignored, len(val), maxKubeletAnnotation)
	}
	var named []inventory.GPU
	for id := range strings.SplitSeq(val, ",") {
		if id = strings.TrimSpace(id); id == "" {
			continue
		}
		i := slices.IndexFunc(devs, func(g inventory.GPU) bool { return g.UUID != "" && strings.EqualFold(g.UUID, id) })
		if i < 0 {
			return nil, fmt.Sprintf("%snames %q, which is no GPU UUID of the inventory", ignored, few([]string{id}))
		}
		if !slices.ContainsFunc(named, func(g inventory.GPU) bool { return g.Index == devs[i].Index }) {
			named = append(named, devs[i])
		}
	}
	if len(named) == 0 {
		return nil, ignored + "names no GPU (valid: the UUIDs of the GPUs whose device nodes the kubelet gave the container, comma-separated)"
	}
	var have []inventory.GPU
	for _, g := range devs {
		if hasGPUNode(ctr, g) {
			have = append(have, g)
		}
	}
	slices.SortFunc(named, func(a, b inventory.GPU) int { return a.Index - b.Index })
	if !slices.EqualFunc(named, have, func(a, b inventory.GPU) bool { return a.Index == b.Index }) {
		return nil, fmt.Sprintf("%snames GPUs %s but the container has the device nodes of GPUs %s: not the kubelet's assignment (a pod annotation passed on?)",
			ignored, gpuList(named), gpuList(have))
	}
	return named, ""
}

// gpuList writes GPUs as "0, 2", or "none".
func gpuList(gs []inventory.GPU) string {
	if len(gs) == 0 {
		return "none"
	}
	idx := make([]int, len(gs))
	for i, g := range gs {
		idx[i] = g.Index
	}
	return indices(idx)
}

// uuids returns the GPUs' UUIDs.
func uuids(gs []inventory.GPU) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.UUID
	}
	return out
}
