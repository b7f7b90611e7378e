// Command nri-gpu is an NRI plugin that injects NVIDIA GPUs into containers.
//
//	nri-gpu run [--config FILE] [--socket PATH] [--name NAME] [--idx NN] [--log-level LEVEL] [--status-socket PATH] [--metrics-addr [HOST]:PORT] [--watch-interval D]
//	nri-gpu inventory [--config FILE] [-o table|json]
//	nri-gpu cdi generate [--config FILE] [-o FILE|-] [--capabilities CAPS]
//	nri-gpu status [--status-socket PATH] [--ready] [-o table|json]
//	nri-gpu doctor [--config FILE] [--containerd-config FILE] [--crio-config FILE] [--socket PATH] [--health-url URL]
//	nri-gpu mps [--config FILE] [--log-level LEVEL]
//	nri-gpu cleanup [--config FILE] [--dry-run]
//	nri-gpu version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/deviceplugin"
	"github.com/nri-gpu/nri-gpu/internal/kubelet/dra"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/plugin"
)

// Version is set at build time (-ldflags "-X main.Version=...").
var Version = "dev"

const usage = `nri-gpu: inject NVIDIA GPUs into containers through NRI.

Usage:
  nri-gpu run [--config FILE] [--socket PATH] [--name NAME] [--idx NN] [--log-level LEVEL] [--status-socket PATH] [--metrics-addr [HOST]:PORT] [--watch-interval D]
  nri-gpu inventory [--config FILE] [-o table|json]
  nri-gpu cdi generate [--config FILE] [-o FILE|-] [--capabilities CAPS]
  nri-gpu status [--status-socket PATH] [--ready] [-o table|json]
  nri-gpu doctor [--config FILE] [--containerd-config FILE] [--crio-config FILE] [--socket PATH] [--health-url URL]
  nri-gpu mps [--config FILE] [--log-level LEVEL]
  nri-gpu cleanup [--config FILE] [--dry-run]
  nri-gpu version

Run "nri-gpu <command> -h" for a command's flags.
`

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs the command line args and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	// A pre-registered plugin is started by the runtime with no arguments
	// and its connection on a file descriptor.
	if len(args) == 0 && os.Getenv(api.PluginSocketEnvVar) != "" {
		args = []string{"run"}
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = runCmd(args[1:], stderr)
	case "inventory":
		err = inventoryCmd(args[1:], stdout, stderr)
	case "cdi":
		err = cdiCmd(args[1:], stdout, stderr)
	case "status":
		err = statusCmd(args[1:], stdout, stderr)
		if errors.Is(err, errNotReady) {
			return 1
		}
	case "doctor":
		err = doctorCmd(args[1:], stdout, stderr)
	case "mps":
		err = mpsCmd(args[1:], stderr)
	case "cleanup":
		err = cleanupCmd(args[1:], stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "nri-gpu %s\n", Version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "nri-gpu: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		if errors.As(err, new(usageError)) {
			fmt.Fprintf(stderr, "nri-gpu %s: %v\n", args[0], err)
			return 2
		}
		fmt.Fprintf(stderr, "nri-gpu %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// usageError is a bad command line.
type usageError struct{ error }

// parseFlags parses a command's flags. A flag error is a usage error (the
// flag package has already printed it with the usage), and so is a
// positional argument.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// checkFormat checks the -o flag of the commands that print a table or
// JSON.
func checkFormat(format string) error {
	if format != "table" && format != "json" {
		return usageError{fmt.Errorf("-o: unknown format %q (valid: table, json)", format)}
	}
	return nil
}

func loadConfig(path string) (config.Config, error) {
	if path == "" {
		return config.Default(), nil
	}
	return config.Load(path)
}

// runCmd is nri-gpu run: its flags, the configuration, the node's state
// and the plugin, then the device plugin and the NRI connection until a
// signal. It is one piece on purpose: the flags read as the command's
// reference at its top, and each step below uses what the one before
// made, once.
func runCmd(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration file (YAML); default: built-in defaults")
	socket := fs.String("socket", api.DefaultSocketPath, "the runtime's NRI socket")
	name := fs.String("name", "nri-gpu", "plugin name to register with")
	idx := fs.String("idx", "10", "plugin index (two digits) to register with")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	statusSocket := fs.String("status-socket", status.DefaultSocket, "unix socket serving nri-gpu status and readiness (empty: none)")
	metricsAddr := fs.String("metrics-addr", "", "serve /metrics, /healthz and /readyz on [HOST]:PORT (HOST defaults to 127.0.0.1); off when empty")
	watchInterval := fs.Duration("watch-interval", node.DefaultWatchInterval, "rediscover the node this often besides on file events; 0: only on file events")
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
	// The /dev/char links nri-gpu makes (devCharLinks) stay when it
	// stops: running containers need them (nri-gpu cleanup removes them).
	p, err := plugin.New(cfg, log, node.KeepDevCharLinks())
	if err != nil {
		return err
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	if err := startMetrics(ctx, *metricsAddr, p, log); err != nil {
		return err
	}
	w, err := startWatcher(ctx, p, *cfgPath, *watchInterval)
	if err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				w.Kick("SIGHUP")
			}
		}
	}()

	// Without its status socket the plugin still serves the runtime: GPUs
	// matter more than their report (a readiness probe then fails).
	if *statusSocket != "" {
		if err := status.Serve(ctx, *statusSocket, p, log); err != nil {
			log.WithError(err).Error("not serving status")
		}
	}

	if err := cfg.OverlapOn(p.Node().Snapshot().GPUs); err != nil {
		return err
	}
	dpDone := startDevicePlugin(ctx, cfg.DevicePlugin, p.Node(), log)
	draDone := startDRA(ctx, cfg.DRA.Enabled, p, log)

	log.Infof("nri-gpu %s starting", Version)
	err = p.Run(ctx, plugin.RunOptions{
		SocketPath:    *socket,
		Name:          *name,
		Index:         *idx,
		PreRegistered: os.Getenv(api.PluginSocketEnvVar) != "",
	})
	cancel()
	<-dpDone
	<-draDone
	if err == nil {
		log.Info("stopped")
	}
	return err
}

