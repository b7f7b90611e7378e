// Package scale is the cluster-scale bench (make bench-scale): a real
// control plane with many simulated GPU nodes (Node objects that kwok
// serves), each with the ResourceSlices a GPU driver publishes for a node
// of 8 GPUs, and the scheduler's throughput of claim pods over them, for
// nri-gpu's published devices against NVIDIA's DRA driver's and against
// pods without GPUs.
//
// nri-gpu's devices come from nri-gpu's own publishing code
// (internal/kubelet/dra.NodeResources: the functions its driver publishes
// with) over a simulated node discovered as `nri-gpu run` discovers one.
// NVIDIA's are the slices NVIDIA's real driver publishes for the same
// simulated node, captured in the bench's run (capture.go), or else the
// same discovered inventory in the shape NVIDIA's source publishes
// (nvidia.go; Captured replaces it with slices captured before).
package scale

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/dra"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// Variant is how a node's 8 GPUs are laid out and published.
type Variant string

// The variants a shape publishes.
const (
	// Whole: 8 whole H100s.
	Whole Variant = "gpu"
	// Shares: 8 whole H100s shareable by memory (consumable capacity:
	// nri-gpu's dra.memoryShares, NVIDIA's --consumable-shares=memory).
	Shares Variant = "shares"
	// MIG: 8 H100s of seven 1g.10gb MIG devices each (56 devices), static
	// MIG.
	MIG Variant = "mig"
)

// Variants are every Variant.
var Variants = []Variant{Whole, Shares, MIG}

// GPUsPerNode is how many GPUs each simulated node has.
const GPUsPerNode = 8

// Shape is one driver's way of publishing a node's GPUs.
type Shape struct {
	// Name is the shape's name in the tables ("nri-gpu", "nvidia").
	Name string
	// Driver is the driver name the slices and allocations carry.
	Driver string
	// Classes are the driver's DeviceClasses, as it ships them; GPUClass
	// and MIGClass name the ones claims ask for.
	Classes            []resourceapi.DeviceClass
	GPUClass, MIGClass string
	// MemoryCapacity is the capacity name a claim requests a memory share
	// by (capacity.requests): NVIDIA's driver publishes its capacities
	// unqualified, nri-gpu in NVIDIA's domain.
	MemoryCapacity resourceapi.QualifiedName
	// devices are one node's devices of each variant, in the order its
	// slice holds them; the node's UUIDs are made unique per node
	// (Slices).
	devices map[Variant][]resourceapi.Device
	// Source says where the devices come from, for the report.
	Source string
}

// Inventory is the discovered simulated nodes the shapes are made from:
// a node of 8 H100s without MIG and one with MIG, each as `nri-gpu run`
// discovers it (the simulated NVML through the real binding).
type Inventory struct {
	whole, shares, mig *node.State
	// roots are the simulated nodes' trees by variant (Shares shares
	// Whole's): where CaptureNVIDIA runs NVIDIA's driver.
	roots map[Variant]string
}

// Discover lays out the two simulated nodes under dir and discovers them.
// It needs root: the nodes have real device nodes (mknod), without which
// discovery finds no GPU.
func Discover(dir string) (*Inventory, error) {
	if err := simnode.CanMknod(); err != nil {
		return nil, fmt.Errorf("the simulated nodes need real device nodes: %w", err)
	}
	wholeNode, err := simnode.Generate(filepath.Join(dir, "whole"), simnode.Options{GPUs: hgxGPUs(), DeviceNodes: true})
	if err != nil {
		return nil, err
	}
	migNode, err := simnode.Generate(filepath.Join(dir, "mig"), simnode.Options{GPUs: hgxGPUs(), DeviceNodes: true})
	if err != nil {
		return nil, err
	}
	var st simnode.NVMLState
	for range GPUsPerNode {
		g := simnode.NVMLGPU{MIGMode: 1}
		for gi := 7; gi <= 13; gi++ {
			g.MIG = append(g.MIG, simnode.H100MIG(gi, 0, 1))
		}
		st.GPUs = append(st.GPUs, g)
	}
	if err := migNode.SetMIG(st); err != nil {
		return nil, err
	}
	inv := &Inventory{roots: map[Variant]string{Whole: wholeNode.Root, Shares: wholeNode.Root, MIG: migNode.Root}}
	all := make([]string, GPUsPerNode)
	for i := range all {
		all[i] = fmt.Sprint(i)
	}
	for _, d := range []struct {
		into   **node.State
		n      *simnode.Node
		shares []string
		mig    int
	}{{&inv.whole, wholeNode, nil, 0}, {&inv.shares, wholeNode, all, 0}, {&inv.mig, migNode, nil, GPUsPerNode * 7}} {
		cfg := config.Default()
		cfg.DRA.Enabled = true
		cfg.DRA.MemoryShares.Devices = d.shares
		cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = d.n.Root, d.n.Root, d.n.Root
		nd, err := node.New(cfg, quietLog())
		if err != nil {
			return nil, err
		}
		st := nd.State()
		if s := st.Snapshot(); s.NVML != "ok" || len(s.GPUs) != GPUsPerNode || len(s.MIG) != d.mig {
			return nil, fmt.Errorf("simulated node %s: NVML %q, %d GPUs, %d MIG devices (want 8, %d); warnings %q", d.n.Root, s.NVML, len(s.GPUs), len(s.MIG), d.mig, s.Warnings)
		}
		*d.into = st
	}
	return inv, nil
}

