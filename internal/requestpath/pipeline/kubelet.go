package pipeline

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// maxKubeletAnnotation bounds the values of the kubelet's annotations
// (alloc.KubeletAnnotation and the per-resource alloc.KubeletAnnotationFor
// keys) that are read, all together: a UUID is 40 bytes, and a node has a
// few dozen GPUs and MIG devices at most.
const maxKubeletAnnotation = 4096

// kubeletAssignment returns the GPUs the kubelet assigned the container,
// in index order: the union of those its kubelet annotations name (UUIDs,
// as nri-gpu's device plugin writes them in Allocate, one annotation per
// resource; see kubeletAnnotations), when the container has the device
// nodes of exactly those GPUs (have: those of its nodes that are not its
// claims'), which the kubelet adds from the same Allocate answers. The
// annotations alone are no proof: a runtime that passes pod annotations
// on to containers lets a pod author write them, but a non-privileged pod
// cannot add device nodes to its spec. So an assignment whose GPUs differ
// from have, on a privileged container (which has every node of the
// host), or that the pod's own annotations carry (passed on: the kubelet
// writes the container's, never the pod's) is ignored, and warn says why;
// the container is then handled as if it had no annotation. Without the
// annotations it returns nothing and no warning.
func kubeletAssignment(devs []inventory.GPU, pod *api.PodSandbox, ctr *api.Container, privileged bool, have []inventory.GPU) (gpus []inventory.GPU, warn string) {
	keys, val, ok := kubeletAnnotations(ctr.GetAnnotations())
	if !ok {
		return nil, ""
	}
	ignored := "annotation " + keys + " ignored: "
	if strings.Contains(keys, ", ") {
		ignored = "annotations " + keys + " ignored: "
	}
	switch {
	case privileged:
		return nil, ignored + "the container is privileged (the runtime gave it every host device), so its device nodes cannot back the kubelet's assignment"
	case len(val) > maxKubeletAnnotation:
		return nil, fmt.Sprintf("%svalue is %d bytes long (at most %d)", ignored, len(val), maxKubeletAnnotation)
	case podCarries(pod, ctr, keys):
		return nil, ignored + "the pod's annotations carry it too: a pod annotation the runtime passed on, not the kubelet's"
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
	slices.SortFunc(named, func(a, b inventory.GPU) int { return a.Index - b.Index })
	if !slices.EqualFunc(named, have, func(a, b inventory.GPU) bool { return a.Index == b.Index }) {
		return nil, fmt.Sprintf("%snames GPUs %s but the container has the device nodes of GPUs %s: not the kubelet's assignment (a pod annotation passed on?)",
			ignored, gpuList(named), gpuList(have))
	}
	return named, ""
}

// podCarries reports whether the pod's annotations carry one of the
// container's annotations keys ("k1, k2") with the same value: passed on
// by the runtime (containerd's and CRI-O's pod_annotations), the pod
// author's, not written for the container by the kubelet or nri-gpu.
func podCarries(pod *api.PodSandbox, ctr *api.Container, keys string) bool {
	pa := pod.GetAnnotations()
	if len(pa) == 0 {
		return false
	}
	for k := range strings.SplitSeq(keys, ", ") {
		if v, ok := pa[k]; ok && v == ctr.GetAnnotations()[k] {
			return true
		}
	}
	return false
}

// kubeletAnnotations returns the kubelet's assignment as the container's
// annotations carry it: the keys found ("k1, k2", sorted) and their
// values joined by commas. The keys are alloc.KubeletAnnotation (the one
// key of containers created before one annotation per resource) and every
// alloc.KubeletAnnotationFor key. They are found in one pass over the
// annotations, within maxAnnotations; a container with more (the pod's
// passed on: the kubelet's own are a few) has only its
// alloc.KubeletAnnotation looked up, and so is not the kubelet's where its
// device plugin wrote the per-resource keys.
func kubeletAnnotations(ann map[string]string) (keys, val string, ok bool) {
	if len(ann) > maxAnnotations {
		val, ok = ann[alloc.KubeletAnnotation]
		return alloc.KubeletAnnotation, val, ok
	}
	var found []string
	for k := range ann {
		if strings.HasPrefix(k, alloc.KubeletAnnotation) && (len(k) == len(alloc.KubeletAnnotation) || strings.HasPrefix(k, alloc.KubeletAnnotationPrefix)) {
			found = append(found, k)
		}
	}
	switch len(found) {
	case 0:
		return "", "", false
	case 1:
		return found[0], ann[found[0]], true
	}
	slices.Sort(found)
	vals := make([]string, len(found))
	for i, k := range found {
		vals[i] = ann[k]
	}
	return strings.Join(found, ", "), strings.Join(vals, ","), true
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
