// Package plugin is nri-gpu's NRI plugin: it wires the request, inventory
// and adjust packages to the NRI stub, holds the current inventory snapshot
// and keeps the plugin connected to the runtime.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"
	"golang.org/x/mod/semver"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/alloc"
	"github.com/nri-gpu/nri-gpu/cdisource"
	"github.com/nri-gpu/nri-gpu/cdispec"
	"github.com/nri-gpu/nri-gpu/config"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/libcache"
	"github.com/nri-gpu/nri-gpu/policy"
	"github.com/nri-gpu/nri-gpu/request"
)

// state is what the request path reads: a configuration and the snapshot
// discovered with it. It is replaced whole, never modified.
type state struct {
	cfg  config.Config
	snap *inventory.Snapshot
	prep *adjust.Prepared
	// cdiNames maps GPU UUIDs to the CDI device names the runtime's
	// specs define for them (emit: cdi).
	cdiNames map[string]string
	// sharing is cfg.Sharing parsed.
	sharing alloc.Mode
}

// Plugin answers the runtime's CreateContainer requests with GPU
// adjustments.
type Plugin struct {
	log   *logrus.Logger
	state atomic.Pointer[state]
	// refreshMu serializes discoveries.
	refreshMu sync.Mutex
	// synced is set once the runtime has synchronized the plugin on the
	// current connection, and cleared when the connection is lost.
	synced atomic.Bool
	// stub is the NRI stub of the current connection.
	stub atomic.Pointer[stub.Stub]
	// runtimeCDI is set when the connected runtime's NRI resolves CDI
	// device references in adjustments.
	runtimeCDI atomic.Bool
	// table is who holds which GPUs; rebuilt on every Synchronize.
	table *alloc.Table
	// obs is told what the plugin does (metrics); set before Run.
	obs Observer
	// lastProblem is the last reason an Update was refused, logged once;
	// guarded by refreshMu.
	lastProblem string
}

// minCDINRIVersion is the first NRI version whose runtimes inject CDI
// devices named in an adjustment.
const minCDINRIVersion = "v0.10.0"

// Ready reports whether the plugin is connected to the runtime and
// synchronized with it, with an inventory loaded: whether containers
// created now get their GPUs.
func (p *Plugin) Ready() bool { return p.synced.Load() && p.state.Load() != nil }

// cleanLibraryCache removes the library directories of replaced driver
// versions that none of the runtime's containers mounts.
func (p *Plugin) cleanLibraryCache(ctrs []*api.Container) {
	st := p.state.Load()
	if st.cfg.LibraryMode == "files" {
		return
	}
	sources := map[string]bool{}
	for _, c := range ctrs {
		for _, m := range c.GetMounts() {
			sources[m.GetSource()] = true
		}
	}
	removed, err := libcache.Clean(cacheOptions(st.cfg), st.snap.DriverVersion, func(dir string) bool { return sources[dir] })
	if err != nil {
		p.log.WithError(err).Warn("cleaning the library cache")
	}
	for _, r := range removed {
		p.log.Infof("removed unused library directories %s", r)
	}
}

// New discovers the node with cfg and returns a plugin serving it.
func New(cfg config.Config, log *logrus.Logger) (*Plugin, error) {
	p := &Plugin{log: log, table: alloc.New(nil)}
	if err := p.Reload(cfg); err != nil {
		return nil, err
	}
	return p, nil
}

// Discover runs inventory discovery for cfg: NVIDIA discovery, or the
// devices of another vendor's CDI specs with cdiImport.
func Discover(cfg config.Config) (*inventory.Snapshot, error) {
	if ci := cfg.CDIImport; ci != nil {
		dirs := make([]string, 0, len(ci.SpecDirs))
		for _, d := range ci.SpecDirs {
			dirs = append(dirs, filepath.Join(cfg.HostRoot, d))
		}
		return cdisource.Discover(cdisource.Options{Kind: ci.Kind, SpecDirs: dirs, HostRoot: cfg.HostRoot, AllowHooks: ci.AllowHooks})
	}
	return discover.Discover(discover.Options{
		HostRoot:        cfg.HostRoot,
		DriverRoot:      cfg.DriverRoot,
		DriverRootMount: cfg.DriverRootMount,
	})
}

