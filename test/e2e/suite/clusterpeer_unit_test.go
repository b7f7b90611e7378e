package suite

import (
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestCompareSlices runs compareSlices on devices as NVIDIA's driver and
// nri-gpu publish them, with one difference of each kind it tells.
func TestCompareSlices(t *testing.T) {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr(s)} }
	ver := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: ptr(s)} }
	qty := func(s string) resourceapi.DeviceCapacity {
		return resourceapi.DeviceCapacity{Value: resource.MustParse(s)}
	}
	nv := map[string]resourceapi.Device{
		"gpu-0": {Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": str("gpu"), "uuid": str("GPU-0"), "driverVersion": ver("580.126.9"), "brand": str("Nvidia"),
			"resource.kubernetes.io/pciBusID": str("0000:1b:00.0")},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": qty("81559Mi")}},
		"gpu-1-mig-1g10gb-19-0": {Name: "gpu-1-mig-1g10gb-19-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("mig")},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memorySlice0": qty("1")}},
		"gpu-2": {Name: "gpu-2", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("gpu")}},
	}
	ours := map[string]resourceapi.Device{
		"gpu-0": {Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"gpu.nvidia.com/type": str("gpu"), "gpu.nvidia.com/uuid": str("GPU-0"), "gpu.nvidia.com/driverVersion": str("580.126.9"),
			"resource.kubernetes.io/pciBusID": str("0000:1b:00.0"), "gpu.nvidia.com/index": {IntValue: ptr[int64](0)}},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"gpu.nvidia.com/memory": qty("81558Mi")}},
		"gpu-1-mig-1g10gb-19-0": {Name: "gpu-1-mig-1g10gb-19-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"gpu.nvidia.com/type": str("mig")},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"gpu.nvidia.com/memorySlice0": qty("1")}},
		"gpu-3": {Name: "gpu-3", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"gpu.nvidia.com/type": str("gpu")}},
	}
	var got []string
	for _, d := range compareSlices(nv, ours) {
		got = append(got, d.key)
	}
	want := []string{
		"gpu attribute gpu.nvidia.com/brand: only NVIDIA's",
		"gpu attribute gpu.nvidia.com/driverVersion: type",
		"gpu attribute gpu.nvidia.com/index: only nri-gpu's",
		"gpu capacity gpu.nvidia.com/memory: value",
		"gpu device: only NVIDIA's",
		"gpu device: only nri-gpu's",
	}
	if !slices.Equal(got, want) {
		t.Errorf("compareSlices:\n got %q\nwant %q", got, want)
	}
}

// TestParseDRAMetrics reads the kubelet's per-driver gRPC histogram, as
// Kubernetes v1.37 writes it, and skips calls that failed.
func TestParseDRAMetrics(t *testing.T) {
	const m = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
	text := `# TYPE dra_grpc_operations_duration_seconds histogram
dra_grpc_operations_duration_seconds_bucket{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="` + m + `",le="0.1"} 1
dra_grpc_operations_duration_seconds_bucket{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="` + m + `",le="0.2"} 3
dra_grpc_operations_duration_seconds_bucket{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="` + m + `",le="+Inf"} 4
dra_grpc_operations_duration_seconds_sum{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="` + m + `"} 0.6
dra_grpc_operations_duration_seconds_count{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="` + m + `"} 4
dra_grpc_operations_duration_seconds_count{driver_name="gpu.nvidia.com",grpc_status_code="Unknown",method_name="` + m + `"} 9
dra_operations_duration_seconds_count{is_error="false",operation_name="PrepareResources"} 7
`
	stats := parseDRAMetrics(text)
	s := stats["gpu.nvidia.com NodePrepareResources"]
	if len(stats) != 1 || s == nil {
		t.Fatalf("parseDRAMetrics: %v", stats)
	}
	if s.count != 4 || s.sum != 0.6 {
		t.Errorf("count %v sum %v, want 4 and 0.6", s.count, s.sum)
	}
	if q := s.quantile(0.5); q <= 0.1 || q > 0.2 {
		t.Errorf("median %v, want within (0.1, 0.2]", q)
	}
	if got := s.String(); !strings.Contains(got, "4 calls, mean 150.0 ms") {
		t.Errorf("String: %q", got)
	}
}

// TestPeerTopology runs peerTopology on devices of a node of two GPUs:
// one right, and one of each problem it tells (no numaNode, a wrong
// pcieRoot, a bus id of no GPU, no bus id).
func TestPeerTopology(t *testing.T) {
	g0, g1 := simnode.DefaultBusID(0), simnode.DefaultBusID(1)
	n := &harness.Node{GPU: &simnode.Node{GPUs: []simnode.GPU{{BusID: g0, NUMANode: "0"}, {BusID: g1, NUMANode: "1"}}}}
	dev := func(bus, root string, numa int64) resourceapi.Device {
		a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
		if bus != "" {
			a["resource.kubernetes.io/pciBusID"] = resourceapi.DeviceAttribute{StringValue: ptr(bus)}
		}
		if root != "" {
			a["resource.kubernetes.io/pcieRoot"] = resourceapi.DeviceAttribute{StringValue: ptr(root)}
		}
		if numa >= 0 {
			a["resource.kubernetes.io/numaNode"] = resourceapi.DeviceAttribute{IntValue: ptr(numa)}
		}
		return resourceapi.Device{Attributes: a}
	}
	got := peerTopology(n, map[string]resourceapi.Device{
		"gpu-0":             dev(g0, simnode.PCIeRootFor(g0), 0),
		"gpu-1-mig-1g-19-0": dev(g1, simnode.PCIeRootFor(g1), -1),
		"gpu-1":             dev(g1, simnode.PCIeRootFor(g0), 1),
		"gpu-9":             dev("0000:ff:00.0", "pci0000:f0", 0),
		"gpu-8":             dev("", "", -1),
	})
	want := []string{
		"gpu-1-mig-1g-19-0: numaNode none, want 1",
		"gpu-1: pcieRoot string " + simnode.PCIeRootFor(g0) + ", want " + simnode.PCIeRootFor(g1),
		"gpu-8: no resource.kubernetes.io/pciBusID",
		"gpu-9: pciBusID 0000:ff:00.0 is no GPU of the node",
	}
	if !slices.Equal(got, want) {
		t.Errorf("peerTopology:\n got %q\nwant %q", got, want)
	}
}

// TestPeerSelector: the two drivers' claims take disjoint halves of the
// peer nodes' GPUs, NVIDIA's the even indexes on each node.
func TestPeerSelector(t *testing.T) {
	gpus := func(first, n int) *simnode.Node {
		var out []simnode.GPU
		for i := range n {
			out = append(out, simnode.GPU{Index: i, BusID: strings.ToUpper(simnode.DefaultBusID(first + i))})
		}
		return &simnode.Node{GPUs: out}
	}
	c := &harness.Cluster{Nodes: []*harness.Node{{GPU: gpus(0, 3)}, {GPU: gpus(3, 2)}}}
	bus := func(i int) string { return "'" + simnode.DefaultBusID(i) + "'" }
	want := map[string]string{
		nvidiaDriver: "[" + bus(0) + ", " + bus(2) + ", " + bus(3) + "]",
		draDriver:    "[" + bus(1) + ", " + bus(4) + "]",
	}
	for driver, list := range want {
		if got := peerSelector(c, driver); got != "device.attributes['resource.kubernetes.io'].pciBusID in "+list {
			t.Errorf("%s: %s, want the bus ids %s", driver, got, list)
		}
	}
}
