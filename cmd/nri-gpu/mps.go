package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/kubelet/dra"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/mps"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
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
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	lvl, err := logrus.ParseLevel(*level)
	if err != nil {
		return usageError{fmt.Errorf("--log-level: %v", err)}
	}
	log := logrus.New()
	log.SetOutput(stderr)
	log.SetLevel(lvl)
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
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
	o := mps.Options{Binary: drv.Binary, LibraryDirs: []string{drv.LibraryDir}}
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

// followClaims supervises the device plugin's daemons and those that the
// DRA driver's prepared claims with sharing strategy MPS need, until ctx
// ends (dra.SuperviseClaims).
func followClaims(ctx context.Context, cfg config.Config, sup *mps.Supervisor, static map[string]*sharing.MPSDaemon, log *logrus.Logger) {
	log.Infof("nri-gpu %s: following the DRA driver's prepared claims in %s", Version, cfg.DRA.PluginDir)
	wake := dra.WatchCheckpoint(ctx, cfg.DRA.PluginDir)
	dra.SuperviseClaims(ctx, cfg.DRA.PluginDir, cfg.DevicePlugin.MPSRoot, wake, sup, static, log)
}
