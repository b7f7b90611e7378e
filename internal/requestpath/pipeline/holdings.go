package pipeline

import (
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
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

// Holdings works out what the runtime's containers hold, for rebuilding the
// allocation table; stopped containers hold nothing. A container that
// nri-gpu gave GPUs carries the annotation alloc.Annotation (mode and GPU
// UUIDs). The annotation is not proof: a runtime that passes pod
// annotations on to containers (containerd's and CRI-O's pod_annotations)
// lets a pod author write it. So a GPU the record names counts only when
// the container has that GPU's device node in its spec (Linux.Devices), as
// every container nri-gpu served has; a record that names a GPU without
// its node is reported, and the container counts as made without nri-gpu.
// A container made without nri-gpu (created while it was away, or
// given GPUs by someone else) holds the GPUs whose device nodes are in its
// spec and those named by its CDI devices of the source's kind
// (nvidia.com/gpu=<index, UUID or all>), in the node's sharing mode: nri-gpu
// does not know what was meant, so it applies its own policy (as the
// request path books such GPUs, Path.bookGiven). A privileged container (the
// runtime gave it every host device, see isPrivileged) holds no GPU by its
// device nodes: only by its record or its CDI devices. A record of a
// pod-level request (alloc.Record.Pod) is the pod's: the pod holds the
// GPUs (alloc.PodHolder) as long as one of its containers with such a
// record is not stopped. A container without a record that carries the
// kubelet's assignment (its annotations alloc.KubeletAnnotationFor, one per
// resource, or the older alloc.KubeletAnnotation) with the device nodes of
// exactly its GPUs holds them as the kubelet's (Holding.Kubelet); an
// assignment without those nodes is reported and not trusted
// (kubeletAssignment). A record this nri-gpu cannot read (malformed, or of
// a newer version, alloc.DecodeRecord) books nothing and is reported; the
// container then holds what its device nodes show, as one made without
// nri-gpu. Warnings tell what could not be read. Holdings is HoldingsWith
// on a node without prepared claims.
func Holdings(src adjust.Source, mode sharing.Mode, pods []*api.PodSandbox, ctrs []*api.Container) ([]alloc.Holding, []string) {
	return HoldingsWith(src, mode, nil, pods, ctrs)
}

// HoldingsWith is Holdings on a node with the prepared Dynamic Resource
// Allocation claims prep: a container whose devices the claims gave it
// (their environment entries backed by their device nodes, heldClaims)
// holds none of them, the claims do (ClaimHoldings); it holds only the
// GPUs the runtime gave it besides.
func HoldingsWith(src adjust.Source, mode sharing.Mode, prep *claims.Prepared, pods []*api.PodSandbox, ctrs []*api.Container) ([]alloc.Holding, []string) {
	devs := src.Devices()
	byPod := make(map[string]*api.PodSandbox, len(pods))
	for _, p := range pods {
		byPod[p.GetId()] = p
	}
	var hs []alloc.Holding
	var warnings []string
	// podAt finds a pod's holding in hs, by holder ID.
	podAt := map[string]int{}
	for _, c := range ctrs {
		if c.GetState() == api.ContainerState_CONTAINER_STOPPED {
			continue
		}
		h := alloc.Holding{Holder: HolderOf(byPod[c.GetPodSandboxId()], c), Mode: mode}
		podLevel := false
		if v, ok := c.GetAnnotations()[alloc.Annotation]; ok {
			h.GPUs, h.Mode, podLevel, warnings = recorded(devs, c, h, v, warnings)
		}
		if podLevel {
			h.Holder = alloc.PodHolder(h.Holder.PodID, h.Holder.Namespace, h.Holder.Pod)
			if i, ok := podAt[h.Holder.ID]; ok {
				joinPodHolding(&hs[i], h, c.GetId())
				continue
			}
			podAt[h.Holder.ID] = len(hs)
			h.Members = []string{c.GetId()}
		}
		if len(h.GPUs) == 0 {
			h, warnings = givenHolding(src, prep, c, h, warnings)
		}
		if len(h.GPUs) > 0 {
			hs = append(hs, h)
		}
	}
	return hs, warnings
}

// recorded returns what the container's record v (alloc.Annotation) holds
// of the inventory: the GPUs it names whose device nodes the container
// has, its mode and whether they are its pod's. A record that cannot be
// read (malformed, or of a version this nri-gpu does not know: written by
// a newer one) or that names a GPU without its node holds nothing; the
// warning says why. Other fields come back as in h.
func recorded(devs []inventory.GPU, c *api.Container, h alloc.Holding, v string, warnings []string) ([]int, sharing.Mode, bool, []string) {
	rec, mode, err := alloc.DecodeRecord(v)
	if err != nil {
		return nil, h.Mode, false, append(warnings, h.Holder.String()+": "+err.Error())
	}
	var gpus []int
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
	if len(unknown) == 1 {
		warnings = append(warnings, h.Holder.String()+": holds GPU "+unknown[0]+", which the inventory does not have")
	} else if len(unknown) > 1 {
		warnings = append(warnings, h.Holder.String()+": holds GPUs "+few(unknown)+", which the inventory does not have")
	}
	if len(forged) > 0 {
		// Not nri-gpu's record (or not all of it): none of it counts.
		return nil, h.Mode, false, append(warnings, h.Holder.String()+": annotation "+alloc.Annotation+" names GPUs whose device nodes the container does not have ("+
			few(forged)+"): not counted")
	}
	return gpus, mode, rec.Pod && len(gpus) > 0, warnings
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

// givenHolding returns h holding what the runtime gave a container that
// holds nothing by a record: the kubelet's assignment (kubeletAssignment),
// else the GPUs of its device nodes and CDI devices (foreignGPUs), as the
// request path books them (bookGiven); for a container of prepared
// claims, the GPUs of its device nodes that are not the claims' (as
// bookClaims books them).
func givenHolding(src adjust.Source, prep *claims.Prepared, c *api.Container, h alloc.Holding, warnings []string) (alloc.Holding, []string) {
	priv := isPrivileged(c)
	held, forged := heldClaims(src, prep, c)
	if len(forged) > 0 {
		warnings = append(warnings, h.Holder.String()+": "+forgedWarning(forged))
	}
	if len(held) > 0 {
		h.GPUs, warnings = foreignGPUs(src, c, priv, h.Holder, warnings)
		h.GPUs = slices.DeleteFunc(h.GPUs, func(i int) bool {
			return slices.ContainsFunc(held, func(d claimed) bool { return d.unit.Index == i })
		})
		h.Runtime = len(h.GPUs) > 0
		return h, warnings
	}
	kub, warn := kubeletAssignment(src.Devices(), c, priv)
	if warn != "" {
		warnings = append(warnings, h.Holder.String()+": "+warn)
	}
	if kub != nil {
		h.GPUs, h.Kubelet = indexes(kub), true
	} else {
		h.GPUs, warnings = foreignGPUs(src, c, priv, h.Holder, warnings)
	}
	h.Runtime = len(h.GPUs) > 0
	return h, warnings
}

// few joins at most 8 names, and says how many more there are: a record
// may be forged, and a log line should stay a line.
func few(names []string) string {
	const most = 8
	if len(names) <= most {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:most], ", ") + " and " + strconv.Itoa(len(names)-most) + " more"
}

// hasGPUNode reports whether the container's spec has g's device node, by
// number (a character device of g's major and minor); for a MIG device,
// its parent's node and its compute instance's capability node.
func hasGPUNode(c *api.Container, g inventory.GPU) bool {
	if !ctrHasNode(c, g.Node) {
		return false
	}
	return g.MIG == nil || ctrHasNode(c, g.MIG.CINode)
}

func ctrHasNode(c *api.Container, n inventory.DeviceNode) bool {
	for _, d := range c.GetLinux().GetDevices() {
		if (d.GetType() == "c" || d.GetType() == "") && d.GetMajor() == n.Major && d.GetMinor() == n.Minor {
			return true
		}
	}
	return false
}

// foreignGPUs returns the GPUs a container got other than through nri-gpu:
// device nodes of the source in its spec (none for a privileged
// container, which has every node of the host), and CDI devices of its
// kind; in index order, without duplicates.
func foreignGPUs(src adjust.Source, c *api.Container, privileged bool, h alloc.Holder, warnings []string) ([]int, []string) {
	devs := src.Devices()
	var idx []int
	for _, g := range devs {
		if !privileged && hasGPUNode(c, g) {
			idx = append(idx, g.Index)
		}
	}
	for _, d := range c.GetCDIDevices() {
		vendor, class, id, err := parser.ParseQualifiedName(d.GetName())
		if err != nil || !nvidiaCDIKind(vendor+"/"+class, src.Kind()) {
			continue
		}
		if id == "all" {
			for _, g := range devs {
				idx = append(idx, g.Index)
			}
			continue
		}
		g, ok := findGPU(devs, id)
		if !ok {
			warnings = append(warnings, h.String()+": CDI device "+d.GetName()+" names no GPU or MIG device of the inventory")
			continue
		}
		idx = append(idx, g.Index)
	}
	slices.Sort(idx)
	return slices.Compact(idx), warnings
}

// findGPU finds a GPU by index, UUID (case-insensitive) or the CDI name
// of another vendor's device, or a MIG device by UUID or <gpu>:<mig>.
func findGPU(devs []inventory.GPU, id string) (inventory.GPU, bool) {
	if id == "" {
		return inventory.GPU{}, false
	}
	n, err := strconv.Atoi(id)
	for _, g := range devs {
		if err == nil && g.Index == n && g.MIG == nil || strings.EqualFold(g.UUID, id) || g.Name == id || g.MIG != nil && g.MIG.Name() == id {
			return g, true
		}
	}
	return inventory.GPU{}, false
}
