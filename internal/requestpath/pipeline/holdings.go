package pipeline

import (
	"slices"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// HolderOf names the container ctr of pod in the allocation table.
func HolderOf(pod *api.PodSandbox, ctr *api.Container) alloc.Holder {
	podID := ctr.GetPodSandboxId()
	if podID == "" {
		podID = pod.GetId()
	}
	return alloc.Holder{
		ID:        ctr.GetId(),
		PodID:     podID,
		Namespace: pod.GetNamespace(),
		Pod:       pod.GetName(),
		Container: containerName(ctr),
	}
}

// Holdings works out what the runtime's containers hold, for rebuilding
// the allocation table at Synchronize; stopped containers hold nothing.
// Each container is classified as at CreateContainer (classify), and
// holds what the request path booked for it:
//
//   - a container of the kubelet's assignment, of prepared claims (with
//     the GPUs the runtime gave it besides), or of GPUs the runtime gave
//     it (device nodes, CDI devices of the source's kind) holds those
//     GPUs as the runtime's (givenHolding), the claims' own devices
//     being held by the claims (ClaimHoldings); a stale claim device
//     (one whose GPU changed) holds nothing;
//   - a container that nri-gpu answered with a request of its own
//     carries its record (alloc.Annotation: mode, GPU UUIDs, whether the
//     pod's) and holds what it names; a record that names no GPU (a
//     management container) holds nothing, though the container has
//     every GPU's node. The record is not proof: a runtime that passes
//     pod annotations on to containers (containerd's and CRI-O's
//     pod_annotations) lets a pod author write it. So it is not read for
//     the kinds above (nri-gpu writes none for them), not when the pod's
//     annotations carry it too, and counts only when the container has
//     every named GPU's device node; a record that cannot be read
//     (malformed, or of a newer version, alloc.DecodeRecord) or that is
//     not counted is reported, and the container holds what the runtime
//     gave it, as one made without nri-gpu.
//
// A record of a pod-level request (alloc.Record.Pod) is the pod's: the
// pod holds the GPUs (alloc.PodHolder) as long as one of its containers
// with such a record is not stopped. Warnings tell what could not be read
// or was not trusted.
func (p *Path) Holdings(pods []*api.PodSandbox, ctrs []*api.Container) ([]alloc.Holding, []string) {
	devs := p.Source.Devices()
	byPod := make(map[string]*api.PodSandbox, len(pods))
	for _, pod := range pods {
		byPod[pod.GetId()] = pod
	}
	var hs []alloc.Holding
	var warnings []string
	// podAt finds a pod's holding in hs, by holder ID.
	podAt := map[string]int{}
	for _, c := range ctrs {
		if c.GetState() == api.ContainerState_CONTAINER_STOPPED {
			continue
		}
		pod := byPod[c.GetPodSandboxId()]
		holder := HolderOf(pod, c)
		g := p.classify(pod, c)
		for _, w := range append(g.warnings, staleWarnings(g.stale)...) {
			warnings = append(warnings, holder.String()+": "+w)
		}
		h, answered, podLevel := alloc.Holding{Holder: holder}, false, false
		if v, ok := c.GetAnnotations()[alloc.Annotation]; ok && (g.kind() == kindOwn || g.kind() == kindRuntime) {
			var why string
			h.GPUs, h.Mode, podLevel, answered, why = recorded(devs, pod, c, v)
			if why != "" {
				warnings = append(warnings, holder.String()+": "+why)
			}
		}
		if !answered {
			h = p.givenHolding(holder, g)
		}
		if podLevel {
			h.Holder = alloc.PodHolder(holder.PodID, holder.Namespace, holder.Pod)
			if i, ok := podAt[h.Holder.ID]; ok {
				joinPodHolding(&hs[i], h, c.GetId())
				continue
			}
			podAt[h.Holder.ID] = len(hs)
			h.Members = []string{c.GetId()}
		}
		if len(h.GPUs) > 0 {
			hs = append(hs, h)
		}
	}
	return hs, warnings
}

// recorded reads the container's record v (alloc.Annotation): the GPUs
// of the inventory it names, its mode, whether they are its pod's, and
// whether the record counts (answered: nri-gpu answered the container,
// and what it holds is what the record names, none for a record of no
// GPU). A record that the pod's annotations carry too (passed on), that
// cannot be read (malformed, or of a version this nri-gpu does not know:
// written by a newer one) or that names a GPU without its node does not
// count; why says so. A named GPU the inventory no longer has is reported
// and left out.
func recorded(devs []inventory.GPU, pod *api.PodSandbox, c *api.Container, v string) (gpus []int, mode sharing.Mode, podLevel, answered bool, why string) {
	if pv, ok := pod.GetAnnotations()[alloc.Annotation]; ok && pv == v {
		return nil, 0, false, false, "annotation " + alloc.Annotation + " ignored: the pod's annotations carry it too: a pod annotation the runtime passed on, not nri-gpu's record"
	}
	rec, mode, err := alloc.DecodeRecord(v)
	if err != nil {
		return nil, 0, false, false, err.Error()
	}
	var unknown, forged []string
	for _, u := range rec.GPUs {
		g, ok := findGPU(devs, u)
		switch {
		case !ok:
			unknown = append(unknown, u)
		case !hasGPUNode(c, g):
			forged = append(forged, u)
		default:
			gpus = append(gpus, g.Index)
		}
	}
	if len(forged) > 0 {
		// Not nri-gpu's record (or not all of it): none of it counts.
		return nil, 0, false, false, "annotation " + alloc.Annotation + " names GPUs whose device nodes the container does not have (" + few(forged) + "): not counted"
	}
	switch {
	case len(unknown) == 1:
		why = "holds GPU " + unknown[0] + ", which the inventory does not have"
	case len(unknown) > 1:
		why = "holds GPUs " + few(unknown) + ", which the inventory does not have"
	}
	return gpus, mode, rec.Pod && len(gpus) > 0, len(gpus) > 0 || len(rec.GPUs) == 0, why
}

// joinPodHolding adds container id's record h of its pod's GPUs to the
// pod's holding: every container of the pod records the pod's GPUs.
func joinPodHolding(pod *alloc.Holding, h alloc.Holding, id string) {
	pod.GPUs = append(pod.GPUs, h.GPUs...)
	slices.Sort(pod.GPUs)
	pod.GPUs = slices.Compact(pod.GPUs)
	pod.Members = append(pod.Members, id)
	if h.Mode == sharing.Exclusive {
		pod.Mode = sharing.Exclusive
	}
}
