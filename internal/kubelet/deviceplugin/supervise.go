package deviceplugin

import (
	"context"
	"slices"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Supervise runs the device plugins c asks for on n (Resources) until ctx
// ends, and follows the node's state: a resource that a new state asks for
// (under migStrategy mixed, a MIG profile that a layout change made
// appear) gets its plugin, which registers with the kubelet; a resource
// that a new state no longer asks for (no MIG device of that profile
// left) has its plugin stopped and its socket removed, so that the kubelet
// stops advertising it. A plugin
// that fails is logged and not restarted until its resource goes and comes
// back. Supervise returns when every plugin has stopped.
func Supervise(ctx context.Context, n *node.Node, c config.DevicePlugin, log *logrus.Logger) {
	type running struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	plugins := map[string]*running{}
	changed := make(chan struct{}, 1)
	unsubscribe := n.Subscribe(func(*node.State) {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	defer unsubscribe()
	var wg sync.WaitGroup
	reconcile := func() {
		want := Resources(c, &inventory.Snapshot{})
		if st := n.State(); st != nil && st.Shares != nil {
			want = resourcesOf(c, st.Shares)
		} else if st != nil {
			want = Resources(c, st.Snapshot())
		}
		var names []string
		for _, o := range want {
			names = append(names, o.ResourceName)
			if plugins[o.ResourceName] != nil {
				continue
			}
			dp := New(n, o, log)
			pctx, cancel := context.WithCancel(ctx)
			r := &running{cancel: cancel, done: make(chan struct{})}
			plugins[o.ResourceName] = r
			log.WithFields(logrus.Fields{"resource": o.ResourceName, "socket": dp.Socket(), "migStrategy": c.MIGStrategy}).Info("device plugin: starting (devicePlugin.enabled)")
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer close(r.done)
				if err := dp.Run(pctx); err != nil {
					log.WithError(err).Errorf("device plugin stopped: the kubelet does not see this node's %s", o.ResourceName)
				}
			}()
		}
		for name, r := range plugins {
			if slices.Contains(names, name) {
				continue
			}
			log.WithField("resource", name).Info("device plugin: the node has no device of this resource any more (MIG layout or sharing change): stopping it")
			r.cancel()
			<-r.done
			delete(plugins, name)
		}
	}
	reconcile()
	for {
		select {
		case <-ctx.Done():
			for _, r := range plugins {
				r.cancel()
			}
			wg.Wait()
			return
		case <-changed:
			reconcile()
		}
	}
}
