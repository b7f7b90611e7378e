package dra

import (
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// awaitNVML returns the node's snapshot. Under emulation (make
// test-arm64) loading NVML can outlast node.DefaultNVMLBound on a loaded
// machine, and the node is rediscovered when NVML answers: it waits up to
// 30 s for that. Natively the first discovery must have NVML's answer.
func awaitNVML(n *node.Node) *inventory.Snapshot {
	s := n.Snapshot()
	if os.Getenv("NRI_GPU_TEST_EMULATED") == "" {
		return s
	}
	for deadline := time.Now().Add(30 * time.Second); s.NVML != "ok" && time.Now().Before(deadline); s = n.Snapshot() {
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

// simulatedDevices lays out three H100s (device minors in reverse bus
// order), GPU 0 with a 1g.10gb+me (GPU instance 7), a 1g.20gb (4) and a
// 3g.40gb (2), GPU 1 in one 7g.80gb (0), GPU 2 whole; discovers the node
// as `nri-gpu run` does, NVML through the real binding against the
// simulated library, and returns the devices DRA publishes of it.
func simulatedDevices(t *testing.T) (*simnode.Node, []resourceapi.Device) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the simulated node has real device nodes (mknod); CI runs as root")
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 3, SwapMinors: true, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	st := simnode.NVMLState{GPUs: []simnode.NVMLGPU{
		{MIGMode: 1, MIG: []simnode.MIG{
			{GI: 7, CI: 0, GISlices: 1, CISlices: 1, MemoryMiB: 9984, Profile: "1g.10gb+me"},
			{GI: 4, CI: 0, GISlices: 1, CISlices: 1, MemoryMiB: 20096, Profile: "1g.20gb"},
			simnode.H100MIG(2, 0, 3),
		}},
		{MIGMode: 1, MIG: []simnode.MIG{simnode.H100MIG(0, 0, 7)}},
	}}
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	cfg := draConfig()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = n.Root, n.Root, n.Root
	nd, err := node.New(cfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if s := awaitNVML(nd); s.NVML != "ok" || len(s.MIG) != 4 {
		t.Fatalf("NVML %q, %d MIG devices; warnings %q", s.NVML, len(s.MIG), s.Warnings)
	}
	state := nd.State()
	var devs []resourceapi.Device
	for _, u := range units(state) {
		devs = append(devs, sliceDevice(u, state.Snapshot(), noRoot, nil))
	}
	return n, devs
}

// TestSimulatedSlices checks the devices DRA publishes of a simulated
// H100 node with MIG, as whole values: NVIDIA's device names, every
// attribute and capacity with NVIDIA's name, type and value, from the
// simulated NVML through the real binding, discovery and the node state.
func TestSimulatedSlices(t *testing.T) {
	n, got := simulatedDevices(t)
	s := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &v} }
	ver := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &v} }
	q := func(v int64) resourceapi.DeviceCapacity {
		return resourceapi.DeviceCapacity{Value: *resourceQuantity(v)}
	}
	common := func(g simnode.GPU) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"gpu.nvidia.com/productName": s("NVIDIA H100 80GB HBM3"), "gpu.nvidia.com/brand": s("Nvidia"),
			"gpu.nvidia.com/architecture": s("Hopper"), "gpu.nvidia.com/cudaComputeCapability": ver("9.0.0"),
			"gpu.nvidia.com/driverVersion": ver("580.126.9"), "gpu.nvidia.com/cudaDriverVersion": ver("13.0.0"),
			"resource.kubernetes.io/pciBusID": s(g.BusID),
		}
	}
	// A MIG device: its profile's engines, memory and memory slices.
	type engines struct{ sm, ce, dec, enc, jpeg, ofa int64 }
	mig := func(name string, parent simnode.GPU, gi int, profile string, memMiB int64, e engines, start, size int) resourceapi.Device {
		a := common(parent)
		a["gpu.nvidia.com/type"], a["gpu.nvidia.com/uuid"] = s("mig"), s(simnode.MIGUUIDFor(parent.UUID, gi, 0))
		a["gpu.nvidia.com/parentUUID"], a["gpu.nvidia.com/profile"] = s(parent.UUID), s(profile)
		c := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"gpu.nvidia.com/memory": q(memMiB << 20), "gpu.nvidia.com/multiprocessors": q(e.sm), "gpu.nvidia.com/copyEngines": q(e.ce),
			"gpu.nvidia.com/decoders": q(e.dec), "gpu.nvidia.com/encoders": q(e.enc), "gpu.nvidia.com/jpegEngines": q(e.jpeg),
			"gpu.nvidia.com/ofaEngines": q(e.ofa),
		}
		for i := start; i < start+size; i++ {
			c[resourceapi.QualifiedName("gpu.nvidia.com/memorySlice"+itoa(i))] = q(1)
		}
		return resourceapi.Device{Name: name, Attributes: a, Capacity: c}
	}
	g0, g1, g2 := n.GPUs[0], n.GPUs[1], n.GPUs[2]
	whole := common(g2)
	whole["gpu.nvidia.com/type"], whole["gpu.nvidia.com/uuid"] = s("gpu"), s(g2.UUID)
	want := []resourceapi.Device{
		{Name: "gpu-0", Attributes: whole, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"gpu.nvidia.com/memory": q(81559 << 20)}},
		mig("gpu-2-mig-1g10gb-me-20-0", g0, 7, "1g.10gb+me", 9984, engines{16, 1, 1, 0, 1, 1}, 0, 1),
		mig("gpu-2-mig-1g20gb-15-2", g0, 4, "1g.20gb", 20096, engines{26, 1, 1, 0, 1, 0}, 2, 2),
		mig("gpu-2-mig-3g40gb-9-4", g0, 2, "3g.40gb", 40448, engines{60, 3, 3, 0, 3, 0}, 4, 4),
		mig("gpu-1-mig-7g80gb-0-0", g1, 0, "7g.80gb", 81152, engines{132, 8, 7, 0, 7, 1}, 0, 8),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
}
