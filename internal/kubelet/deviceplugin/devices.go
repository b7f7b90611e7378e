package deviceplugin

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// devices is what the plugin advertises: every device seen since nri-gpu
// started, Healthy while the node's current state has it and its driver
// can serve requests, else Unhealthy. A GPU that a rediscovery no longer
// finds (its device node or its /proc/driver/nvidia/gpus entry gone) stays
// listed, Unhealthy, so that the kubelet stops handing it out without
// forgetting the pods that hold it; it is Healthy again when discovery
// sees it again. A GPU shared as replicas is listed as each of its
// replicas, <uuid>::<n>, all with the GPU's health (and, under MPS, all
// Unhealthy while its MPS control daemon is not ready).
type devices struct {
	log *logrus.Entry
	// resource is the plugin's resource; cfg, when set, is the device
	// plugin configuration it comes from, whose sharing plan (the
	// state's, or one of cfg for a state without one) picks the devices.
	// Without cfg, sel picks them (nil: all), each whole.
	resource string
	cfg      *config.DevicePlugin
	sel      func(inventory.GPU) bool
	mu       sync.Mutex
	// known is every device seen, as last seen, by device ID; order
	// lists their IDs in the order they are advertised.
	known map[string]entry
	order []string
	// present is the IDs of the current state's devices; problem, when
	// not empty, is why none of them can be served (no driver).
	present map[string]bool
	problem string
	// unhealthy are the current state's unhealthy GPUs (XID health, MPS
	// daemons not ready), by GPU ID.
	unhealthy map[string]string
	// policy is the sharing plan's sharedDevicesAllocationPolicy.
	policy string
	// list is the last list advertised; changed is closed when a new one
	// replaces it.
	list    []*pluginapi.Device
	changed chan struct{}
}

// entry is one advertised device: a GPU (or MIG device) whole, or one
// replica of it.
type entry struct {
	gpu inventory.GPU
	// share is how the GPU is shared; nil for a GPU handed out whole.
	share *sharing.Share
}

func newDevices(log *logrus.Entry, o Options) *devices {
	return &devices{log: log, resource: o.ResourceName, cfg: o.Config, sel: o.Select, known: map[string]entry{}, present: map[string]bool{}, changed: make(chan struct{})}
}

// units returns the devices of st this resource advertises, and the
// sharing plan they come from (nil without one: each device whole).
func (d *devices) units(st *node.State) ([]sharing.Unit, *sharing.Plan) {
	plan := st.Shares
	if plan == nil && d.cfg != nil {
		plan = sharing.NewPlan(d.cfg.SharingSpec(), st.Source.Devices())
	}
	var out []sharing.Unit
	if plan == nil {
		for _, g := range st.Source.Devices() {
			if d.sel == nil || d.sel(g) {
				out = append(out, sharing.Unit{GPU: g, Resource: d.resource, Replicas: 1})
			}
		}
		return out, nil
	}
	d.policy = plan.Policy
	for _, u := range plan.Units {
		if u.Resource == d.resource {
			out = append(out, u)
		}
	}
	return out, plan
}

// update takes the devices of a state that became current and, when their
// list or health changed, tells the kubelet's streams. It is cheap and
// does not block (a node.Node subscriber).
func (d *devices) update(st *node.State) {
	d.mu.Lock()
	defer d.mu.Unlock()
	present, seen := map[string]bool{}, map[string]bool{}
	unhealthy := maps.Clone(st.Unhealthy)
	var current []string
	units, plan := d.units(st)
	for _, u := range units {
		gid := u.GPU.ID()
		if gid == "" || seen[gid] {
			continue
		}
		seen[gid] = true
		var share *sharing.Share
		if sh, ok := plan.Share(gid); ok {
			share = &sh
			if sh.MPS != nil && !sh.MPS.Ready && unhealthy[gid] == "" {
				if unhealthy == nil {
					unhealthy = map[string]string{}
				}
				unhealthy[gid] = "its MPS control daemon is not ready: " + sh.MPS.Why
			}
		}
		for _, id := range deviceIDs(gid, u.Replicas) {
			present[id] = true
			current = append(current, id)
			if _, ok := d.known[id]; !ok {
				d.order = append(d.order, id)
			}
			d.known[id] = entry{gpu: u.GPU, share: share}
		}
	}
	problem := st.Source.Problem()
	// Advertised order: the current state's, then the devices gone from
	// it in the order they were first seen.
	order := current
	for _, id := range d.order {
		if !present[id] {
			order = append(order, id)
		}
	}
	d.order = order
	d.present, d.problem, d.unhealthy = present, problem, unhealthy
	list := make([]*pluginapi.Device, 0, len(order))
	for _, id := range order {
		list = append(list, d.device(id))
	}
	if slices.EqualFunc(list, d.list, func(a, b *pluginapi.Device) bool {
		return a.ID == b.ID && a.Health == b.Health && a.Topology.String() == b.Topology.String()
	}) {
		return
	}
	d.list = list
	close(d.changed)
	d.changed = make(chan struct{})
}

