package plugin

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// requestRecorder records what CreateContainer tells its observer.
type requestRecorder struct {
	mu   sync.Mutex
	seen []string
	gpus int
}

func (r *requestRecorder) Request(source, outcome string, gpus []inventory.GPU, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, source+"/"+outcome)
	r.gpus += len(gpus)
}
func (r *requestRecorder) Refresh(string)                {}
func (r *requestRecorder) Inventory(*inventory.Snapshot) {}
func (r *requestRecorder) Connected()                    {}

// TestObserveRequests checks the source and outcome each kind of request
// is counted under.
func TestObserveRequests(t *testing.T) {
	log := logrus.New()
	log.SetLevel(logrus.PanicLevel)
	p := memPlugin(config.Default(), log)
	rec := &requestRecorder{}
	p.SetObserver(rec)
	for i, tc := range []struct {
		ann  map[string]string
		env  []string
		want string
	}{
		{map[string]string{"gpus.nri-gpu.dev/container.c": "2"}, nil, "container-annotation/injected"},
		{map[string]string{"gpus.nri-gpu.dev/pod": "device=9"}, nil, "pod-annotation/refused"},
		{nil, []string{"NVIDIA_VISIBLE_DEVICES=0"}, "env/injected"},
		{nil, []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=warp"}, "env/refused"},
		{nil, []string{"NVIDIA_VISIBLE_DEVICES=void"}, "none/untouched"},
		{nil, nil, "none/untouched"},
		{map[string]string{"gpus.nri-gpu.dev/pod": "8,exclusive=true"}, nil, "pod-annotation/refused"}, // GPUs held: the table refuses
		{map[string]string{"nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=amd"}, nil, "cdi-annotation/refused"},
		{map[string]string{"nvidia.cdi.k8s.io/pod": "vendor.example/x=0"}, nil, "cdi-annotation/refused"},
	} {
		id := fmt.Sprint("ctr-", i)
		p.CreateContainer(context.Background(), &api.PodSandbox{Id: "pod-" + id, Annotations: tc.ann}, &api.Container{Id: id, PodSandboxId: "pod-" + id, Name: "c", Env: tc.env})
		if got := rec.seen[len(rec.seen)-1]; got != tc.want {
			t.Errorf("%v %v: observed %s, want %s", tc.ann, tc.env, got, tc.want)
		}
	}
	if rec.gpus != 3 {
		t.Errorf("observed %d GPUs injected, want 3", rec.gpus)
	}
}

// TestObserveIgnoredEnv checks that an NVIDIA_VISIBLE_DEVICES the policy
// ignores (answered with the variable set to void) counts as untouched.
func TestObserveIgnoredEnv(t *testing.T) {
	log := logrus.New()
	log.SetLevel(logrus.PanicLevel)
	cfg := config.Default()
	cfg.Policy.VisibleDevices = "deny"
	p := memPlugin(cfg, log)
	rec := &requestRecorder{}
	p.SetObserver(rec)
	adj, _, err := p.CreateContainer(context.Background(), &api.PodSandbox{Id: "pod"}, &api.Container{Id: "ctr", PodSandboxId: "pod", Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}})
	if err != nil || len(adj.GetEnv()) != 1 || adj.GetEnv()[0].Value != "void" {
		t.Fatalf("%v, %v", adj, err)
	}
	if got := rec.seen[len(rec.seen)-1]; got != "env/untouched" {
		t.Errorf("observed %s, want env/untouched", got)
	}
}