// Reload discovers the node with cfg and, when that succeeds, makes cfg
// and the new snapshot current. Requests in flight finish with the old
// ones.
func (p *Plugin) Reload(cfg config.Config) error {
	p.refreshMu.Lock()
	defer p.refreshMu.Unlock()
	snap, err := Discover(cfg)
	if err != nil {
		return fmt.Errorf("inventory: %w", err)
	}
	return p.install(cfg, snap)
}

// install logs snap, prepares it for requests (library directories, CDI
// names) and makes it current with cfg. The caller holds refreshMu. On
// error nothing changes.
func (p *Plugin) install(cfg config.Config, snap *inventory.Snapshot) error {
	for _, w := range snap.Warnings {
		p.log.Warnf("inventory: %s", w)
	}
	p.log.WithFields(logrus.Fields{
		"vendor": snap.Vendor,
		"driver": snap.DriverVersion,
		"gpus":   len(snap.GPUs),
		"files":  len(snap.Files),
	}).Info("inventory discovered")
	layout := adjust.Layout{LibraryDir: cfg.LibraryDir, Library32Dir: cfg.Library32Dir, BinaryDir: cfg.BinaryDir}
	if snap.HasFirmware() {
		var why string
		layout.SkipFirmware, why = skipFirmware(string(cfg.Firmware), snap.KernelRelease)
		if layout.SkipFirmware {
			p.log.Infof("GSP firmware: not mounted into containers: %s", why)
		} else {
			p.log.Infof("GSP firmware: mounted into containers: %s", why)
		}
	}
	if cfg.LibraryMode != "files" && snap.DriverVersion != "" && len(snap.Files) > 0 {
		cache, err := libcache.Build(snap, cacheOptions(cfg))
		switch {
		case err == nil:
			layout.HostLibraryDirs, layout.HostLibrary32Dirs, layout.HostBinaryDirs = cache.Dirs, cache.Dirs32, cache.DirsBin
			p.log.WithFields(logrus.Fields{"dirs": len(cache.Dirs) + len(cache.Dirs32), "links": cache.Links}).
				Infof("library directories ready in %s", filepath.Join(cfg.DriverRoot, cfg.LibraryCache))
			if cfg.BinaryDir != "" {
				p.log.Infof("binaries: one directory mount at %s, appended to PATH (binaryDir)", cfg.BinaryDir)
			}
		case cfg.LibraryMode == "directory":
			return fmt.Errorf("libraryMode directory: preparing library directories in %s: %w", cfg.LibraryCache, err)
		default:
			p.log.WithError(err).Warnf("libraryMode auto: cannot prepare library directories in %s; mounting libraries one by one (slower container starts)", cfg.LibraryCache)
		}
	}
	sharing, err := alloc.ParseMode(string(cfg.Sharing))
	if err != nil {
		return fmt.Errorf("config: key sharing: %w", err)
	}
	st := &state{cfg: cfg, snap: snap, sharing: sharing, prep: adjust.Prepare(snap, layout)}
	if cfg.Emit == "cdi" {
		var dirs []string
		for _, d := range cfg.CDISpecDirs {
			dirs = append(dirs, filepath.Join(cfg.HostRoot, d))
		}
		names, warnings := cdispec.Resolvable(snap, dirs)
		for _, w := range warnings {
			p.log.Warn(w)
		}
		st.cdiNames = names
		p.log.Infof("emit cdi: %d of %d GPUs defined as %s devices in %v", len(names), len(snap.GPUs), cdispec.Kind, cfg.CDISpecDirs)
	}
	p.state.Store(st)
	idx := make([]int, len(snap.GPUs))
	for i, g := range snap.GPUs {
		idx[i] = g.Index
	}
	p.table.SetGPUs(idx)
	p.observer().Inventory(snap)
	return nil
}

