package pipeline

import (
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// TestManagementAgainstExclusive: a management request is refused where
// it would reach a GPU that another container holds exclusively, and
// books nothing where it is served.
func TestManagementAgainstExclusive(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	table := tableFor(prep.Snapshot())
	mgmt := &api.PodSandbox{Id: "p-dcgm", Name: "dcgm", Namespace: "gpu-operator", Annotations: map[string]string{"nvidia.cdi.k8s.io/pod": "management.nvidia.com/gpu=all"}}
	if adj, res, err := handle(prep, table, sharing.Shared, mgmt, &api.Container{Id: "m1", Name: "dcgm"}); err != nil || adj == nil || res.Holding != nil {
		t.Fatalf("management on a free node: %v, %v, %v", adj, err, res.Holding)
	}
	train := &api.PodSandbox{Id: "p-train", Name: "train", Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "exclusive=true,device=5"}}
	if _, _, err := handle(prep, table, sharing.Shared, train, &api.Container{Id: "t", Name: "main"}); err != nil {
		t.Fatalf("exclusive request after a management container: %v", err)
	}
	adj, _, err := handle(prep, table, sharing.Shared, mgmt, &api.Container{Id: "m2", Name: "dcgm"})
	if want := "nri-gpu: annotation nvidia.cdi.k8s.io/pod: GPU 5 is held exclusively by a pod in another namespace (exclusive)"; adj != nil || err == nil || err.Error() != want {
		t.Errorf("management next to an exclusive holder: %v, %v, want %s", adj, err, want)
	}
	// A pod-level request is the pod's: released with the pod.
	table.ReleasePod("p-train")
	if adj, _, err := handle(prep, table, sharing.Shared, mgmt, &api.Container{Id: "m3", Name: "dcgm"}); err != nil || adj == nil {
		t.Errorf("management after the exclusive holder left: %v, %v", adj, err)
	}
}