// startDevicePlugin runs the kubelet device plugin until ctx ends when the
// configuration's devicePlugin.enabled says so; the channel is closed when
// it has stopped (at once when it is off). A device plugin that cannot run
// is logged, and NRI injection goes on without it. Its keys are read at
// start: changing them takes a restart; the resources of MIG profiles
// (migStrategy mixed) follow the node's layout.
func startDevicePlugin(ctx context.Context, c config.DevicePlugin, n *node.Node, log *logrus.Logger) <-chan struct{} {
	done := make(chan struct{})
	if !c.Enabled {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		deviceplugin.Supervise(ctx, n, c, log)
	}()
	return done
}

// startDRA runs the DRA kubelet plugin until ctx ends when dra.enabled
// says so; the channel is closed when it has stopped. A DRA plugin that
// cannot start is logged, and NRI injection goes on without it (pods with
// claims then wait for it in ContainerCreating). Its keys are read at
// start: changing them takes a restart. The driver's prepared claims reach
// the NRI side through p.SetPrepared: the request path reads them, and
// the allocation table books their devices. The checkpoint's claims are
// booked first, before the runtime's Synchronize (a restart: their
// containers are then rebuilt as the claims'); a checkpoint that cannot
// be read fails closed: the GPUs DRA offers stay held and nri-gpu not
// ready (p.ClaimsUnknown), read again every checkpointRetry, and the
// plugin starts once it reads.
func startDRA(ctx context.Context, enabled bool, p *plugin.Plugin, log *logrus.Logger) <-chan struct{} {
	done := make(chan struct{})
	if !enabled {
		close(done)
		return done
	}
	dir := p.Node().State().Config.DRA.PluginDir
	read := bookCheckpoint(dir, p, log)
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if !read {
				t := time.NewTimer(checkpointRetry)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
				read = ctx.Err() == nil && bookCheckpoint(dir, p, log)
				continue
			}
			err := dra.Run(ctx, p.Node(), log, p.SetPrepared)
			if ce := (*dra.CheckpointError)(nil); errors.As(err, &ce) {
				// It became unreadable since it was booked.
				read = bookCheckpoint(dir, p, log)
				continue
			}
			if err != nil {
				log.WithError(err).Error("DRA kubelet plugin not running")
			}
			return
		}
	}()
	return done
}

// checkpointRetry is how often a DRA checkpoint that cannot be read is
// read again.
const checkpointRetry = 2 * time.Second

// bookCheckpoint books the prepared claims of the DRA checkpoint in dir
// (p.SetPrepared), or, when it cannot be read, holds the GPUs DRA offers
// (p.ClaimsUnknown); it reports whether it read.
func bookCheckpoint(dir string, p *plugin.Plugin, log *logrus.Logger) bool {
	prep, err := dra.ReadPrepared(dir)
	if err != nil {
		p.ClaimsUnknown(err, dra.Offered(p.Node().State()))
		return false
	}
	if err := p.SetPrepared(prep, ""); err != nil {
		log.WithError(err).Warn("DRA: booking the checkpoint's claims")
	}
	return true
}

func inventoryCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("inventory", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration file (YAML); default: built-in defaults")
	format := fs.String("o", "table", "output format: table or json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	cfg, err := loadConfig(*cfgPath)
	if err != nil {
		return err
	}
	snap, err := node.Discover(cfg)
	if err != nil {
		return err
	}
	if *format == "json" {
		return writeJSON(stdout, snap)
	}
	return writeTable(stdout, snap)
}
