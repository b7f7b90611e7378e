package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/ops/metrics"
	"github.com/nri-gpu/nri-gpu/plugin"
)

// startMetrics serves the metrics and health endpoints on addr until ctx
// is done; an empty addr serves nothing.
func startMetrics(ctx context.Context, addr string, p *plugin.Plugin, log *logrus.Logger) error {
	if addr == "" {
		return nil
	}
	laddr, err := metrics.NormalizeAddr(addr)
	if err != nil {
		return usageError{fmt.Errorf("--metrics-addr: %v", err)}
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