// skipFirmware decides, for the firmware key's mode and the kernel
// release, whether containers go without the GSP firmware directory, and
// says why. Under "auto" only a kernel known to read firmware from the
// mount namespace of init (Linux 5.7 and later) goes without: an older or
// unreadable release keeps the mount, since there the driver may read
// the firmware through a container's root when a container is the first
// to open a GPU.
func skipFirmware(mode, kernel string) (bool, string) {
	switch mode {
	case "mount":
		return false, "firmware: mount"
	case "skip":
		return true, "firmware: skip"
	}
	if kernel == "" {
		return false, "firmware: auto, and the kernel release could not be read"
	}
	fromInit, err := discover.FirmwareFromInitNamespace(kernel)
	switch {
	case err != nil:
		return false, fmt.Sprintf("firmware: auto, and %v", err)
	case fromInit:
		return true, fmt.Sprintf("kernel %s reads firmware from the host's mount namespace (Linux 5.7 and later; firmware: auto)", kernel)
	default:
		return false, fmt.Sprintf("kernel %s reads firmware from the mount namespace of the process that opens the GPU (before Linux 5.7; firmware: auto)", kernel)
	}
}

// cacheOptions locates the library cache of cfg.
func cacheOptions(cfg config.Config) libcache.Options {
	return libcache.Options{
		DriverRoot:      cfg.DriverRoot,
		DriverRootMount: cfg.DriverRootMount,
		Dir:             strings.TrimPrefix(cfg.LibraryCache, "/"),
		Binaries:        cfg.BinaryDir != "",
	}
}

// Refresh rediscovers the node with the current configuration.
func (p *Plugin) Refresh() error { return p.Reload(p.Config()) }

// Config returns the current configuration.
func (p *Plugin) Config() config.Config { return p.state.Load().cfg }

// Snapshot returns the current inventory snapshot.
func (p *Plugin) Snapshot() *inventory.Snapshot { return p.state.Load().snap }

// Prepared returns the current snapshot prepared for requests.
func (p *Plugin) Prepared() *adjust.Prepared { return p.state.Load().prep }

// Configure handles the runtime's Configure request. A pre-registered
// plugin gets its configuration file's contents here; an empty config keeps
// the current one.
func (p *Plugin) Configure(_ context.Context, cfg, runtime, version string) (api.EventMask, error) {
	nriVersion := "unknown"
	if s := p.stub.Load(); s != nil {
		nriVersion = (*s).RuntimeNRIVersion()
	}
	p.runtimeCDI.Store(semver.IsValid(nriVersion) && semver.Compare(nriVersion, minCDINRIVersion) >= 0)
	p.log.Infof("connected to %s %s (NRI %s)", runtime, version, nriVersion)
	if cfg != "" {
		c, err := config.Parse([]byte(cfg))
		if err != nil {
			return 0, fmt.Errorf("nri-gpu: configuration from the runtime: %w", err)
		}
		if err := p.Reload(c); err != nil {
			return 0, err
		}
	}
	return api.MustParseEventMask(events...), nil
}

// CreateContainer handles the runtime's CreateContainer request.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	st := p.state.Load()
	adj, res, err := HandleWithPolicy(st.prep, p.table, st.sharing, st.cfg.Policy, pod, ctr)
	// An ignored NVIDIA_VISIBLE_DEVICES answers with an adjustment (the
	// variable set to void) but injects nothing.
	p.observeRequest(res, adj != nil && (len(res.Edits.Devices) > 0 || len(res.Edits.Mounts) > 0), err, time.Since(start))
	fields := logrus.Fields{
		"namespace": pod.GetNamespace(),
		"pod":       pod.GetName(),
		"container": ctr.GetName(),
	}
	switch {
	case err != nil:
		p.log.WithFields(fields).WithError(err).Warn("request refused")
		return nil, nil, err
	case res.Selection.Note != "":
		p.log.WithFields(fields).Info(res.Selection.Note)
	case adj != nil:
		// Management containers get control nodes that no GPU's CDI
		// device carries: always edits.
		if st.cfg.Emit == "cdi" && !res.Request.Management {
			var how string
			adj, how = p.emitCDI(st, res, adj)
			fields["emit"] = how
		}
		fields["source"] = res.Request.Source
		fields["gpus"] = res.Edits.VisibleDevices
		fields["capabilities"] = res.Selection.Caps.String()
		fields["files"] = res.Edits.Files
		fields["mounts"] = len(res.Edits.Mounts)
		if res.Holding != nil {
			fields["mode"] = res.Holding.Mode.String()
		}
		p.log.WithFields(fields).Info("injected")
		if res.Holding != nil {
			p.logTable("allocated to " + res.Holding.Holder.String())
		}
	}
	return adj, nil, nil
}

