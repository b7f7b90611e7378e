package pipeline

import (
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// TestResultKindAndVoided: the Result names the kind serve decided, and
// says when the answer only voided a refused NVIDIA_VISIBLE_DEVICES (what
// the pod's Event and nri-gpu explain report).
func TestResultKindAndVoided(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	closed := policy.Policy{Default: policy.DefaultDeny, VisibleDevices: policy.VisibleDevicesDeny}
	pod := func(ann map[string]string) *api.PodSandbox {
		return &api.PodSandbox{Id: "p", Name: "p", Namespace: "tenant", Annotations: ann}
	}
	for _, tc := range []struct {
		name   string
		pol    policy.Policy
		ann    map[string]string
		env    []string
		kind   string
		voided bool
		err    bool
	}{
		{"no request", policy.Policy{}, nil, nil, "none", false, false},
		{"own request", policy.Policy{}, map[string]string{"gpus.nri-gpu.dev/pod": "1"}, nil, "ownRequest", false, false},
		{"env voided", closed, nil, []string{"NVIDIA_VISIBLE_DEVICES=0"}, "ownRequest", true, false},
		{"annotation refused", closed, map[string]string{"gpus.nri-gpu.dev/pod": "1"}, nil, "ownRequest", false, true},
		{"management", policy.Policy{}, map[string]string{"nvidia.cdi.k8s.io/pod": "management.nvidia.com/gpu=all"}, nil, "management", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adj, res, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), sharing.Shared, tc.pol, pod(tc.ann), &api.Container{Id: "c", Name: "main", Env: tc.env})
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if res.Kind != tc.kind || res.Voided != tc.voided {
				t.Errorf("Kind %q Voided %v, want %q %v (adjustment %v, note %q)", res.Kind, res.Voided, tc.kind, tc.voided, adj, res.Selection.Note)
			}
			if tc.voided && (res.Selection.Note == "" || res.Injected()) {
				t.Errorf("voided: note %q, injected %v", res.Selection.Note, res.Injected())
			}
		})
	}
}
