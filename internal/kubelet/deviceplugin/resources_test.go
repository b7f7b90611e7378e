package deviceplugin_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/kubelet/deviceplugin"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/pipeline"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// kubeletContainer is the container the kubelet creates from the Allocate
// answers of its resources, merged as the kubelet merges them
// (pkg/kubelet/cm/devicemanager, GetDeviceRunContainerOptions): a device
// spec once per container path, and of each annotation key the first
// value ("Annotation has conflicting setting" for a later, different
// one). The runtime then gives the container the specs' device nodes,
// with their numbers (those of snap's nodes of the same paths), a
// deny-all device cgroup rule and one allow rule per node, and hands the
// annotations to NRI as the container's.
func kubeletContainer(t *testing.T, snap *inventory.Snapshot, id string, resps ...*pluginapi.ContainerAllocateResponse) *api.Container {
	t.Helper()
	numbers := map[string]inventory.DeviceNode{}
	for _, g := range snap.Units() {
		numbers[g.Node.Path] = g.Node
		if g.MIG != nil {
			numbers[g.MIG.GINode.Path], numbers[g.MIG.CINode.Path] = g.MIG.GINode, g.MIG.CINode
		}
	}
	c := &api.Container{Id: id, PodSandboxId: "pod", Name: id, State: api.ContainerState_CONTAINER_RUNNING, Annotations: map[string]string{},
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{{Access: "rwm"}}}}}
	for _, r := range resps {
		for _, d := range r.Devices {
			if slices.ContainsFunc(c.Linux.Devices, func(have *api.LinuxDevice) bool { return have.Path == d.ContainerPath }) {
				continue
			}
			n, ok := numbers[d.HostPath]
			if !ok {
				t.Fatalf("device spec %v names no node of the snapshot", d)
			}
			c.Linux.Devices = append(c.Linux.Devices, &api.LinuxDevice{Path: d.ContainerPath, Type: "c", Major: n.Major, Minor: n.Minor})
			c.Linux.Resources.Devices = append(c.Linux.Resources.Devices, &api.LinuxDeviceCgroup{Allow: true, Type: "c",
				Major: &api.OptionalInt64{Value: n.Major}, Minor: &api.OptionalInt64{Value: n.Minor}, Access: "rw"})
		}
		for k, v := range r.Annotations {
			if _, ok := c.Annotations[k]; !ok {
				c.Annotations[k] = v
			}
		}
	}
	return c
}

// TestResourcesOfOneContainer: under migStrategy mixed, a container that
// the kubelet gives a whole GPU (nvidia.com/gpu) and a MIG device of
// another resource (nvidia.com/mig-2g.20gb) carries both resources'
// annotations through the kubelet's merge, and the request path trusts
// their union against its device nodes: it gets both, booked as the
// kubelet's, at CreateContainer and again at Synchronize (Holdings). Two
// containers of a pod, each given another resource, each get their own.
func TestResourcesOfOneContainer(t *testing.T) {
	snap := simnode.MemoryMIGSnapshot()
	dir := socketDir(t)
	k := startKubelet(t, dir, false)
	n := node.Fixed(stateOf(snap), quietLog())
	c := config.Default().DevicePlugin
	c.SocketDir, c.MIGStrategy = dir, config.MIGStrategyMixed
	opts := deviceplugin.Resources(c, snap)
	for _, o := range opts {
		runPlugin(t, n, o)
	}
	clients := map[string]pluginapi.DevicePluginClient{}
	for len(clients) < len(opts) {
		select {
		case r := <-k.reqs:
			clients[r.ResourceName] = k.dial(r)
		case <-time.After(wait):
			t.Fatalf("registered %d resources of %d", len(clients), len(opts))
		}
	}
	allocate := func(resource string, ids ...string) *pluginapi.ContainerAllocateResponse {
		t.Helper()
		r, err := clients[resource].Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
		if err != nil {
			t.Fatalf("Allocate %s %v: %v", resource, ids, err)
		}
		return r.ContainerResponses[0]
	}
	whole := snap.GPUs[2] // MIG off
	mig := snap.MIG[7]    // 1:0, a 2g.20gb of GPU 1
	small := snap.MIG[0]  // 0:0, a 1g.10gb of GPU 0
	gpu := allocate("nvidia.com/gpu", whole.UUID)
	if got, want := gpu.Annotations, map[string]string{"gpus.nri-gpu.dev/kubelet.nvidia.com_gpu": whole.UUID}; !cmp.Equal(got, want) {
		t.Errorf("nvidia.com/gpu annotations %v, want %v", got, want)
	}
	both := kubeletContainer(t, snap, "both", gpu, allocate("nvidia.com/mig-2g.20gb", mig.UUID))
	if len(both.Annotations) != 2 {
		t.Fatalf("merged annotations %v: want one per resource", both.Annotations)
	}
	first := kubeletContainer(t, snap, "first", allocate("nvidia.com/gpu", whole.UUID))
	second := kubeletContainer(t, snap, "second", allocate("nvidia.com/mig-1g.10gb", small.UUID))

	src := adjust.Prepare(snap, adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64"})
	pod := &api.PodSandbox{Id: "pod", Name: "p", Namespace: "ml"}
	unit := func(g inventory.GPU) int { return g.Index }
	wholeUnit, migUnit, smallUnit := unit(whole), inventory.MIGKey(mig.Parent, mig.Index), inventory.MIGKey(small.Parent, small.Index)
	for _, tc := range []struct {
		name string
		ctrs []*api.Container
		want []alloc.Holding
	}{
		{"two resources in one container", []*api.Container{both}, []alloc.Holding{
			{Holder: pipeline.HolderOf(pod, both), Mode: sharing.Shared, GPUs: []int{wholeUnit, migUnit}, Kubelet: true, Runtime: true}}},
		{"two containers of a pod, one resource each", []*api.Container{first, second}, []alloc.Holding{
			{Holder: pipeline.HolderOf(pod, first), Mode: sharing.Shared, GPUs: []int{wholeUnit}, Kubelet: true, Runtime: true},
			{Holder: pipeline.HolderOf(pod, second), Mode: sharing.Shared, GPUs: []int{smallUnit}, Kubelet: true, Runtime: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pipeline.Path{Source: src, Table: simnode.TableFor(snap), Sharing: sharing.Shared}
			var got []alloc.Holding
			for _, ctr := range tc.ctrs {
				adj, res, err := p.Handle(context.Background(), pod, ctr)
				if err != nil || len(res.Warnings) != 0 || res.Holding == nil {
					t.Fatalf("%s: %v, warnings %q, holding %v", ctr.Id, err, res.Warnings, res.Holding)
				}
				got = append(got, *res.Holding)
				if len(adj.GetMounts()) == 0 {
					t.Errorf("%s: no driver files", ctr.Id)
				}
				var ids []string
				for _, g := range res.GPUs {
					ids = append(ids, g.UUID)
				}
				env := map[string]string{}
				for _, e := range adj.GetEnv() {
					env[e.GetKey()] = e.GetValue()
				}
				if got, want := env["NVIDIA_VISIBLE_DEVICES"], strings.Join(ids, ","); got != want {
					t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want %q", ctr.Id, got, want)
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("holdings at CreateContainer (-want +got):\n%s", d)
			}
			rebuilt, warnings := p.Holdings([]*api.PodSandbox{pod}, tc.ctrs)
			if len(warnings) != 0 {
				t.Errorf("Synchronize warnings %q", warnings)
			}
			if d := cmp.Diff(tc.want, rebuilt); d != "" {
				t.Errorf("holdings rebuilt at Synchronize (-want +got):\n%s", d)
			}
		})
	}
}
