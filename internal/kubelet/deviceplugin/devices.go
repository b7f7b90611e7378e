package deviceplugin

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// devices is what the plugin advertises: every GPU seen since nri-gpu
// started, Healthy while the node's current state has it and its driver
// can serve requests, else Unhealthy. A GPU that a rediscovery no longer
// finds (its device node or its /proc/driver/nvidia/gpus entry gone) stays
// listed, Unhealthy, so that the kubelet stops handing it out without
// forgetting the pods that hold it; it is Healthy again when discovery
// sees it again.
type devices struct {
	log *logrus.Entry
	// sel picks the devices advertised; nil: all.
	sel func(inventory.GPU) bool
	mu  sync.Mutex
	// known is every GPU seen, as last seen, by ID; order lists their
	// IDs in the order they are advertised.
	known map[string]inventory.GPU
	order []string
	// present is the IDs of the current state's GPUs; problem, when not
	// empty, is why none of them can be served (no driver).
	present map[string]bool
	problem string
	// unhealthy are the current state's unhealthy devices (XID health).
	unhealthy map[string]string
	// list is the last list advertised; changed is closed when a new one
	// replaces it.
	list    []*pluginapi.Device
	changed chan struct{}
}

func newDevices(log *logrus.Entry, sel func(inventory.GPU) bool) *devices {
	return &devices{log: log, sel: sel, known: map[string]inventory.GPU{}, present: map[string]bool{}, changed: make(chan struct{})}
}

// update takes the GPUs of a state that became current and, when their
// list or health changed, tells the kubelet's streams. It is cheap and
// does not block (a node.Node subscriber).
func (d *devices) update(st *node.State) {
	d.mu.Lock()
	defer d.mu.Unlock()
	present := map[string]bool{}
	var current []string
	for _, g := range st.Source.Devices() {
		id := g.ID()
		if id == "" || present[id] || d.sel != nil && !d.sel(g) {
			continue
		}
		present[id] = true
		current = append(current, id)
		if _, ok := d.known[id]; !ok {
			d.order = append(d.order, id)
		}
		d.known[id] = g
	}
	problem := st.Source.Problem()
	// Advertised order: the current state's, then the GPUs gone from it
	// in the order they were first seen.
	order := current
	for _, id := range d.order {
		if !present[id] {
			order = append(order, id)
		}
	}
	d.order = order
	list := make([]*pluginapi.Device, 0, len(order))
	for _, id := range order {
		g := d.known[id]
		health := pluginapi.Healthy
		why := ""
		switch {
		case !present[id]:
			health, why = pluginapi.Unhealthy, "no longer found by discovery (device node or driver entry gone)"
		case problem != "":
			health, why = pluginapi.Unhealthy, problem
		case st.Unhealthy[id] != "":
			health, why = pluginapi.Unhealthy, st.Unhealthy[id]
		}
		dev := &pluginapi.Device{ID: id, Health: health}
		if g.NUMANode >= 0 {
			dev.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMANode)}}}
		}
		if was := d.health(id); was != "" && was != health {
			e := d.log.WithFields(logrus.Fields{"device": id, "bus": g.BusID})
			if health == pluginapi.Healthy {
				e.Info("GPU healthy again")
			} else {
				e.Warnf("GPU unhealthy: %s", why)
			}
		}
		list = append(list, dev)
	}
	d.present, d.problem, d.unhealthy = present, problem, st.Unhealthy
	if slices.EqualFunc(list, d.list, func(a, b *pluginapi.Device) bool {
		return a.ID == b.ID && a.Health == b.Health && a.Topology.String() == b.Topology.String()
	}) {
		return
	}
	d.list = list
	close(d.changed)
	d.changed = make(chan struct{})
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

// gpus returns every GPU seen, by ID.
func (d *devices) gpus() map[string]inventory.GPU {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]inventory.GPU, len(d.known))
	for id, g := range d.known {
		out[id] = g
	}
	return out
}

// allocatable returns the GPUs ids name, in the advertised order, when
// each is a GPU of the node that is healthy now; else an error naming the
// first that is not and what the node has.
func (d *devices) allocatable(ids []string) ([]inventory.GPU, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	want := map[string]bool{}
	for _, id := range ids {
		g, ok := d.known[id]
		switch {
		case !ok:
			return nil, fmt.Errorf("unknown device %s (devices of the node: %s)", quote(id), d.names())
		case !d.present[id]:
			return nil, fmt.Errorf("device %s (%s) is unhealthy: no longer found by discovery", quote(id), g.BusID)
		case d.problem != "":
			return nil, fmt.Errorf("device %s (%s) is unhealthy: %s", quote(id), g.BusID, d.problem)
		case d.unhealthy[id] != "":
			return nil, fmt.Errorf("device %s (%s) is unhealthy: %s", quote(id), g.BusID, d.unhealthy[id])
		}
		want[id] = true
	}
	var out []inventory.GPU
	for _, id := range d.order {
		if want[id] {
			out = append(out, d.known[id])
		}
	}
	return out, nil
}

// names lists the known devices for an error message. The caller holds
// mu.
func (d *devices) names() string {
	if len(d.order) == 0 {
		return "none"
	}
	return strings.Join(d.order, ", ")
}

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
// container, the same node under Options.DevRoot on the host, hostPath) and the
// annotation AllocationAnnotation of the resource naming them. Driver files and environment are not given here: the NRI side
// adds them when the container is created. An ID that is no healthy GPU of
// the node fails the call, naming it.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for i, cr := range req.GetContainerRequests() {
		gpus, err := p.devices.allocatable(cr.GetDevicesIds())
		if err != nil {
			p.log.WithError(err).Warn("Allocate refused")
			return nil, status.Errorf(codes.InvalidArgument, "nri-gpu device plugin: resource %s: container request %d: %v", p.o.ResourceName, i, err)
		}
		cresp := &pluginapi.ContainerAllocateResponse{Annotations: map[string]string{}}
		ids := make([]string, 0, len(gpus))
		for _, n := range deviceNodes(gpus) {
			cresp.Devices = append(cresp.Devices, &pluginapi.DeviceSpec{ContainerPath: n.Path, HostPath: p.hostPath(n.Path), Permissions: "rw"})
		}
		for _, g := range gpus {
			ids = append(ids, g.ID())
		}
		cresp.Annotations[AllocationAnnotation(p.o.ResourceName)] = strings.Join(ids, ",")
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
