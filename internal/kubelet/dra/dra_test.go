package dra

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
)

const (
	testNode   = "node-a"
	testDriver = config.DefaultDRADriverName
)

// testSnapshot is a node with three H100s: GPU 0 and 2 whole, GPU 1 in
// MIG mode with two 1g.10gb devices (GI 7 at slice 4, GI 8 at slice 5),
// as NVML describes them.
func testSnapshot() *inventory.Snapshot {
	props := &inventory.GPUProps{MemoryBytes: 85520809984, Brand: "Nvidia", Architecture: "Hopper", ComputeCapability: "9.0"}
	s := &inventory.Snapshot{DriverVersion: "580.126.09",
		Files:   []inventory.DriverFile{{Kind: inventory.Library, Capability: inventory.Compute, HostPath: "/usr/lib64/libcuda.so.580.126.09", Name: "libcuda.so.1"}},
		Control: inventory.ControlNodes{Ctl: &inventory.DeviceNode{Path: "/dev/nvidiactl", Major: 195, Minor: 255, Mode: 0o666}}}
	for i := 0; i < 3; i++ {
		s.GPUs = append(s.GPUs, inventory.GPU{Index: i, Minor: i, UUID: "GPU-" + strings.Repeat(string(rune('a'+i)), 8),
			BusID: []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"}[i], Model: "NVIDIA H100 80GB HBM3", NUMANode: i / 2,
			Node: inventory.DeviceNode{Path: "/dev/nvidia" + string(rune('0'+i)), Major: 195, Minor: int64(i), Mode: 0o666}, Props: props})
	}
	s.GPUs[1].MIGEnabled = true
	for j, gi := range []int{7, 8} {
		s.MIG = append(s.MIG, inventory.MIGDevice{UUID: "MIG-" + strings.Repeat(string(rune('m'+j)), 8), Index: j, Parent: 1, ParentUUID: s.GPUs[1].UUID,
			Profile: "1g.10gb", MemoryMiB: 9984, GI: gi, CI: 0,
			GINode:    inventory.DeviceNode{Path: "/dev/nvidia-caps/nvidia-cap" + itoa(200+2*j), Major: 508, Minor: int64(200 + 2*j), Mode: 0o444},
			CINode:    inventory.DeviceNode{Path: "/dev/nvidia-caps/nvidia-cap" + itoa(201+2*j), Major: 508, Minor: int64(201 + 2*j), Mode: 0o444},
			Placement: &inventory.MIGPlacement{ProfileID: 19, Start: 4 + j, Size: 1},
			Engines:   inventory.MIGEngines{Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 0}})
	}
	return s
}

func itoa(i int) string { return strconv.Itoa(i) }

func resourceQuantity(v int64) *resource.Quantity { return resource.NewQuantity(v, resource.BinarySI) }

func stateOf(s *inventory.Snapshot, cfg config.Config) *node.State {
	return &node.State{Config: cfg, Source: adjust.Prepare(s, adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib"})}
}

func draConfig() config.Config {
	c := config.Default()
	c.DRA.Enabled = true
	return c
}

func quietLog() *logrus.Logger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	if os.Getenv("DRA_LOG") != "" {
		log.SetOutput(os.Stderr)
	}
	return log
}

func noRoot(string) string { return "" }

// TestSliceDevices checks the published devices as whole values: NVIDIA's
// names, attributes fully qualified in its domain, capacities in bytes
// and counts, the standard PCI and NUMA attributes.
func TestSliceDevices(t *testing.T) {
	st := stateOf(testSnapshot(), draConfig())
	var got []resourceapi.Device
	for _, u := range units(st) {
		got = append(got, sliceDevice(u, st.Snapshot(), func(bus string) string { return "pci0000:" + bus[5:7] }, nil))
	}
	s := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &v} }
	ver := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &v} }
	num := func(v int64) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{IntValue: &v} }
	q := func(v int64) resourceapi.DeviceCapacity {
		return resourceapi.DeviceCapacity{Value: *resourceQuantity(v)}
	}
	common := func(bus string, numa int64) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"gpu.nvidia.com/productName": s("NVIDIA H100 80GB HBM3"), "gpu.nvidia.com/brand": s("Nvidia"),
			"gpu.nvidia.com/architecture": s("Hopper"), "gpu.nvidia.com/cudaComputeCapability": ver("9.0.0"),
			"gpu.nvidia.com/driverVersion": ver("580.126.9"), "gpu.nvidia.com/cudaDriverVersion": ver("13.0.0"),
			"resource.kubernetes.io/pciBusID": s(bus), "resource.kubernetes.io/pcieRoot": s("pci0000:" + bus[5:7]),
			"resource.kubernetes.io/numaNode": num(numa),
		}
	}
	gpu := func(name, uuid, bus string, numa int64) resourceapi.Device {
		a := common(bus, numa)
		a["gpu.nvidia.com/type"], a["gpu.nvidia.com/uuid"] = s("gpu"), s(uuid)
		return resourceapi.Device{Name: name, Attributes: a, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"gpu.nvidia.com/memory": q(85520809984)}}
	}
	mig := func(name, uuid string, slice int) resourceapi.Device {
		a := common("0000:2a:00.0", 0)
		a["gpu.nvidia.com/type"], a["gpu.nvidia.com/uuid"] = s("mig"), s(uuid)
		a["gpu.nvidia.com/parentUUID"], a["gpu.nvidia.com/profile"] = s("GPU-bbbbbbbb"), s("1g.10gb")
		return resourceapi.Device{Name: name, Attributes: a, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"gpu.nvidia.com/memory": q(9984 << 20), "gpu.nvidia.com/multiprocessors": q(16), "gpu.nvidia.com/copyEngines": q(1),
			"gpu.nvidia.com/decoders": q(1), "gpu.nvidia.com/encoders": q(0), "gpu.nvidia.com/jpegEngines": q(1), "gpu.nvidia.com/ofaEngines": q(0),
			resourceapi.QualifiedName("gpu.nvidia.com/memorySlice" + itoa(slice)): q(1)}}
	}
	want := []resourceapi.Device{
		gpu("gpu-0", "GPU-aaaaaaaa", "0000:18:00.0", 0),
		gpu("gpu-2", "GPU-cccccccc", "0000:3a:00.0", 1),
		mig("gpu-1-mig-1g10gb-19-4", "MIG-mmmmmmmm", 4),
		mig("gpu-1-mig-1g10gb-19-5", "MIG-nnnnnnnn", 5),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
}

