package pipeline

import (
	"slices"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// TestCountAvoidsKubeletGPUs: a count request never gets a GPU that the
// kubelet assigned a container (nri-gpu's device plugin's or another's
// DeviceSpecs), on a shared node too, where the kubelet's holding is
// shared: the kubelet hands that GPU out by its own accounting, so a count
// that took it would be a second user the scheduler does not know of.
// Named requests (device=) are the pod author's explicit choice under the
// policy and may share it. (On a shared node a count of 6 got GPUs 1, 3
// and 5 before the table marked the runtime's bookings.)
func TestCountAvoidsKubeletGPUs(t *testing.T) {
	for _, sharing := range []sharing.Mode{sharing.Shared, sharing.Exclusive} {
		t.Run(sharing.String(), func(t *testing.T) {
			prep := adjust.Prepare(benchSnapshot(), layout)
			table := tableFor(prep.Snapshot())
			kpod := &api.PodSandbox{Id: "p-k", Name: "k", Namespace: "ml"}
			if _, res, err := handle(prep, table, sharing, kpod, kubeletContainer("main", uuid(1)+","+uuid(3), nil, 1, 3)); err != nil || res.Holding == nil || !res.Holding.Kubelet {
				t.Fatalf("kubelet's container: %v, %+v", err, res)
			}
			// A device plugin's DeviceSpecs without nri-gpu's annotation
			// (NVIDIA's device plugin with PASS_DEVICE_SPECS).
			other := &api.Container{Id: "nv", PodSandboxId: "p-k", Name: "nv", Linux: pluginLinux(5)}
			if _, _, err := handle(prep, table, sharing, kpod, other); err != nil {
				t.Fatal(err)
			}
			count := func(id, n string) ([]int, error) {
				pod := &api.PodSandbox{Id: "p-" + id, Name: id, Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/container.c": n}}
				_, res, err := handle(prep, table, sharing, pod, &api.Container{Id: id, PodSandboxId: "p-" + id, Name: "c"})
				if err != nil {
					return nil, err
				}
				return res.Holding.GPUs, nil
			}
			if got, err := count("five", "5"); err != nil || !slices.Equal(got, []int{0, 2, 4, 6, 7}) {
				t.Errorf("count 5: %v, %v; want the 5 GPUs nobody was given", got, err)
			}
			// 6 GPUs: only 5 were given to nobody by the runtime.
			if got, err := count("six", "6"); err == nil {
				t.Errorf("count 6: got %v, which includes a GPU the runtime gave another container", got)
			}
		})
	}
}
