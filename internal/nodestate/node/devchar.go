package node

import (
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/devchar"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// KeepDevCharLinks has the node keep the host's /dev/char links of the
// device nodes it serves (package devchar), as devCharLinks configures:
// made at every discovery that becomes current, removed by
// RemoveDevCharLinks, or when a configuration switches them off. Only
// `nri-gpu run` keeps them; other commands that discover the node touch
// nothing of the host.
func KeepDevCharLinks() Option { return func(n *Node) { n.devChar = true } }

func devCharOptions(cfg config.Config) devchar.Options {
	return devchar.Options{HostRoot: cfg.HostRoot, StateDir: cfg.DevCharLinks.StateDirUnder(cfg.HostRoot)}
}

// syncDevCharLinks makes the missing links of snap's nodes, or removes
// those nri-gpu made when cfg switches them off. A failure is a warning:
// containers are served either way. The caller holds mu.
func (n *Node) syncDevCharLinks(cfg config.Config, snap *inventory.Snapshot, vendor bool) {
	if !n.devChar {
		return
	}
	o := devCharOptions(cfg)
	if !cfg.DevCharLinks.On() || vendor {
		n.removeDevCharLinks(o)
		return
	}
	res, err := devchar.Ensure(o, devchar.Nodes(snap))
	for _, l := range res.Created {
		n.log.WithFields(logrus.Fields{"link": l.Path(), "target": l.Target}).Info("devCharLinks: created")
	}
	for _, l := range res.Removed {
		n.log.WithFields(logrus.Fields{"link": l.Path(), "target": l.Target}).Info("devCharLinks: removed (its node is gone)")
	}
	for _, f := range res.Foreign {
		n.log.Warnf("devCharLinks: %s: left alone (not nri-gpu's)", f)
	}
	if err != nil {
		n.log.WithError(err).Warnf("devCharLinks: cannot keep the /dev/char links under %s (with the systemd cgroup driver, containers may lose their GPUs at systemctl daemon-reload; see nri-gpu doctor)", cfg.HostRoot)
	}
}

// RemoveDevCharLinks removes the /dev/char links the node made (and only
// those): `nri-gpu run` calls it when it stops.
func (n *Node) RemoveDevCharLinks() {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.state.Load()
	if !n.devChar || st == nil {
		return
	}
	n.removeDevCharLinks(devCharOptions(st.Config))
}

func (n *Node) removeDevCharLinks(o devchar.Options) {
	removed, err := devchar.Remove(o)
	if len(removed) > 0 {
		n.log.Infof("devCharLinks: removed the %d /dev/char links nri-gpu made", len(removed))
	}
	if err != nil {
		n.log.WithError(err).Warn("devCharLinks: removing nri-gpu's /dev/char links")
	}
}