// TestDeviceNamesWithoutNVML: without NVML's GPU-instance placement a
// MIG device is named by its instances, a name NVIDIA's driver never
// uses; without NVML's properties their attributes are left out.
func TestDeviceNamesWithoutNVML(t *testing.T) {
	snap := testSnapshot()
	for i := range snap.GPUs {
		snap.GPUs[i].Props = nil
	}
	snap.MIG[0].Placement, snap.MIG[0].Engines = nil, inventory.MIGEngines{}
	st := stateOf(snap, draConfig())
	us := units(st)
	if n := us[2].name; n != "gpu-1-mig-1g10gb-gi7-ci0" {
		t.Errorf("MIG name without placement: %s", n)
	}
	d := sliceDevice(us[0], snap, noRoot, nil)
	for _, k := range []resourceapi.QualifiedName{"gpu.nvidia.com/brand", "gpu.nvidia.com/architecture", "gpu.nvidia.com/cudaComputeCapability", "resource.kubernetes.io/pcieRoot"} {
		if _, ok := d.Attributes[k]; ok {
			t.Errorf("%s published without NVML", k)
		}
	}
	if d.Capacity != nil {
		t.Errorf("capacity without NVML's memory: %v", d.Capacity)
	}
	if m := sliceDevice(us[2], snap, noRoot, nil); len(m.Capacity) != 1 {
		t.Errorf("MIG capacities without NVML's attributes: %v, want memory only", m.Capacity)
	}
}

