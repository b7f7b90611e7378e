package deviceplugin_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/deviceplugin"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// shared is a node of two GPUs (of twoNUMA's eight) whose state carries
// the sharing plan of the devicePlugin configuration yaml, served by the
// device plugins Resources asks for, each registered with a stand-in
// kubelet.
type shared struct {
	snap    *inventory.Snapshot
	node    *node.Node
	cfg     config.Config
	clients map[string]pluginapi.DevicePluginClient
}

func serveShared(t *testing.T, yaml string, gpus int) *shared {
	t.Helper()
	return serveSharedPlan(t, yaml, gpus, true)
}

// serveSharedPlan is serveShared; without withPlan the node's state has
// no plan, and the plugins make theirs from their configuration.
func serveSharedPlan(t *testing.T, yaml string, gpus int, withPlan bool) *shared {
	t.Helper()
	dir := socketDir(t)
	cfg, err := config.Parse([]byte("devicePlugin:\n  enabled: true\n  socketDir: " + dir + "\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	snap := twoNUMA()
	snap.GPUs = snap.GPUs[:gpus]
	for i := range snap.GPUs {
		snap.GPUs[i].MemoryMiB = 81559
	}
	st := stateOf(snap)
	st.Config = cfg
	if withPlan {
		st.Shares = sharing.NewPlan(cfg.DevicePlugin.SharingSpec(), st.Source.Devices())
	}
	s := &shared{snap: snap, node: node.Fixed(st, quietLog()), cfg: cfg, clients: map[string]pluginapi.DevicePluginClient{}}
	k := startKubelet(t, dir, false)
	opts := deviceplugin.Resources(cfg.DevicePlugin, snap)
	for _, o := range opts {
		runPlugin(t, s.node, o)
	}
	for range opts {
		r := <-k.reqs
		s.clients[r.ResourceName] = k.dial(r)
	}
	return s
}

// allocate asks resource's plugin for one container with ids.
func (s *shared) allocate(resource string, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	resp, err := s.clients[resource].Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	return resp.ContainerResponses[0], nil
}

// prefer asks resource's plugin which size of available it prefers.
func (s *shared) prefer(t *testing.T, resource string, available, must []string, size int) []string {
	t.Helper()
	resp, err := s.clients[resource].GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: available, MustIncludeDeviceIDs: must, AllocationSize: int32(size)}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.ContainerResponses[0].DeviceIDs
}

func (s *shared) replicas(gpu int, n ...int) []string {
	var out []string
	for _, i := range n {
		out = append(out, sharing.ReplicaID(s.snap.GPUs[gpu].UUID, i))
	}
	return out
}

// TestTimeSlicing: with replicas 4, each GPU is four devices <uuid>::0-3
// with its NUMA node; a container given one gets the GPU's device node
// and the two annotations (the GPU once, and how many of its replicas); two
// replicas of one GPU give it once (failRequestsGreaterThanOne false) or
// are refused with NVIDIA's reason (true); a GPU's health is that of all
// its replicas.
func TestTimeSlicing(t *testing.T) {
	const ts = "  sharing:\n    timeSlicing:\n      resources: [{name: nvidia.com/gpu, replicas: 4}]\n"
	s := serveShared(t, ts, 2)
	list := watch(t, s.clients["nvidia.com/gpu"])
	devs := list()
	if d := cmp.Diff(append(s.replicas(0, 0, 1, 2, 3), s.replicas(1, 0, 1, 2, 3)...), ids(devs)); d != "" {
		t.Fatalf("devices (-want +got):\n%s", d)
	}
	for _, d := range devs {
		if d.Health != pluginapi.Healthy || len(d.GetTopology().GetNodes()) != 1 || d.Topology.Nodes[0].ID != 0 {
			t.Errorf("device %s: %s, %v", d.ID, d.Health, d.Topology)
		}
	}
	g0 := s.snap.GPUs[0]
	shareKey := alloc.KubeletSharedAnnotation("nvidia.com/gpu")
	mainKey := alloc.KubeletAnnotationFor("nvidia.com/gpu")
	for _, tc := range []struct {
		name string
		ids  []string
		want map[string]string
	}{
		{"one replica", s.replicas(0, 1), map[string]string{mainKey: g0.UUID, shareKey: "time-slicing:" + g0.UUID + "=1/4"}},
		{"two replicas of one GPU", s.replicas(0, 3, 1), map[string]string{mainKey: g0.UUID, shareKey: "time-slicing:" + g0.UUID + "=2/4"}},
		{"replicas of two GPUs", []string{s.replicas(1, 2)[0], s.replicas(0, 0)[0]}, map[string]string{mainKey: g0.UUID + "," + s.snap.GPUs[1].UUID,
			shareKey: "time-slicing:" + g0.UUID + "=1/4," + s.snap.GPUs[1].UUID + "=1/4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := s.allocate("nvidia.com/gpu", tc.ids...)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, r.Annotations); d != "" {
				t.Errorf("annotations (-want +got):\n%s", d)
			}
			if len(r.Devices) != strings.Count(tc.want[mainKey], ",")+1 || r.Devices[0].HostPath != g0.Node.Path {
				t.Errorf("device specs %v", r.Devices)
			}
		})
	}
	if _, err := s.allocate("nvidia.com/gpu", g0.UUID); err == nil || !strings.Contains(err.Error(), "unknown device") || !strings.Contains(err.Error(), g0.UUID+"::0-3") {
		t.Errorf("a replicated GPU's own UUID: %v", err)
	}

	// A GPU's health is every replica's.
	st := *s.node.State()
	st.Unhealthy = map[string]string{g0.UUID: "XID 79"}
	s.node.Swap(&st)
	for _, d := range list() {
		if want := map[bool]string{true: pluginapi.Unhealthy, false: pluginapi.Healthy}[strings.HasPrefix(d.ID, g0.UUID)]; d.Health != want {
			t.Errorf("device %s: %s, want %s", d.ID, d.Health, want)
		}
	}
	if _, err := s.allocate("nvidia.com/gpu", s.replicas(0, 2)...); err == nil || !strings.Contains(err.Error(), "is unhealthy: XID 79") {
		t.Errorf("a replica of an unhealthy GPU: %v", err)
	}

	strict := serveShared(t, "  sharing:\n    timeSlicing:\n      failRequestsGreaterThanOne: true\n      resources: [{name: nvidia.com/gpu, replicas: 4}]\n", 2)
	if _, err := strict.allocate("nvidia.com/gpu", strict.replicas(0, 0, 1)...); err == nil ||
		!strings.Contains(err.Error(), "maximum request size for shared resources is 1; found 2 (devicePlugin.sharing: failRequestsGreaterThanOne)") {
		t.Errorf("two replicas under failRequestsGreaterThanOne: %v", err)
	}
	if _, err := strict.allocate("nvidia.com/gpu", strict.replicas(0, 0)...); err != nil {
		t.Errorf("one replica under failRequestsGreaterThanOne: %v", err)
	}

	// A state without a plan (built in memory): the plugin's own.
	own := serveSharedPlan(t, "  sharing:\n    timeSlicing:\n      failRequestsGreaterThanOne: true\n      resources: [{name: nvidia.com/gpu, replicas: 2}]\n", 1, false)
	if got := ids(watch(t, own.clients["nvidia.com/gpu"])()); !cmp.Equal(got, own.replicas(0, 0, 1)) {
		t.Errorf("without the state's plan: %v", got)
	}
	if _, err := own.allocate("nvidia.com/gpu", own.replicas(0, 0, 1)...); err == nil || !strings.Contains(err.Error(), "maximum request size") {
		t.Errorf("two replicas without the state's plan: %v", err)
	}
	if r, err := own.allocate("nvidia.com/gpu", own.replicas(0, 1)...); err != nil || r.Annotations[shareKey] == "" {
		t.Errorf("a replica without the state's plan: %v, %v", r, err)
	}
}

