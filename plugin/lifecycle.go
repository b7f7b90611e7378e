package plugin

import (
	"context"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// events are the NRI events the plugin subscribes to: creation to inject
// and book GPUs, the others to release them.
var events = []string{"CreateContainer", "StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox"}

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
		Container: ctr.GetName(),
	}
}

// Synchronize handles the runtime's Synchronize request, sent once per
// connection with the pods and containers that exist: the allocation table
// is rebuilt from them (see Holdings), so that it survives restarts of the
// plugin and of the runtime without a state file.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	st := p.state.Load()
	hs, warnings := Holdings(st.snap, st.sharing, pods, ctrs)
	for _, w := range warnings {
		p.log.Warn("synchronize: " + w)
	}
	p.table.Rebuild(hs)
	p.log.WithFields(logrus.Fields{"pods": len(pods), "containers": len(ctrs), "holders": len(hs)}).Info("synchronized with the runtime")
	p.logTable("rebuilt from the runtime's containers")
	p.synced.Store(true)
	p.cleanLibraryCache(ctrs)
	p.observer().Connected()
	return nil, nil
}

// StopContainer releases the GPUs of a container that stopped (or whose
// creation failed after the plugin answered: the runtime then stops and
// removes it).
func (p *Plugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.release(HolderOf(pod, ctr), "stopped")
	return nil, nil
}

// RemoveContainer releases the GPUs of a removed container.
func (p *Plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.release(HolderOf(pod, ctr), "removed")
	return nil
}

// StopPodSandbox releases the GPUs of every container of a stopped pod.
func (p *Plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.releasePod(pod, "stopped")
	return nil
}

// RemovePodSandbox releases the GPUs of every container of a removed pod.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.releasePod(pod, "removed")
	return nil
}

func (p *Plugin) release(h alloc.Holder, why string) {
	if p.table.Release(h.ID) {
		p.logTable("released by " + h.String() + " (" + why + ")")
	}
}

func (p *Plugin) releasePod(pod *api.PodSandbox, why string) {
	if n := p.table.ReleasePod(pod.GetId()); n > 0 {
		p.logTable("released by the " + strconv.Itoa(n) + " containers of pod " + pod.GetNamespace() + "/" + pod.GetName() + " (" + why + ")")
	}
}

// logTable logs the allocation table after a change.
func (p *Plugin) logTable(change string) {
	if !p.log.IsLevelEnabled(logrus.InfoLevel) {
		return
	}
	p.log.WithField("table", alloc.Summary(p.table.State())).Info("allocation: " + change)
}

// Holdings works out what the runtime's containers hold, for rebuilding the
// allocation table; stopped containers hold nothing. A container that
// nri-gpu gave GPUs carries the annotation alloc.Annotation (mode and GPU
// UUIDs). A container made without nri-gpu (created while it was away, or
// given GPUs by someone else) holds the GPUs whose device nodes are in its
// spec and those named by its CDI devices (nvidia.com/gpu=<index, UUID or
// all>), in the node's sharing mode: nri-gpu does not know what was meant,
// so it applies its own policy. Warnings tell what could not be read.
func Holdings(snap *inventory.Snapshot, sharing alloc.Mode, pods []*api.PodSandbox, ctrs []*api.Container) ([]alloc.Holding, []string) {
	byPod := make(map[string]*api.PodSandbox, len(pods))
	for _, p := range pods {
		byPod[p.GetId()] = p
	}
	var hs []alloc.Holding
	var warnings []string
	for _, c := range ctrs {
		if c.GetState() == api.ContainerState_CONTAINER_STOPPED {
			continue
		}
		h := alloc.Holding{Holder: HolderOf(byPod[c.GetPodSandboxId()], c), Mode: sharing}
		if v, ok := c.GetAnnotations()[alloc.Annotation]; ok {
			rec, mode, err := alloc.DecodeRecord(v)
			if err != nil {
				warnings = append(warnings, h.Holder.String()+": "+err.Error())
			} else {
				h.Mode = mode
				for _, u := range rec.GPUs {
					g, ok := findGPU(snap, u)
					if !ok {
						warnings = append(warnings, h.Holder.String()+": holds GPU "+u+", which the inventory does not have")
						continue
					}
					h.GPUs = append(h.GPUs, g.Index)
				}
			}
		}
		if len(h.GPUs) == 0 {
			h.GPUs, warnings = foreignGPUs(snap, c, h.Holder, warnings)
		}
		if len(h.GPUs) > 0 {
			hs = append(hs, h)
		}
	}
	return hs, warnings
}

// foreignGPUs returns the GPUs a container got other than through nri-gpu:
// GPU device nodes in its spec, and NVIDIA CDI devices.
func foreignGPUs(snap *inventory.Snapshot, c *api.Container, h alloc.Holder, warnings []string) ([]int, []string) {
	var idx []int
	for _, d := range c.GetLinux().GetDevices() {
		for _, g := range snap.GPUs {
			if (d.GetType() == "c" || d.GetType() == "") && d.GetMajor() == g.Node.Major && d.GetMinor() == g.Node.Minor {
				idx = append(idx, g.Index)
			}
		}
	}
	for _, d := range c.GetCDIDevices() {
		kind, id, ok := strings.Cut(d.GetName(), "=")
		if !ok || kind != "nvidia.com/gpu" {
			continue
		}
		if id == "all" {
			for _, g := range snap.GPUs {
				idx = append(idx, g.Index)
			}
			continue
		}
		g, ok := findGPU(snap, id)
		if !ok {
			warnings = append(warnings, h.String()+": CDI device "+d.GetName()+" names no GPU of the inventory (MIG devices are not counted)")
			continue
		}
		idx = append(idx, g.Index)
	}
	return idx, warnings
}

// findGPU finds a GPU by index, UUID (case-insensitive) or the CDI name
// of another vendor's device.
func findGPU(snap *inventory.Snapshot, id string) (inventory.GPU, bool) {
	if id == "" {
		return inventory.GPU{}, false
	}
	n, err := strconv.Atoi(id)
	for _, g := range snap.GPUs {
		if err == nil && g.Index == n || strings.EqualFold(g.UUID, id) || g.Name == id {
			return g, true
		}
	}
	return inventory.GPU{}, false
}