// TestOneAllocator: with the device plugin on, DRA publishes only the
// GPUs of dra.devices that devicePlugin.devices does not list; a GPU
// brings its MIG devices; a broken driver publishes nothing.
func TestOneAllocator(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dra, dp []string
		dpOn    bool
		want    []string
	}{
		{"all", nil, nil, false, []string{"gpu-0", "gpu-2", "gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}},
		{"dra.devices", []string{"1"}, nil, false, []string{"gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}},
		{"beside the device plugin", []string{"0", "GPU-cccccccc"}, []string{"1"}, true, []string{"gpu-0", "gpu-2"}},
		{"device plugin list off", []string{"0"}, []string{"0"}, false, []string{"gpu-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := draConfig()
			cfg.DRA.Devices, cfg.DevicePlugin.Devices, cfg.DevicePlugin.Enabled = tc.dra, tc.dp, tc.dpOn
			var got []string
			for _, u := range units(stateOf(testSnapshot(), cfg)) {
				got = append(got, u.name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("published (-want +got):\n%s", diff)
			}
		})
	}
	broken := testSnapshot()
	broken.DriverVersion = "" // unloaded
	if us := units(stateOf(broken, draConfig())); len(us) != 0 {
		t.Errorf("a node without a driver publishes %d devices", len(us))
	}
}

func TestSemver(t *testing.T) {
	for in, want := range map[string]string{"580.126.09": "580.126.9", "13.0": "13.0.0", "9.0": "9.0.0", "590.44.01": "590.44.1", "535.54": "535.54.0", "": "", "1.2.3.4": "", "a.b": "", "1..2": ""} {
		got, ok := semver(in)
		if got != want || ok != (want != "") {
			t.Errorf("semver(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// testEnv is a Driver serving the kubelet's DRA gRPC API on a socket of a
// temporary directory, against a fake API server holding the node.
type testEnv struct {
	d       *Driver
	n       *node.Node
	client  *fake.Clientset
	dirs    Options
	conn    drapb.DRAPluginClient
	cancel  context.CancelFunc
	stopped chan struct{}
}

func newEnv(t testing.TB, cfg config.Config, snap *inventory.Snapshot, keep *Options) *testEnv {
	t.Helper()
	var opts Options
	if keep != nil {
		opts = *keep
	} else {
		root, err := os.MkdirTemp("", "dra")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(root) })
		opts = Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"),
			RegistrationDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev"}
	}
	e := &testEnv{client: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}}), dirs: opts}
	e.n = node.Fixed(stateOf(snap, cfg), quietLog())
	d, err := New(opts, e.n, e.client, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	e.d = d
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel, e.stopped = cancel, make(chan struct{})
	go func() {
		defer close(e.stopped)
		if err := d.Serve(ctx); err != nil {
			t.Error(err)
		}
	}()
	sock := filepath.Join(opts.PluginDir, "dra.sock")
	deadline := time.Now().Add(10 * time.Second)
	for _, err := os.Stat(sock); err != nil; _, err = os.Stat(sock) {
		if time.Now().After(deadline) {
			t.Fatalf("no DRA socket %s", sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	e.conn = drapb.NewDRAPluginClient(cc)
	t.Cleanup(e.stop)
	return e
}

func (e *testEnv) stop() {
	e.cancel()
	<-e.stopped
}

// claim creates a claim allocated the devices (request "gpu" each; admin
// marks adminAccess) in the fake API server.
func (e *testEnv) claim(t testing.TB, name, uid string, admin bool, devices ...string) *resourceapi.ResourceClaim {
	t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: testDriver, Pool: testNode, Device: d}
		if admin {
			r.AdminAccess = &admin
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, r)
	}
	if _, err := e.client.ResourceV1().ResourceClaims("ml").Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// prepare calls NodePrepareResources as the kubelet does and returns the
// claim's answer.
func (e *testEnv) prepare(t testing.TB, c *resourceapi.ResourceClaim) *drapb.NodePrepareResourceResponse {
	t.Helper()
	resp, err := e.conn.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	return resp.Claims[string(c.UID)]
}

func (e *testEnv) unprepare(t testing.TB, c *resourceapi.ResourceClaim) {
	t.Helper()
	resp, err := e.conn.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil || resp.Claims[string(c.UID)].GetError() != "" {
		t.Fatalf("NodeUnprepareResources: %v %v", err, resp)
	}
}

func (e *testEnv) spec(t *testing.T, uid string) *specs.Spec {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.dirs.CDIDir, specFile(testDriver, uid)))
	if err != nil {
		return nil
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// TestNVMLOverDiscovery: the product name and CUDA version are NVML's
// when it reports them (what NVIDIA's driver publishes), discovery's
// without it: /proc's Model, the CUDA version of the driver's branch.
func TestNVMLOverDiscovery(t *testing.T) {
	snap := &inventory.Snapshot{DriverVersion: "580.126.09"}
	for _, tc := range []struct {
		name          string
		props         *inventory.GPUProps
		product, cuda string
	}{
		{"NVML", &inventory.GPUProps{ProductName: "NVIDIA H100 80GB HBM3 (NVML)", CUDADriverVersion: "12.8"}, "NVIDIA H100 80GB HBM3 (NVML)", "12.8"},
		{"NVML silent", &inventory.GPUProps{}, "NVIDIA H100 80GB HBM3", "13.0"},
		{"no NVML", nil, "NVIDIA H100 80GB HBM3", "13.0"},
	} {
		g := inventory.GPU{Model: "NVIDIA H100 80GB HBM3", Props: tc.props}
		if p, c := productName(g), cudaDriverVersion(g, snap); p != tc.product || c != tc.cuda {
			t.Errorf("%s: product %q, CUDA %q; want %q, %q", tc.name, p, c, tc.product, tc.cuda)
		}
	}
}

// TestNodeResources: the bench's seam publishes what the driver does: one
// pool named after the node, the node state's devices as sliceDevice
// makes them, memory shares as resources makes them.
func TestNodeResources(t *testing.T) {
	cfg := draConfig()
	cfg.DRA.MemoryShares.Devices = []string{"0"}
	st := stateOf(testSnapshot(), cfg)
	got := NodeResources(st, "node-x", "", quietLog())
	pool, ok := got.Pools["node-x"]
	if !ok || len(got.Pools) != 1 || len(pool.Slices) != 1 {
		t.Fatalf("pools %v, want one pool node-x of one slice", got.Pools)
	}
	var names []string
	for _, d := range pool.Slices[0].Devices {
		names = append(names, d.Name)
	}
	if want := []string{"gpu-0", "gpu-2", "gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}; !cmp.Equal(names, want) {
		t.Errorf("devices %v, want %v", names, want)
	}
	d := pool.Slices[0].Devices[0]
	if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations || d.Capacity[MemoryCapacity].RequestPolicy == nil {
		t.Errorf("gpu-0 (dra.memoryShares): %+v, want shareable by memory", d)
	}
	want := sliceDevice(units(st)[1], st.Snapshot(), noRoot, nil)
	if diff := cmp.Diff(want, pool.Slices[0].Devices[1]); diff != "" {
		t.Errorf("gpu-2 (-sliceDevice +NodeResources):\n%s", diff)
	}
}
