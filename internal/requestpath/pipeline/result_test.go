package pipeline

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
)

// TestResultKindAndVoided: the Result names the kind serve decided, and
// says when the answer only voided a refused NVIDIA_VISIBLE_DEVICES (what
// the pod's Event and nri-gpu explain report), for every kind.
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
		ctr    *api.Container
		kind   string
		voided bool
		err    bool
	}{
		{"no request", policy.Policy{}, nil, &api.Container{}, "none", false, false},
		{"carrier unreadable", policy.Policy{}, nil, &api.Container{Env: strings.Split(strings.Repeat("A=1 ", request.MaxEnvEntries+1), " ")}, "", false, true},
		{"own request", policy.Policy{}, map[string]string{"gpus.nri-gpu.dev/pod": "1"}, &api.Container{}, "ownRequest", false, false},
		{"env voided", closed, nil, &api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}}, "ownRequest", true, false},
		{"annotation refused", closed, map[string]string{"gpus.nri-gpu.dev/pod": "1"}, &api.Container{}, "ownRequest", false, true},
		{"management", policy.Policy{}, map[string]string{"nvidia.cdi.k8s.io/pod": "management.nvidia.com/gpu=all"}, &api.Container{}, "management", false, false},
		{"privileged", policy.Policy{}, map[string]string{"gpus.nri-gpu.dev/pod": "1"}, &api.Container{Linux: privilegedLinux()}, "privileged", false, false},
		{"privileged env voided", closed, nil, &api.Container{Linux: privilegedLinux(), Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}}, "privileged", true, false},
		{"runtime given", policy.Policy{}, nil, &api.Container{Linux: pluginLinux(2)}, "runtimeGiven", false, false},
		{"runtime given, env voided", closed, nil, &api.Container{Linux: &api.LinuxContainer{}, CDIDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=2"}}, Env: []string{"NVIDIA_VISIBLE_DEVICES=2"}}, "runtimeGiven", true, false},
		{"kubelet assigned", closed, nil, kubeletContainer("main", uuid(1), nil, 1), "kubeletAssigned", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctr := tc.ctr
			ctr.Id, ctr.Name = "c", "main"
			adj, res, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), sharing.Shared, tc.pol, pod(tc.ann), ctr)
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if res.Kind != tc.kind || res.Voided != tc.voided {
				t.Errorf("Kind %q Voided %v, want %q %v (adjustment %v, note %q, err %v)", res.Kind, res.Voided, tc.kind, tc.voided, adj, res.Selection.Note, err)
			}
			if tc.voided && (res.Selection.Note == "" || res.Injected() || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "void") {
				t.Errorf("voided: note %q, injected %v, adjustment %v", res.Selection.Note, res.Injected(), adj)
			}
		})
	}
}

// TestResultKindClaim: a container that a prepared claim gave its
// devices is of kind claimAssigned.
func TestResultKindClaim(t *testing.T) {
	p := claimPath(t, sharing.Shared, preparedClaims())
	pod := &api.PodSandbox{Id: "p", Name: "p", Namespace: "ml"}
	ctr := &api.Container{Id: "c", Name: "main", Linux: pluginLinux(1, 3), Env: claimEnv(trainClaim, nil, 1, 3)}
	_, res, err := p.Handle(context.Background(), pod, ctr)
	if err != nil || res.Kind != "claimAssigned" || res.Voided {
		t.Errorf("Kind %q Voided %v err %v, want claimAssigned", res.Kind, res.Voided, err)
	}
}