// TestRenamedReplicas: renameByDefault with devices: 1 advertises the
// first GPU's replicas as nvidia.com/gpu.shared and keeps the other whole
// under nvidia.com/gpu; a whole GPU's answer has no shared annotation.
func TestRenamedReplicas(t *testing.T) {
	s := serveShared(t, "  sharing:\n    timeSlicing:\n      renameByDefault: true\n      resources: [{name: nvidia.com/gpu, replicas: 2, devices: 1}]\n", 2)
	if got := ids(watch(t, s.clients["nvidia.com/gpu.shared"])()); !cmp.Equal(got, s.replicas(0, 0, 1)) {
		t.Errorf("nvidia.com/gpu.shared: %v", got)
	}
	if got := ids(watch(t, s.clients["nvidia.com/gpu"])()); !cmp.Equal(got, []string{s.snap.GPUs[1].UUID}) {
		t.Errorf("nvidia.com/gpu: %v", got)
	}
	r, err := s.allocate("nvidia.com/gpu", s.snap.GPUs[1].UUID)
	if err != nil || !cmp.Equal(r.Annotations, map[string]string{alloc.KubeletAnnotationFor("nvidia.com/gpu"): s.snap.GPUs[1].UUID}) {
		t.Errorf("a whole GPU: %v, %v", r, err)
	}
	r, err = s.allocate("nvidia.com/gpu.shared", s.replicas(0, 1)...)
	if err != nil || r.Annotations[alloc.KubeletSharedAnnotation("nvidia.com/gpu.shared")] != "time-slicing:"+s.snap.GPUs[0].UUID+"=1/2" {
		t.Errorf("a renamed replica: %v, %v", r, err)
	}
}