// deviceIDs returns the device IDs of a GPU advertised as replicas
// devices: its ID when 1, else its replicas' IDs.
func deviceIDs(id string, replicas int) []string {
	if replicas <= 1 {
		return []string{id}
	}
	out := make([]string, replicas)
	for i := range out {
		out[i] = sharing.ReplicaID(id, i)
	}
	return out
}

// device returns the advertised device id with its health, logging a
// change of its GPU's health once (on its first device). The caller
// holds mu.
func (d *devices) device(id string) *pluginapi.Device {
	e := d.known[id]
	why := d.why(id, e.gpu)
	health := pluginapi.Healthy
	if why != "" {
		health = pluginapi.Unhealthy
	}
	dev := &pluginapi.Device{ID: id, Health: health}
	if e.gpu.NUMANode >= 0 {
		dev.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(e.gpu.NUMANode)}}}
	}
	if was := d.health(id); was != "" && was != health && (e.share == nil || strings.HasSuffix(id, sharing.ReplicaSeparator+"0")) {
		l := d.log.WithFields(logrus.Fields{"device": e.gpu.ID(), "bus": e.gpu.BusID})
		if health == pluginapi.Healthy {
			l.Info("GPU healthy again")
		} else {
			l.Warnf("GPU unhealthy: %s", why)
		}
	}
	return dev
}

// why says why device id (of GPU g) cannot be handed out now, "" if it
// can. The caller holds mu.
func (d *devices) why(id string, g inventory.GPU) string {
	switch {
	case !d.present[id]:
		return "no longer found by discovery (device node or driver entry gone)"
	case d.problem != "":
		return d.problem
	}
	return d.unhealthy[g.ID()]
}

// health returns the health last advertised for id; "" if none. The
// caller holds mu.
func (d *devices) health(id string) string {
	for _, dev := range d.list {
		if dev.ID == id {
			return dev.Health
		}
	}
	return ""
}

// current returns the devices to advertise and a channel closed when they
// change. The devices are never modified.
func (d *devices) current() ([]*pluginapi.Device, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.list, d.changed
}

// count returns how many devices are advertised, and how many of them
// are healthy.
func (d *devices) count() (n, healthy int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dev := range d.list {
		if dev.Health == pluginapi.Healthy {
			healthy++
		}
	}
	return len(d.list), healthy
}

// snapshot returns every device seen, by device ID, and the allocation
// policy of replicas.
func (d *devices) snapshot() (map[string]entry, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.known), d.policy
}

// given is what one container was given: its GPUs, in the advertised
// order, and for each shared one how many of its replicas.
type given struct {
	gpus   []inventory.GPU
	shares []sharing.Share
	counts map[string]int
}

// allocatable returns what ids give a container when each is a device of
// the node that is healthy now: the GPUs they name, once each; else an
// error naming the first that is not and what the node has. A shared
// resource refuses more than one device when failRequestsGreaterThanOne
// says so, and, under MPS, replicas of more than one GPU (a process talks
// to one MPS daemon).
func (d *devices) allocatable(ids []string) (given, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := given{counts: map[string]int{}}
	for _, id := range ids {
		e, ok := d.known[id]
		if !ok {
			return given{}, fmt.Errorf("unknown device %s (devices of the node: %s)", quote(id), d.names())
		}
		if why := d.why(id, e.gpu); why != "" {
			return given{}, fmt.Errorf("device %s (%s) is unhealthy: %s", quote(id), e.gpu.BusID, why)
		}
		if e.share != nil && e.share.FailRequestsGreaterThanOne && len(ids) > 1 {
			// NVIDIA's device plugin's words.
			return given{}, fmt.Errorf("maximum request size for shared resources is 1; found %d (devicePlugin.sharing: failRequestsGreaterThanOne)", len(ids))
		}
		gid := e.gpu.ID()
		if out.counts[gid] == 0 {
			out.gpus = append(out.gpus, e.gpu)
			if e.share != nil {
				out.shares = append(out.shares, *e.share)
			}
		}
		out.counts[gid]++
	}
	if len(out.shares) > 1 && out.shares[0].Strategy == sharing.MPS {
		return given{}, fmt.Errorf("replicas of %d GPUs shared with MPS (%s, %s, ...): a process reaches one MPS control daemon (CUDA_MPS_PIPE_DIRECTORY), so a container gets replicas of one GPU", len(out.shares), out.shares[0].UUID, out.shares[1].UUID)
	}
	slices.SortStableFunc(out.gpus, func(a, b inventory.GPU) int { return cmp.Compare(d.rank(a.ID()), d.rank(b.ID())) })
	slices.SortStableFunc(out.shares, func(a, b sharing.Share) int { return cmp.Compare(d.rank(a.UUID), d.rank(b.UUID)) })
	return out, nil
}

