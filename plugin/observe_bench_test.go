package plugin

import (
	"context"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/ops/metrics"
)

// benchCreate measures CreateContainer (the request path plus logging and
// the observer) with obs, or without an observer when obs is nil.
func benchCreate(b *testing.B, obs Observer) {
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel) // no injection log line: measure the rest
	p := memPlugin(config.Default(), log)
	if obs != nil {
		p.SetObserver(obs)
	}
	pod := &api.PodSandbox{Id: "pod", Name: "p", Namespace: "default", Annotations: map[string]string{
		"gpus.nri-gpu.dev/container.train": "all,capabilities=all",
	}}
	ctr := &api.Container{Id: "ctr", PodSandboxId: "pod", Name: "train", Env: []string{"PATH=/usr/bin:/bin"}}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := p.CreateContainer(context.Background(), pod, ctr); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateContainer is CreateContainer without metrics.
func BenchmarkCreateContainer(b *testing.B) { benchCreate(b, nil) }

// BenchmarkCreateContainerMetrics is CreateContainer with the Prometheus
// observer: the cost of --metrics-addr per request.
func BenchmarkCreateContainerMetrics(b *testing.B) { benchCreate(b, metrics.New("bench")) }
