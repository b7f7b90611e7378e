package plugin

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"
	"k8s.io/client-go/rest"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/ops/events"
)

// sinkRecorder keeps what the plugin reports.
type sinkRecorder struct {
	mu  sync.Mutex
	got []events.Event
}

func (s *sinkRecorder) Report(e events.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, e)
}

func (s *sinkRecorder) take() []events.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.got
	s.got = nil
	return out
}

// closedConfig is the shipped closed policy with namespace ml allowed to
// ask by annotation.
func closedConfig() config.Config {
	cfg := config.Default()
	cfg.Policy = policy.Policy{Default: policy.DefaultDeny, VisibleDevices: policy.VisibleDevicesDeny, AnnotationNamespaces: []string{"ml"}}
	cfg.Policy.SetDefaults()
	return cfg
}

// TestPodEvents: a refused request and an NVIDIA_VISIBLE_DEVICES voided by
// the policy each tell the pod, naming the container, the carrier, the
// bad token or the policy key; a served request, a request for nothing
// and a sandbox that is no Kubernetes pod (no name) tell nothing.
func TestPodEvents(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	p := memPlugin(closedConfig(), log)
	sink := &sinkRecorder{}
	p.SetEventSink(sink)
	pod := func(ns, name string, ann map[string]string) *api.PodSandbox {
		return &api.PodSandbox{Id: "pod-" + name, Name: name, Namespace: ns, Uid: "uid-" + name, Annotations: ann}
	}
	for _, tc := range []struct {
		name   string
		pod    *api.PodSandbox
		env    []string
		reason string
		source string
		want   []string
	}{
		{"closed-policy void", pod("tenant", "cuda", nil), []string{"NVIDIA_VISIBLE_DEVICES=0"}, events.ReasonVoided, "env NVIDIA_VISIBLE_DEVICES",
			[]string{`container main: env NVIDIA_VISIBLE_DEVICES ignored: not allowed in namespace "tenant"`, "policy.visibleDevices: deny", "set to void: it runs without GPUs"}},
		{"over-request", pod("ml", "big", map[string]string{"gpus.nri-gpu.dev/pod": "9"}), nil, events.ReasonRefused, "annotation gpus.nri-gpu.dev/pod",
			[]string{"container main: annotation gpus.nri-gpu.dev/pod: count 9 exceeds the node's 8 GPUs (0-7); not created"}},
		{"bad annotation", pod("ml", "typo", map[string]string{"gpus.nri-gpu.dev/container.main": "device=bogus"}), nil, events.ReasonRefused, "annotation gpus.nri-gpu.dev/container.main",
			[]string{`unknown device "bogus"`, "valid:"}},
		{"annotation in a closed namespace", pod("tenant", "ann", map[string]string{"gpus.nri-gpu.dev/pod": "1"}), nil, events.ReasonRefused, "annotation gpus.nri-gpu.dev/pod",
			[]string{`not allowed in namespace "tenant"`, "policy.annotationNamespaces"}},
		{"served", pod("ml", "ok", map[string]string{"gpus.nri-gpu.dev/pod": "1"}), nil, "", "", nil},
		{"no request", pod("tenant", "plain", nil), nil, "", "", nil},
		{"not a Kubernetes pod", &api.PodSandbox{Id: "crictl", Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "9"}}, nil, "", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctr := &api.Container{Id: "ctr-" + tc.name, PodSandboxId: tc.pod.Id, Name: "main", Env: tc.env}
			p.CreateContainer(context.Background(), tc.pod, ctr)
			got := sink.take()
			if tc.reason == "" {
				if len(got) != 0 {
					t.Errorf("reported %+v, want nothing", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("reported %d Events, want 1: %+v", len(got), got)
			}
			e := got[0]
			if e.Namespace != tc.pod.Namespace || e.Pod != tc.pod.Name || e.UID != tc.pod.Uid || e.Container != "main" || e.Reason != tc.reason || e.Source != tc.source {
				t.Errorf("Event %+v, want pod %s/%s, reason %s, source %q", e, tc.pod.Namespace, tc.pod.Name, tc.reason, tc.source)
			}
			for _, w := range tc.want {
				if !strings.Contains(e.Message, w) {
					t.Errorf("message %q lacks %q", e.Message, w)
				}
			}
		})
	}
}

// TestPodEventNamesNoOtherTenant: the Event of a refusal by the
// allocation table says what the runtime shows the pod, which names no
// pod of another namespace (nri-gpu's log names it).
func TestPodEventNamesNoOtherTenant(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	cfg := closedConfig()
	cfg.Policy.AnnotationNamespaces = []string{"team-a", "team-b"}
	p := memPlugin(cfg, log)
	sink := &sinkRecorder{}
	p.SetEventSink(sink)
	own := &api.PodSandbox{Id: "a", Name: "secret-project", Namespace: "team-a", Uid: "ua", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "exclusive=true,device=3"}}
	if _, _, err := p.CreateContainer(context.Background(), own, &api.Container{Id: "ca", PodSandboxId: "a", Name: "main"}); err != nil {
		t.Fatal(err)
	}
	other := &api.PodSandbox{Id: "b", Name: "probe", Namespace: "team-b", Uid: "ub", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "device=3"}}
	if _, _, err := p.CreateContainer(context.Background(), other, &api.Container{Id: "cb", PodSandboxId: "b", Name: "main"}); err == nil {
		t.Fatal("served a GPU held exclusively")
	}
	got := sink.take()
	if len(got) != 1 || got[0].Source != "annotation gpus.nri-gpu.dev/pod" || !strings.Contains(got[0].Message, "held exclusively by a pod in another namespace") ||
		strings.Contains(got[0].Message, "secret-project") || strings.Contains(got[0].Message, "team-a") {
		t.Errorf("Events %+v", got)
	}
}

// BenchmarkCreateContainerEvents is CreateContainer of a container whose
// NVIDIA_VISIBLE_DEVICES the closed policy voids (an Event each time),
// side by side: without an event sink ("none"), with client-go's recorder
// writing to an API server that answers ("live") and to one that takes
// connections and never answers ("blocked"). The ratio blocked/none is
// what a dead API server costs the request path (docs/benchmarks.md).
func BenchmarkCreateContainerEvents(b *testing.B) {
	answering := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"kind":"Event","apiVersion":"v1","metadata":{"name":"e","namespace":"tenant"}}`)
	}))
	defer answering.Close()
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer hanging.Close()
	defer close(release)
	for _, bc := range []struct {
		name string
		host string
	}{{"none", ""}, {"live", answering.URL}, {"blocked", hanging.URL}} {
		b.Run(bc.name, func(b *testing.B) {
			log := logrus.New()
			log.SetOutput(io.Discard)
			log.SetLevel(logrus.WarnLevel)
			p := memPlugin(closedConfig(), log)
			if bc.host != "" {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				r, err := events.New(ctx, &rest.Config{Host: bc.host}, "bench", logrus.NewEntry(log))
				if err != nil {
					b.Fatal(err)
				}
				defer r.Stop()
				p.SetEventSink(r)
			}
			pod := &api.PodSandbox{Id: "pod", Name: "cuda", Namespace: "tenant", Uid: "uid"}
			ctr := &api.Container{Id: "ctr", PodSandboxId: "pod", Name: "main", Env: []string{"PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=0"}}
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := p.CreateContainer(context.Background(), pod, ctr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
