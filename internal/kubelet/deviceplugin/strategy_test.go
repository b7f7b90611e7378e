package deviceplugin_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/deviceplugin"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestMIGStrategies: on a node with MIG on GPUs 0 (7x 1g.10gb) and 1
// (3x 2g.20gb, 1x 1g.10gb), none advertises the six whole GPUs, single
// those and the eleven MIG devices, mixed the whole GPUs and one resource
// per profile; Allocate of a MIG device gives its parent's node and its
// two capability nodes.
func TestMIGStrategies(t *testing.T) {
	snap := simnode.MemoryMIGSnapshot()
	for _, tc := range []struct {
		strategy string
		want     map[string]int
	}{
		{"none", map[string]int{"nvidia.com/gpu": 6}},
		{"single", map[string]int{"nvidia.com/gpu": 17}},
		{"mixed", map[string]int{"nvidia.com/gpu": 6, "nvidia.com/mig-1g.10gb": 8, "nvidia.com/mig-2g.20gb": 3}},
	} {
		t.Run(tc.strategy, func(t *testing.T) {
			dir := socketDir(t)
			k := startKubelet(t, dir, false)
			n := node.Fixed(stateOf(snap), quietLog())
			c := config.Default().DevicePlugin
			c.SocketDir, c.MIGStrategy = dir, tc.strategy
			for _, o := range deviceplugin.Resources(c, snap) {
				runPlugin(t, n, o)
			}
			regs := map[string]*pluginapi.RegisterRequest{}
			for len(regs) < len(tc.want) {
				select {
				case r := <-k.reqs:
					regs[r.ResourceName] = r
				case <-time.After(wait):
					t.Fatalf("registered %d resources, want %v", len(regs), tc.want)
				}
			}
			for res, count := range tc.want {
				r, ok := regs[res]
				if !ok {
					t.Fatalf("%s not registered (got %v)", res, regs)
				}
				cl := k.dial(r)
				devs := watch(t, cl)()
				if len(devs) != count {
					t.Errorf("%s: %d devices %v, want %d", res, len(devs), ids(devs), count)
				}
				if res != "nvidia.com/mig-2g.20gb" {
					continue
				}
				mig := snap.MIG[7] // 1:0, GI 3 of GPU 1
				if devs[0].ID != mig.UUID {
					t.Fatalf("%s lists %s first, want %s", res, devs[0].ID, mig.UUID)
				}
				resp, err := cl.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{mig.UUID}}}})
				if err != nil {
					t.Fatal(err)
				}
				var paths []string
				for _, d := range resp.ContainerResponses[0].Devices {
					paths = append(paths, d.HostPath)
				}
				want := []string{"/dev/nvidia1", mig.GINode.Path, mig.CINode.Path}
				if !slices.Equal(paths, want) {
					t.Errorf("Allocate %s: %q, want %q", mig.UUID, paths, want)
				}
				if !strings.HasPrefix(mig.Profile, "2g.") {
					t.Errorf("profile %s", mig.Profile)
				}
			}
		})
	}
}

// TestResourcesDevices: devicePlugin.devices keeps each resource to the
// listed GPUs and their MIG devices, so that the others can be DRA's.
func TestResourcesDevices(t *testing.T) {
	snap := simnode.MemoryMIGSnapshot()
	for _, tc := range []struct {
		strategy string
		devices  []string
		want     map[string]int
	}{
		{"single", nil, map[string]int{"nvidia.com/gpu": 17}},
		// GPU 0 has MIG on (seven 1g.10gb), GPU 2 is whole.
		{"single", []string{"0", "2"}, map[string]int{"nvidia.com/gpu": 8}},
		{"mixed", []string{"1", snap.GPUs[3].UUID}, map[string]int{"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 3}},
		{"none", []string{snap.GPUs[0].BusID}, map[string]int{"nvidia.com/gpu": 0}},
	} {
		c := config.Default().DevicePlugin
		c.MIGStrategy, c.Devices = tc.strategy, tc.devices
		got := map[string]int{}
		for _, o := range deviceplugin.Resources(c, snap) {
			got[o.ResourceName] = 0
		}
		// What each resource advertises: the units the plan gives it.
		for _, u := range sharing.NewPlan(c.SharingSpec(), snap.Units()).Units {
			if _, ok := got[u.Resource]; !ok {
				t.Errorf("%s %v: the plan gives %s to %s, which Resources does not serve", tc.strategy, tc.devices, u.GPU.ID(), u.Resource)
			}
			got[u.Resource]++
		}
		if !maps.Equal(got, tc.want) {
			t.Errorf("%s %v: %v, want %v", tc.strategy, tc.devices, got, tc.want)
		}
	}
}
