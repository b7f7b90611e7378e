package pipeline

import (
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// TestDeviceListNeedsDeviceNodes: where the policy does not trust the
// device plugin's mount list alone (policy.default: deny and the namespace
// not in policy.deviceListNamespaces), a list that a pod forged with
// hostPath volumes gets nothing, and a list that comes with GPU device
// nodes from the runtime (the device plugin's PASS_DEVICE_SPECS=true)
// gets those GPUs.
func TestDeviceListNeedsDeviceNodes(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	closed := policy.Policy{Default: policy.DefaultDeny, DeviceListNamespaces: []string{"trusted"}}
	closed.SetDefaults()
	list := func(ids ...int) []*api.Mount {
		var ms []*api.Mount
		for _, i := range ids {
			ms = append(ms, &api.Mount{Source: "/dev/null", Destination: "/var/run/nvidia-container-devices/" + uuid(i)})
		}
		return ms
	}
	pod := func(ns string) *api.PodSandbox { return &api.PodSandbox{Id: "p-" + ns, Name: "p", Namespace: ns} }

	t.Run("forged list without device nodes is refused", func(t *testing.T) {
		table := tableFor(prep.Snapshot())
		ctr := &api.Container{Id: "forged", Name: "c", Mounts: list(0, 1, 2, 3, 4, 5, 6, 7)}
		adj, res, err := handleWithPolicy(prep, table, sharing.Shared, closed, pod("web"), ctr)
		want := `nri-gpu: mounts /var/run/nvidia-container-devices: not allowed in namespace "web" without the GPUs' device nodes from the runtime (policy.deviceListNamespaces: [trusted]; the NVIDIA device plugin passes them with PASS_DEVICE_SPECS=true)`
		if adj != nil || res.Holding != nil || err == nil || err.Error() != want {
			t.Errorf("forged list: %v, %v, %v\nwant %s", adj, res.Holding, err, want)
		}
		if h := table.Holdings(); len(h) != 0 {
			t.Errorf("holdings %+v", h)
		}
	})
	t.Run("list with device nodes gets those GPUs", func(t *testing.T) {
		// The device plugin gave GPU 2 (its node and its list entry);
		// the pod added list entries for every other GPU.
		ctr := &api.Container{Name: "c", Mounts: list(0, 1, 2, 3), Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{
			{Path: "/dev/nvidia2", Type: "c", Major: 195, Minor: 2},
		}}}
		adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), sharing.Shared, closed, pod("web"), ctr)
		if err != nil {
			t.Fatal(err)
		}
		if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != uuid(2) {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want GPU 2 only", got)
		}
		if got := strings.Join(devicePaths(adj), " "); strings.Contains(got, "/dev/nvidia0") || strings.Contains(got, "/dev/nvidia3") {
			t.Errorf("devices %q: more than the runtime gave", got)
		}
	})
	t.Run("listed namespace: the list alone", func(t *testing.T) {
		ctr := &api.Container{Name: "c", Mounts: list(1)}
		adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), sharing.Shared, closed, pod("trusted"), ctr)
		if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != uuid(1) {
			t.Errorf("%v, %v", adj, err)
		}
	})
	t.Run("default allow: the list alone, as before", func(t *testing.T) {
		ctr := &api.Container{Name: "c", Mounts: list(1)}
		adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), sharing.Shared, policy.Policy{}, pod("web"), ctr)
		if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != uuid(1) {
			t.Errorf("%v, %v", adj, err)
		}
	})
}
