package pipeline

import (
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// TestRefusalNamesNoOtherTenant: the message of a refused request, which
// the runtime shows to the pod, names no pod of another namespace.
func TestRefusalNamesNoOtherTenant(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	table := tableFor(prep.Snapshot())
	ann := func(ns, name, val string) *api.PodSandbox {
		return &api.PodSandbox{Id: "p-" + name, Name: name, Namespace: ns, Annotations: map[string]string{"gpus.nri-gpu.dev/pod": val}}
	}
	if _, _, err := handle(prep, table, sharing.Shared, ann("team-a", "secret-project", "exclusive=true,device=3"), &api.Container{Id: "a", Name: "main"}); err != nil {
		t.Fatal(err)
	}
	_, _, err := handle(prep, table, sharing.Shared, ann("team-b", "probe", "device=3"), &api.Container{Id: "b", Name: "main"})
	if want := "nri-gpu: annotation gpus.nri-gpu.dev/pod: GPU 3 is held exclusively by a pod in another namespace (exclusive)"; err == nil || err.Error() != want {
		t.Errorf("other namespace: %v, want %s", err, want)
	}
	_, _, err = handle(prep, table, sharing.Shared, ann("team-b", "probe", "8"), &api.Container{Id: "b", Name: "main"})
	if err == nil || strings.Contains(err.Error(), "team-a") || strings.Contains(err.Error(), "secret-project") {
		t.Errorf("count request: %v names the other tenant's pod", err)
	}
	// In its own namespace the holder is named.
	_, _, err = handle(prep, table, sharing.Shared, ann("team-a", "other", "device=3"), &api.Container{Id: "c", Name: "main"})
	if want := "nri-gpu: annotation gpus.nri-gpu.dev/pod: GPU 3 is held exclusively by team-a/secret-project (exclusive)"; err == nil || err.Error() != want {
		t.Errorf("same namespace: %v, want %s", err, want)
	}
}
