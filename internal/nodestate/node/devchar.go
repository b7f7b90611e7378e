package node

import (
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/devchar"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// KeepDevCharLinks has the node keep the host's /dev/char links of the
// device nodes it serves (package devchar), as devCharLinks configures:
// made at every discovery that becomes current, and removed only when
// their device node is gone from the host. Nothing removes them when
// nri-gpu stops, nor when a configuration switches them off: containers
// that were given the nodes keep running, and need the links at the next
// `systemctl daemon-reload` (`nri-gpu cleanup` removes them at an
// uninstall). Only `nri-gpu run` keeps them; other commands that discover
// the node touch nothing of the host.
func KeepDevCharLinks() Option { return func(n *Node) { n.devChar = true } }

// DevCharOptions says where cfg has the /dev/char links and their record.
func DevCharOptions(cfg config.Config) devchar.Options {
	return devchar.Options{HostRoot: cfg.HostRoot, StateDir: cfg.DevCharLinks.StateDirUnder(cfg.HostRoot)}
}

// syncDevCharLinks makes the missing links of snap's nodes, and removes
// those nri-gpu made whose node is gone from the host. With the links off
// (or another vendor's devices) it touches nothing: the links made before
// stay. A failure is a warning: containers are served either way. The
// caller holds mu.
func (n *Node) syncDevCharLinks(cfg config.Config, snap *inventory.Snapshot, vendor bool) {
	if !n.devChar {
		return
	}
	o := DevCharOptions(cfg)
	if !cfg.DevCharLinks.On() || vendor {
		if !n.devCharOff {
			n.devCharOff = true
			n.log.Infof("devCharLinks: off: nri-gpu makes no /dev/char link; those it made stay (recorded in %s; nri-gpu cleanup removes them)", o.StateDir)
		}
		return
	}
	n.devCharOff = false
	res, err := devchar.Ensure(o, devchar.Nodes(snap))
	for _, l := range res.Created {
		n.log.WithFields(logrus.Fields{"link": l.Path(), "target": l.Target}).Info("devCharLinks: created")
	}
	for _, l := range res.Removed {
		n.log.WithFields(logrus.Fields{"link": l.Path(), "target": l.Target}).Info("devCharLinks: removed (its device node is gone from the host)")
	}
	for _, f := range res.Foreign {
		n.log.Warnf("devCharLinks: %s: left alone (not nri-gpu's)", f)
	}
	if err != nil {
		n.log.WithError(err).Warnf("devCharLinks: cannot keep the /dev/char links under %s (with the systemd cgroup driver, containers may lose their GPUs at systemctl daemon-reload; see nri-gpu doctor)", cfg.HostRoot)
	}
}