// emitCDI returns the CDI form of an answer when the runtime can resolve
// it and its specs define every GPU of the selection; otherwise the edits,
// with the reason.
func (p *Plugin) emitCDI(st *state, res Result, edits *api.ContainerAdjustment) (*api.ContainerAdjustment, string) {
	if !p.runtimeCDI.Load() {
		return edits, "edits (the runtime's NRI does not inject CDI devices)"
	}
	if len(res.GPUs) == 0 {
		return edits, "edits (no GPU to name)"
	}
	names := make([]string, 0, len(res.GPUs))
	for _, g := range res.GPUs {
		n, ok := st.cdiNames[g.UUID]
		if !ok {
			return edits, "edits (no CDI spec defines " + cdispec.Kind + "=" + g.UUID + ")"
		}
		names = append(names, n)
	}
	cdi := adjust.CDIAdjustment(names, res.Edits.VisibleDevices)
	// The booking's record goes with either form.
	if v, ok := edits.GetAnnotations()[alloc.Annotation]; ok {
		cdi.AddAnnotation(alloc.Annotation, v)
	}
	return cdi, "cdi"
}

// Result tells what Handle decided, for logging.
type Result struct {
	Request   request.Request
	Selection request.Selection
	// GPUs are the GPUs the container gets: those named, or those the
	// allocator picked for a count.
	GPUs []inventory.GPU
	// Holding is what the container now holds in the allocation table;
	// nil when it holds no GPU.
	Holding *alloc.Holding
	Edits   adjust.Edits
}

// Handle is the request path with the default policy (every source
// allowed everywhere); see HandleWithPolicy. It touches no file. A nil
// adjustment with a nil error leaves the container untouched.
func Handle(prep *adjust.Prepared, table *alloc.Table, sharing alloc.Mode, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, Result, error) {
	return HandleWithPolicy(prep, table, sharing, policy.Policy{}, pod, ctr)
}

// byIndex returns the snapshot's GPUs of the given indices, in that order.
func byIndex(snap *inventory.Snapshot, idx []int) []inventory.GPU {
	out := make([]inventory.GPU, 0, len(idx))
	for _, i := range idx {
		for _, g := range snap.GPUs {
			if g.Index == i {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// RunOptions say how to reach the runtime.
type RunOptions struct {
	// SocketPath is the runtime's NRI socket.
	SocketPath string
	Name       string
	Index      string
	// PreRegistered is set when the runtime started the plugin with a
	// connection on a file descriptor; such a plugin cannot reconnect.
	PreRegistered bool
	// MaxBackoff bounds the wait between reconnection attempts.
	MaxBackoff time.Duration
}

// Run serves the runtime until ctx is cancelled. When the runtime goes away
// (a restart), it reconnects with a backoff growing from 100ms to
// MaxBackoff, instead of exiting. A pre-registered plugin returns when its
// connection closes.
func (p *Plugin) Run(ctx context.Context, o RunOptions) error {
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 5 * time.Second
	}
	backoff := 100 * time.Millisecond
	for {
		// A pre-registered plugin takes its name, index and connection
		// from the environment the runtime gave it.
		var opts []stub.Option
		if !o.PreRegistered {
			opts = append(opts, stub.WithPluginName(o.Name), stub.WithPluginIdx(o.Index),
				stub.WithSocketPath(o.SocketPath))
		}
		s, err := stub.New(p, opts...)
		if err != nil {
			return fmt.Errorf("creating NRI stub: %w", err)
		}
		p.stub.Store(&s)
		start := time.Now()
		err = s.Run(ctx)
		p.synced.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if o.PreRegistered {
			return fmt.Errorf("connection to the runtime closed: %w", err)
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		if err == nil {
			err = errors.New("connection closed")
		}
		p.log.WithError(err).Warnf("NRI connection lost or refused; reconnecting in %s", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, o.MaxBackoff)
	}
}