// TestPreferReplicas: distributed prefers the GPU with the fewest
// replicas given out, packed the one with the most, counting this pick's;
// devices that must be included come first.
func TestPreferReplicas(t *testing.T) {
	const res = "  sharing:\n    timeSlicing:\n      resources: [{name: nvidia.com/gpu, replicas: 4}]\n"
	d := serveShared(t, res, 2)
	p := serveShared(t, "  sharedDevicesAllocationPolicy: packed\n"+res, 2)
	// GPU 0 has one replica given out (::0), GPU 1 none.
	available := append(d.replicas(0, 1, 2, 3), d.replicas(1, 0, 1, 2, 3)...)
	for _, tc := range []struct {
		name string
		s    *shared
		must []string
		size int
		want []string
	}{
		{"distributed, one", d, nil, 1, d.replicas(1, 0)},
		{"distributed, two", d, nil, 2, append(d.replicas(1, 0), d.replicas(0, 1)...)},
		{"distributed, three", d, nil, 3, append(append(d.replicas(1, 0), d.replicas(0, 1)...), d.replicas(1, 1)...)},
		{"packed, one", p, nil, 1, p.replicas(0, 1)},
		{"packed, four", p, nil, 4, append(p.replicas(0, 1, 2, 3), p.replicas(1, 0)...)},
		{"distributed with a must", d, d.replicas(0, 3), 2, append(d.replicas(0, 3), d.replicas(1, 0)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.prefer(t, "nvidia.com/gpu", available, tc.must, tc.size); !cmp.Equal(got, tc.want) {
				t.Errorf("preferred %v, want %v", got, tc.want)
			}
		})
	}
}

// TestMPSReplicas: under MPS a GPU's replicas are Unhealthy, and refused
// with the daemon's reason, until nri-gpu mps reports its daemon ready;
// then they serve with the mps annotation; a container gets replicas of
// one GPU (preferred from one GPU, refused across two).
func TestMPSReplicas(t *testing.T) {
	s := serveShared(t, "  sharing:\n    mps:\n      failRequestsGreaterThanOne: false\n      resources: [{name: nvidia.com/gpu, replicas: 2}]\n", 2)
	list := watch(t, s.clients["nvidia.com/gpu"])
	for _, d := range list() {
		if d.Health != pluginapi.Unhealthy {
			t.Errorf("device %s without a ready daemon: %s", d.ID, d.Health)
		}
	}
	g0, g1 := s.snap.GPUs[0].UUID, s.snap.GPUs[1].UUID
	if _, err := s.allocate("nvidia.com/gpu", s.replicas(0, 0)...); err == nil || !strings.Contains(err.Error(), "its MPS control daemon is not ready: nri-gpu mps has not reported") {
		t.Errorf("a replica without a ready daemon: %v", err)
	}
	st := *s.node.State()
	st.Shares, _ = st.Shares.WithMPS(map[string]sharing.MPSStatus{g0: {Ready: true}, g1: {Ready: true}}, "")
	s.node.Swap(&st)
	for _, d := range list() {
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s with a ready daemon: %s", d.ID, d.Health)
		}
	}
	r, err := s.allocate("nvidia.com/gpu", s.replicas(0, 1)...)
	if err != nil || r.Annotations[alloc.KubeletSharedAnnotation("nvidia.com/gpu")] != "mps:"+g0+"=1/2" {
		t.Errorf("an MPS replica: %v, %v", r, err)
	}
	if _, err := s.allocate("nvidia.com/gpu", s.replicas(0, 0)[0], s.replicas(1, 0)[0]); err == nil || !strings.Contains(err.Error(), "replicas of 2 GPUs shared with MPS") {
		t.Errorf("replicas of two MPS GPUs: %v", err)
	}
	available := []string{s.replicas(0, 1)[0], s.replicas(1, 0)[0], s.replicas(1, 1)[0]}
	if got := s.prefer(t, "nvidia.com/gpu", available, nil, 2); !cmp.Equal(got, s.replicas(1, 0, 1)) {
		t.Errorf("two MPS replicas preferred %v, want both of GPU 1", got)
	}
}
