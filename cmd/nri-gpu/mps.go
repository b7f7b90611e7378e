package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/kubelet/dra"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/mps"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
)

// mpsCmd runs the MPS control daemons that devicePlugin.sharing.mps asks
// for (one per GPU, from the node's driver) and keeps them running until
// SIGTERM or SIGINT, which leave them running: a later nri-gpu mps adopts
// them. It reads the node and the configuration at start.
func mpsCmd(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("mps", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration file (YAML), the one nri-gpu run reads")
	lf := addLogFlags(fs, "info")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(*cfgPath)
	if err != nil {
		return err
	}
	if cfg.DevicePlugin.Sharing.MPS == nil && !cfg.DRA.Enabled {
		return errors.New("the configuration has neither devicePlugin.sharing.mps nor dra.enabled: no GPU is shared with MPS")
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	sup, daemons, closeNVML, err := mpsSupervisor(cfg, log)
	if err != nil {
		return err
	}
	defer closeNVML()
	if cfg.DRA.Enabled {
		if sup == nil {
			return errors.New("dra.enabled: discovery found no driver to run the MPS control daemons of DRA claims from")
		}
		followClaims(ctx, cfg, sup, daemons, log)
		log.Info("stopped; the MPS control daemons keep running")
		return nil
	}
	if len(daemons) == 0 {
		log.Warn("no GPU of this node is shared with MPS (devicePlugin.sharing.mps names none of its devices); waiting for a signal")
		if sup != nil {
			sup.Retire(ctx, cfg.DevicePlugin.MPSRoot, nil)
		}
		<-ctx.Done()
		return nil
	}
	log.Infof("nri-gpu %s: supervising %d MPS control daemons under %s", Version, len(daemons), cfg.DevicePlugin.MPSRoot)
	sup.Retire(ctx, cfg.DevicePlugin.MPSRoot, daemons)
	sup.Run(ctx, daemons)
	log.Info("stopped; the MPS control daemons keep running")
	return nil
}

// mpsSupervisor discovers the node and returns the supervisor of its MPS
// daemons (nil without a driver to run them from, when none is planned),
// the daemons, and a function that closes NVML.
func mpsSupervisor(cfg config.Config, log *logrus.Logger) (*mps.Supervisor, map[string]*sharing.MPSDaemon, func(), error) {
	snap, err := node.Discover(cfg)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("inventory: %w", err)
	}
	for _, w := range snap.Warnings {
		log.Warnf("inventory: %s", w)
	}
	plan := sharing.NewPlan(cfg.DevicePlugin.SharingSpec(), adjust.Prepare(snap, adjust.Layout{}).Devices())
	for _, w := range plan.Warnings {
		log.Warn(w)
	}
	daemons := plan.MPSDaemons()
	drv, err := mps.PrepareDriver(cfg, snap)
	switch {
	case err != nil && len(daemons) == 0:
		return nil, nil, func() {}, nil
	case err != nil:
		return nil, nil, nil, err
	}
	o := mps.Options{Binary: drv.Binary, LibraryDirs: []string{drv.LibraryDir}, MIGNodes: migNodes(cfg, snap)}
	closeNVML := func() {}
	if path := node.NVMLPath(cfg, snap); path == "" {
		log.Warn("NVML: discovery found no libnvidia-ml.so.1: the GPUs' compute mode cannot be set, and no MPS daemon starts")
	} else if lib, err := nvml.Open(path); err != nil {
		log.WithError(err).Warn("NVML: the GPUs' compute mode cannot be set, and no MPS daemon starts")
	} else {
		closeNVML = func() { _ = lib.Close() }
		if cm, ok := lib.(nvml.ComputeModes); ok {
			o.ComputeModes = cm
		}
	}
	return mps.NewSupervisor(o, log), daemons, closeNVML, nil
}

// migNodes is nri-gpu mps's mps.Options.MIGNodes: the nvidia-caps nodes
// of a MIG device as discovery found them, discovered again when the
// device is not in the last discovery (a MIG device made for a DRA claim
// after nri-gpu mps started): at most one discovery per call, and calls
// come at a daemon's start only.
func migNodes(cfg config.Config, snap *inventory.Snapshot) func(string) ([]inventory.DeviceNode, error) {
	var mu sync.Mutex
	find := func(uuid string) ([]inventory.DeviceNode, bool) {
		for _, m := range snap.MIG {
			if strings.EqualFold(m.UUID, uuid) {
				return []inventory.DeviceNode{m.GINode, m.CINode}, true
			}
		}
		return nil, false
	}
	return func(uuid string) ([]inventory.DeviceNode, error) {
		mu.Lock()
		defer mu.Unlock()
		if n, ok := find(uuid); ok {
			return n, nil
		}
		s, err := node.Discover(cfg)
		if err != nil {
			return nil, fmt.Errorf("inventory: %w", err)
		}
		snap = s
		if n, ok := find(uuid); ok {
			return n, nil
		}
		return nil, fmt.Errorf("discovery finds no MIG device %s on this node", uuid)
	}
}

// followClaims supervises the device plugin's daemons and those that the
// DRA driver's prepared claims with sharing strategy MPS need, until ctx
// ends (dra.SuperviseClaims).
func followClaims(ctx context.Context, cfg config.Config, sup *mps.Supervisor, static map[string]*sharing.MPSDaemon, log *logrus.Logger) {
	log.Infof("nri-gpu %s: following the DRA driver's prepared claims in %s", Version, cfg.DRA.PluginDir)
	wake := dra.WatchCheckpoint(ctx, cfg.DRA.PluginDir)
	dra.SuperviseClaims(ctx, cfg.DRA.PluginDir, cfg.DevicePlugin.MPSRoot, wake, sup, static, log)
}