// rank is the position of GPU id's first device in the advertised order.
// The caller holds mu.
func (d *devices) rank(id string) int {
	for i, o := range d.order {
		if d.known[o].gpu.ID() == id {
			return i
		}
	}
	return len(d.order)
}

// names lists the known devices for an error message: a GPU's replicas
// as one entry (<uuid>::0-3), at most maxNames entries. The caller holds
// mu.
func (d *devices) names() string {
	if len(d.order) == 0 {
		return "none"
	}
	var out []string
	for i := 0; i < len(d.order); {
		id := d.order[i]
		uuid, n, ok := sharing.SplitReplicaID(id)
		j := i + 1
		for ok && j < len(d.order) {
			u, m, ok2 := sharing.SplitReplicaID(d.order[j])
			if !ok2 || u != uuid || m != n+(j-i) {
				break
			}
			j++
		}
		if j-i > 1 {
			id = fmt.Sprintf("%s::%d-%d", uuid, n, n+j-i-1)
		}
		if len(out) == maxNames {
			out = append(out, "...")
			break
		}
		out = append(out, id)
		i = j
	}
	return strings.Join(out, ", ")
}

// maxNames bounds the devices an error message lists.
const maxNames = 64

// maxQuoted bounds how much of a device ID an error message repeats.
const maxQuoted = 64

// quote quotes s for a message, cut to maxQuoted bytes.
func quote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "..."
	}
	return strconv.Quote(s)
}

// deviceNodes returns the device nodes of gpus: a GPU's node; a MIG
// device's parent node (once) and its GPU and compute instance's
// capability nodes.
func deviceNodes(gpus []inventory.GPU) []inventory.DeviceNode {
	var out []inventory.DeviceNode
	add := func(n inventory.DeviceNode) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	for _, g := range gpus {
		add(g.Node)
		if g.MIG != nil {
			add(g.MIG.GINode)
			add(g.MIG.CINode)
		}
	}
	return out
}

// Allocate answers the kubelet with, for each container, the device nodes
// of the GPUs it was given (read-write; /dev/nvidia<minor> in the
// container, the same node under Options.DevRoot on the host, hostPath)
// and the annotation AllocationAnnotation(resource) naming them, each once however
// many of its replicas the container was given. Replicas also get the
// annotation alloc.KubeletSharedAnnotation(resource), which tells the NRI
// side how many replicas of which shared GPU. Driver files and environment
// are not given here: the NRI side adds them when the container is
// created. An ID that is no healthy device of the node, or a request the
// sharing configuration refuses, fails the call, naming why.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for i, cr := range req.GetContainerRequests() {
		g, err := p.devices.allocatable(cr.GetDevicesIds())
		if err != nil {
			p.log.WithError(err).Warn("Allocate refused")
			return nil, status.Errorf(codes.InvalidArgument, "nri-gpu device plugin: resource %s: container request %d: %v", p.o.ResourceName, i, err)
		}
		cresp := &pluginapi.ContainerAllocateResponse{Annotations: map[string]string{}}
		ids := make([]string, 0, len(g.gpus))
		for _, n := range deviceNodes(g.gpus) {
			cresp.Devices = append(cresp.Devices, &pluginapi.DeviceSpec{ContainerPath: n.Path, HostPath: p.hostPath(n.Path), Permissions: "rw"})
		}
		for _, gpu := range g.gpus {
			ids = append(ids, gpu.ID())
		}
		cresp.Annotations[AllocationAnnotation(p.o.ResourceName)] = strings.Join(ids, ",")
		if len(g.shares) > 0 {
			ks := alloc.KubeletShares{Strategy: g.shares[0].Strategy}
			for _, sh := range g.shares {
				ks.Shares = append(ks.Shares, alloc.KubeletShare{UUID: sh.UUID, Given: g.counts[sh.UUID], Replicas: sh.Replicas})
			}
			cresp.Annotations[alloc.KubeletSharedAnnotation(p.o.ResourceName)] = ks.String()
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
		p.log.WithField("devices", ids).Debug("allocated")
	}
	return resp, nil
}

// hostPath is the host's path of the device node that discovery found at
// p (/dev/<name>, the path it has in a container): <name> under
// Options.DevRoot. A path outside /dev (discovery finds none) is kept.
func (p *Plugin) hostPath(node string) string {
	rel, ok := strings.CutPrefix(node, "/dev/")
	if !ok || rel == "" {
		return node
	}
	return filepath.Join(p.o.DevRoot, rel)
}