// hgxGPUs are an HGX H100 board's 8 GPUs: their PCI bus ids, four on
// each of two NUMA nodes.
func hgxGPUs() []simnode.GPU {
	var out []simnode.GPU
	for i, bus := range []int{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb} {
		out = append(out, simnode.GPU{BusID: fmt.Sprintf("0000:%02x:00.0", bus), NUMANode: fmt.Sprint(i / 4)})
	}
	return out
}

// sysRoot is variant v's simulated node's sysfs ("" if unknown): where
// both shapes read each GPU's PCIe root, as their drivers do on a node.
func (inv *Inventory) sysRoot(v Variant) string {
	if inv.roots[v] == "" {
		return ""
	}
	return filepath.Join(inv.roots[v], "sys")
}

func (inv *Inventory) state(v Variant) *node.State {
	switch v {
	case Shares:
		return inv.shares
	case MIG:
		return inv.mig
	}
	return inv.whole
}

func quietLog() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(os.Stderr)
	l.SetLevel(logrus.WarnLevel)
	return l
}

// NRIGPU is nri-gpu's shape: the devices nri-gpu's DRA driver publishes
// for each variant's node state (dra.NodeResources), its DeviceClasses as
// deploy/kubernetes-dra ships them.
func NRIGPU(inv *Inventory) (*Shape, error) {
	s := &Shape{Name: "nri-gpu", Driver: config.DefaultDRADriverName, GPUClass: "gpu.nri-gpu.dev", MIGClass: "mig.nri-gpu.dev",
		MemoryCapacity: dra.MemoryCapacity, devices: map[Variant][]resourceapi.Device{},
		Source: "nri-gpu's internal/kubelet/dra.NodeResources over the discovered simulated node"}
	s.Classes = classes(s.Driver, s.GPUClass, s.MIGClass, "")
	for _, v := range Variants {
		res := dra.NodeResources(inv.state(v), "template", inv.sysRoot(v), quietLog())
		pool, ok := res.Pools["template"]
		if !ok || len(pool.Slices) != 1 {
			return nil, fmt.Errorf("nri-gpu's resources for %s: %d pools, want one pool of one slice", v, len(res.Pools))
		}
		s.devices[v] = pool.Slices[0].Devices
	}
	return s, nil
}

// classes are a driver's gpu and mig DeviceClasses as NVIDIA's chart
// writes them (nri-gpu's are NVIDIA's with only device.driver changed);
// extended, when set, is the gpu class's extendedResourceName.
func classes(driver, gpu, mig, extended string) []resourceapi.DeviceClass {
	class := func(name, typ string) resourceapi.DeviceClass {
		return resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf("device.driver == '%s' && device.attributes['gpu.nvidia.com'].type == '%s'", driver, typ)}}}}}
	}
	g := class(gpu, "gpu")
	if extended != "" {
		g.Spec.ExtendedResourceName = &extended
	}
	return []resourceapi.DeviceClass{g, class(mig, "mig")}
}

// Devices returns the devices of variant v of node i: the shape's, the
// GPU and MIG UUIDs made the node's own (uniqueUUID).
func (s *Shape) Devices(v Variant, i int) []resourceapi.Device {
	tmpl := s.devices[v]
	out := make([]resourceapi.Device, len(tmpl))
	for j, d := range tmpl {
		d = *d.DeepCopy()
		for name, a := range d.Attributes {
			if a.StringValue != nil && (isAttr(name, "uuid") || isAttr(name, "parentUUID")) {
				u := uniqueUUID(*a.StringValue, i)
				a.StringValue = &u
				d.Attributes[name] = a
			}
		}
		out[j] = d
	}
	return out
}

// isAttr reports whether name is NVIDIA's attribute attr, qualified or
// not.
func isAttr(name resourceapi.QualifiedName, attr string) bool {
	return name == resourceapi.QualifiedName(attr) || name == resourceapi.QualifiedName(dra.NVIDIADomain+"/"+attr)
}

// uniqueUUID is uuid ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", or
// "MIG-" and the same) with the first six hex digits of its last group
// replaced by node i's number: every node's GPUs differ, as real ones do.
func uniqueUUID(uuid string, i int) string {
	if len(uuid) < 12 {
		return uuid
	}
	at := len(uuid) - 12
	return fmt.Sprintf("%s%06x%s", uuid[:at], i&0xffffff, uuid[at+6:])
}

// DeviceCount is how many devices a node of variant v has.
func (s *Shape) DeviceCount(v Variant) int { return len(s.devices[v]) }

// GPUMemory is the memory of the node's first whole GPU of the Shares
// variant, in bytes: what a fill's shares are sized from.
func (s *Shape) GPUMemory() int64 {
	for _, d := range s.devices[Shares] {
		for name, c := range d.Capacity {
			if isAttr(name, "memory") {
				return c.Value.Value()
			}
		}
	}
	return 0
}

// quantity is v bytes as the API server writes a capacity.
func quantity(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.BinarySI) }

// gpuOf returns the snapshot's GPU of index i.
func gpuOf(snap *inventory.Snapshot, i int) (inventory.GPU, bool) {
	for _, g := range snap.GPUs {
		if g.Index == i {
			return g, true
		}
	}
	return inventory.GPU{}, false
}
