package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/dra"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/ops/events"
	"github.com/nri-gpu/nri-gpu/internal/ops/kubeapi"
	"github.com/nri-gpu/nri-gpu/internal/ops/metrics"
	"github.com/nri-gpu/nri-gpu/plugin"
)

// startMetrics serves the metrics and health endpoints on laddr (checked
// by metrics.NormalizeAddr) until ctx is done; an empty laddr serves
// nothing.
func startMetrics(ctx context.Context, laddr string, p *plugin.Plugin, log *logrus.Logger) error {
	if laddr == "" {
		return nil
	}
	m := metrics.New(Version)
	p.SetObserver(m)
	m.SetAllocations(func() []metrics.Allocation {
		var out []metrics.Allocation
		for _, g := range p.Status().GPUs {
			out = append(out, metrics.Allocation{Index: g.Index, UUID: g.UUID, Holders: len(g.Holders)})
		}
		return out
	})
	bound, errc, err := metrics.Serve(ctx, laddr, metrics.Handler(m, p.NotReady))
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	log.Infof("serving /metrics, /healthz and /readyz on http://%s", bound)
	go func() {
		if err := <-errc; err != nil {
			log.WithError(err).Error("metrics listener stopped")
		}
	}()
	return nil
}

// startWatcher follows the node and the configuration file until ctx is
// done.
func startWatcher(ctx context.Context, p *plugin.Plugin, cfgPath string, interval time.Duration) (*node.Watcher, error) {
	if interval == 0 {
		interval = -1 // the flag's 0 means no periodic rediscovery
	}
	w, err := p.Node().NewWatcher(node.WatchOptions{ConfigPath: cfgPath, Interval: interval})
	if err != nil {
		return nil, err
	}
	go w.Run(ctx)
	// XID health, where NVML is (or becomes) available.
	go p.Node().RunHealth(ctx, 0)
	// The readiness of the MPS control daemons nri-gpu mps runs.
	go p.Node().RunMPS(ctx, 0)
	return w, nil
}

// startEvents makes p's refused and voided requests Kubernetes Events on
// their pods (package events) until ctx is done, when events.enabled says
// so and an API server client can be made: dra.kubeconfig, else the pod's
// service account. Without one nri-gpu serves on, and refusals are only
// logged (a warning when events.enabled was set, else a note).
func startEvents(ctx context.Context, cfg config.Config, p *plugin.Plugin, log *logrus.Logger) {
	if !cfg.Events.On() {
		log.Info("events: off (events.enabled: false): refusals are only logged")
		return
	}
	off := log.Infof
	if cfg.Events.Explicit() {
		off = log.Warnf
	}
	rc, err := kubeapi.Config(cfg.DRA.Kubeconfig)
	if err != nil {
		off("events: off: %v; refusals are only logged", err)
		return
	}
	host := os.Getenv(dra.NodeNameEnv)
	if host == "" {
		host, _ = os.Hostname()
	}
	r, err := events.New(ctx, rc, host, logrus.NewEntry(log))
	if err != nil {
		off("events: off: %v; refusals are only logged", err)
		return
	}
	p.SetEventSink(r)
	log.Infof("events: refused and voided requests are reported on their pods (API server %s)", rc.Host)
}
