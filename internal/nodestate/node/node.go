// Package node holds the node's current state for the request path: the
// configuration, the device source discovered with it (NVIDIA discovery
// prepared for requests, or another vendor's CDI devices), the CDI names
// of emit: cdi, and the sharing mode. A State is immutable; a reload or a
// rediscovery makes a new one and swaps it in whole, so that requests in
// flight finish with the state they started with.
//
// Preparing a state is where the node's I/O happens: discovery, the
// prepared library and binary directories (package libcache), the GSP
// firmware decision, and reading the runtime's CDI specs. A Watcher
// follows the driver's files and the configuration file and swaps in a
// new state when they change.
package node

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdisource"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdispec"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/libcache"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
)

// State is what the request path reads: a configuration and the device
// source discovered with it. It is replaced whole, never modified.
type State struct {
	Config config.Config
	// Source is the node's devices, prepared for requests.
	Source adjust.Source
	// CDINames maps GPU UUIDs to the CDI device names the runtime's specs
	// define for them (emit: cdi).
	CDINames map[string]string
	// Sharing is the configuration's sharing mode, parsed.
	Sharing sharing.Mode
	// Unhealthy are the GPUs and MIG devices NVML's XID events or
	// enumeration made unhealthy, by UUID, with why; count requests skip
	// them and the device plugin reports them Unhealthy.
	Unhealthy map[string]string
	// Shares is how the device plugin advertises the devices: which
	// resource, as how many replicas, and for MPS each GPU's daemon
	// (pipe directory, limits, ready or not, as nri-gpu mps reports).
	// nil in a state built in memory without one.
	Shares *sharing.Plan
}

// Snapshot returns the discovery the state serves.
func (s *State) Snapshot() *inventory.Snapshot { return s.Source.Snapshot() }

// Observer is told about the node's states, so that they can be counted
// (the metrics package implements it). Its methods must be cheap, must
// not block and must be safe for concurrent use.
type Observer interface {
	// Refresh is called once per rediscovery with its result
	// (RefreshChanged, ...).
	Refresh(result string)
	// Inventory is called each time a snapshot becomes current.
	Inventory(snap *inventory.Snapshot)
}

// Refresh results, as told to an Observer.
const (
	// RefreshChanged: the node changed and the new snapshot is current.
	RefreshChanged = "changed"
	// RefreshUnchanged: the node is as it was; nothing was swapped.
	RefreshUnchanged = "unchanged"
	// RefreshRejected: discovery found a broken driver; the last good
	// snapshot stays.
	RefreshRejected = "rejected"
	// RefreshError: discovery failed; the last good snapshot stays.
	RefreshError = "error"
)

// Node holds the current State and makes new ones.
type Node struct {
	log   *logrus.Logger
	state atomic.Pointer[State]
	// mu serializes discoveries.
	mu sync.Mutex
	// lastProblem is the last reason an Update was refused, logged once;
	// guarded by mu.
	lastProblem string
	// lastSetsNote is the last gpuSetsNote logged, logged once; guarded
	// by mu.
	lastSetsNote string
	// obs holds the Observer (an observerBox), read without mu by the
	// health goroutine.
	obs      atomic.Value
	onChange func(*State)
	// subs are the functions Subscribe registered, by id; guarded by
	// subMu (not mu, so that a subscriber may read the node).
	subMu  sync.Mutex
	subs   map[int]func(*State)
	nextID int
	// devChar is set by KeepDevCharLinks (devchar.go); devCharOff once
	// the log has said that the links are off (guarded by mu).
	devChar, devCharOff bool
	// nvml is NVML loaded from the driver root, for MIG devices.
	nvml *nvmlHandle
	// health follows the devices' health (XID events, lost GPUs).
	health *health
	// lastPlanWarnings are the sharing plan's last warnings, logged
	// once; guarded by mu.
	lastPlanWarnings string
	// xidLogInterval is how often ignored XIDs of a GPU are logged at
	// most (zero: DefaultXIDLogInterval).
	xidLogInterval time.Duration
}

// Option configures a Node.
type Option func(*Node)

// OnChange has f called with every state that becomes current, before
// any request reads it (the plugin sizes its allocation table there).
func OnChange(f func(*State)) Option { return func(n *Node) { n.onChange = f } }

// New discovers the node with cfg and returns it with that state current.
func New(cfg config.Config, log *logrus.Logger, opts ...Option) (*Node, error) {
	n := &Node{log: log, nvml: newNVMLHandle(), health: &health{}}
	// NVML waits at most DefaultNVMLBound; when it answers later, the
	// node is rediscovered with its answer.
	n.nvml.bound = DefaultNVMLBound
	n.nvml.late = func() { go n.refresh("NVML answered") }
	for _, o := range opts {
		o(n)
	}
	if err := n.Reload(cfg); err != nil {
		return nil, err
	}
	return n, nil
}

// SetObserver makes o the node's observer and tells it the current
// inventory.
func (n *Node) SetObserver(o Observer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.obs.Store(observerBox{o})
	if st := n.state.Load(); st != nil {
		o.Inventory(st.Snapshot())
	}
}

// observerBox holds an Observer in Node.obs (an atomic.Value holds one
// concrete type).
type observerBox struct{ Observer }

func (n *Node) observer() Observer {
	if b, ok := n.obs.Load().(observerBox); ok && b.Observer != nil {
		return b.Observer
	}
	return nopObserver{}
}

type nopObserver struct{}

func (nopObserver) Refresh(string)                {}
func (nopObserver) Inventory(*inventory.Snapshot) {}

// State returns the current state; nil before the first discovery.
func (n *Node) State() *State { return n.state.Load() }

// Config returns the current configuration.
func (n *Node) Config() config.Config { return n.state.Load().Config }

// Snapshot returns the current inventory snapshot.
func (n *Node) Snapshot() *inventory.Snapshot { return n.state.Load().Snapshot() }

// Discover runs discovery for cfg and returns what it found, unprepared:
// NVIDIA discovery, or the devices of another vendor's CDI specs with
// cdiImport. It is what `nri-gpu inventory` and `nri-gpu doctor` show.
func Discover(cfg config.Config) (*inventory.Snapshot, error) {
	d, err := discoverFor(cfg)
	if err != nil {
		return nil, err
	}
	h := newNVMLHandle()
	defer h.closeLocked()
	snap, _ := h.addMIG(cfg, d.snap, nil)
	return snap, nil
}

// discover is discoverFor with NVML's MIG devices added.
func (n *Node) discover(cfg config.Config) (discovered, error) {
	d, err := discoverFor(cfg)
	if err != nil || n.nvml == nil || d.imported != nil {
		return d, err
	}
	var pr probe
	d.snap, pr = n.nvml.addMIG(cfg, d.snap, n.log)
	if n.health != nil {
		n.health.probe(pr.usable, pr.errs)
	}
	return d, nil
}

// discovered is a discovery's result: a snapshot, and the source that
// serves it when it needs no preparation (CDI import).
type discovered struct {
	snap     *inventory.Snapshot
	imported *cdisource.Source
}

func discoverFor(cfg config.Config) (discovered, error) {
	if ci := cfg.CDIImport; ci != nil {
		src, err := cdisource.Discover(cdisource.Options{Kind: ci.Kind, SpecDirs: underRoot(cfg.HostRoot, ci.SpecDirs), HostRoot: cfg.HostRoot, AllowHooks: ci.AllowHooks, AllowWritableMounts: ci.AllowWritableMounts})
		if err != nil {
			return discovered{}, err
		}
		return discovered{snap: src.Snapshot(), imported: src}, nil
	}
	snap, err := discover.Discover(discover.Options{
		HostRoot:        cfg.HostRoot,
		DriverRoot:      cfg.DriverRoot,
		DriverRootMount: cfg.DriverRootMount,
		// As libnvidia-container: the host's setting, in nri-gpu's own
		// environment, never a container's.
		MPSPipeDir: os.Getenv(inventory.EnvMPSPipeDir),
	})
	return discovered{snap: snap}, err
}

// Reload discovers the node with cfg and, when that succeeds, makes cfg
// and the new state current. Requests in flight finish with the old one.
func (n *Node) Reload(cfg config.Config) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	d, err := n.discover(cfg)
	if err != nil {
		return fmt.Errorf("inventory: %w", err)
	}
	return n.install(cfg, d)
}

// install logs the discovery, prepares it for requests (library
// directories, firmware, CDI names) and makes it current with cfg. The
// caller holds mu. On error nothing changes.
func (n *Node) install(cfg config.Config, d discovered) error {
	snap := d.snap
	if cur := n.state.Load(); cur != nil && !reflect.DeepEqual(cur.Config.DevicePlugin, cfg.DevicePlugin) {
		// The device plugin reads its keys at start; the node's sharing
		// plan must be the one it advertises.
		n.log.Warn("config: the devicePlugin keys changed; they take effect when nri-gpu restarts (the device plugin and its sharing keep the running ones)")
		cfg.DevicePlugin = cur.Config.DevicePlugin
	}
	for _, w := range snap.Warnings {
		n.log.Warnf("inventory: %s", w)
	}
	var src adjust.Source = d.imported
	if d.imported == nil {
		prep, err := n.prepare(cfg, snap)
		if err != nil {
			return err
		}
		src = prep
	}
	mode, err := sharing.ParseMode(string(cfg.Sharing))
	if err != nil {
		return fmt.Errorf("config: key sharing: %w", err)
	}
	st := &State{Config: cfg, Source: src, Sharing: mode, Shares: n.plan(cfg, src)}
	if n.health != nil {
		st.Unhealthy = n.health.unhealthy(snap)
		var old map[string]string
		if cur := n.state.Load(); cur != nil {
			old = cur.Unhealthy
		}
		if !maps.Equal(old, st.Unhealthy) {
			n.logHealth(old, st.Unhealthy)
		}
	}
	if cfg.Emit == config.EmitCDI {
		names, warnings := cdispec.Resolvable(snap, underRoot(cfg.HostRoot, cfg.CDISpecDirs))
		for _, w := range warnings {
			n.log.Warn(w)
		}
		st.CDINames = names
		n.log.Infof("emit cdi: %d of %d GPUs defined as %s devices in %v", len(names), len(snap.GPUs), cdispec.Kind, cfg.CDISpecDirs)
	}
	if n.onChange != nil {
		n.onChange(st)
	}
	n.state.Store(st)
	// Logged once the state is current: whoever reads this line may
	// start a container that must get it.
	n.log.WithFields(logrus.Fields{
		"kind":   src.Kind(),
		"driver": snap.DriverVersion,
		"gpus":   len(snap.GPUs),
		"mig":    len(snap.MIG),
		"files":  len(snap.Files),
	}).Info("inventory discovered")
	n.syncDevCharLinks(cfg, snap, d.imported != nil)
	n.observer().Inventory(snap)
	n.notify(st)
	return nil
}

// Subscribe has f called with every state that becomes current after it
// returns (a reload, a rediscovery that changed something, Swap), after
// requests can read it; cancel stops the calls. Unlike OnChange, any
// number of subscribers may come and go while the node runs (the kubelet
// device plugin follows the node's GPUs this way). f must be cheap and
// must not block: it runs in the goroutine that installed the state.
func (n *Node) Subscribe(f func(*State)) (cancel func()) {
	n.subMu.Lock()
	defer n.subMu.Unlock()
	if n.subs == nil {
		n.subs = map[int]func(*State){}
	}
	id := n.nextID
	n.nextID++
	n.subs[id] = f
	return func() {
		n.subMu.Lock()
		defer n.subMu.Unlock()
		delete(n.subs, id)
	}
}

// notify calls the subscribers with st.
func (n *Node) notify(st *State) {
	n.subMu.Lock()
	fs := make([]func(*State), 0, len(n.subs))
	for _, f := range n.subs {
		fs = append(fs, f)
	}
	n.subMu.Unlock()
	for _, f := range fs {
		f(st)
	}
}

// prepare makes an NVIDIA snapshot ready for requests: where each driver
// file goes in a container, with the library (and binary) directories
// prepared in the library cache, and the firmware decision.
func (n *Node) prepare(cfg config.Config, snap *inventory.Snapshot) (*adjust.Prepared, error) {
	layout := adjust.Layout{LibraryDir: cfg.LibraryDir, Library32Dir: cfg.Library32Dir, BinaryDir: cfg.BinaryDir}
	if snap.HasFirmware() {
		var why string
		layout.SkipFirmware, why = skipFirmware(cfg.Firmware, snap.KernelRelease)
		if layout.SkipFirmware {
			n.log.Infof("GSP firmware: not mounted into containers: %s", why)
		} else {
			n.log.Infof("GSP firmware: mounted into containers: %s", why)
		}
	}
	built := false
	defer func() {
		if note := gpuSetsNote(cfg, snap, built); note != n.lastSetsNote {
			n.lastSetsNote = note
			if note != "" {
				n.log.Info(note)
			}
		}
	}()
	if cfg.LibraryMode != config.LibraryFiles && snap.DriverVersion != "" && len(snap.Files) > 0 {
		cache, err := libcache.Build(snap, cacheOptions(cfg))
		switch {
		case err == nil:
			built = true
			layout.HostLibraryDirs, layout.HostLibrary32Dirs, layout.HostBinaryDirs = cache.Dirs, cache.Dirs32, cache.DirsBin
			layout.HostGPUSets = gpuSetFiles(cache.GPUSets)
			n.log.WithFields(logrus.Fields{"dirs": len(cache.Dirs) + len(cache.Dirs32), "links": cache.Links}).
				Infof("library directories ready in %s", filepath.Join(cfg.DriverRoot, cfg.LibraryCache))
			if cache.Stored > 0 {
				n.log.WithFields(logrus.Fields{"files": cache.Stored, "reflinks": cache.Cloned, "bytes": cache.StoredBytes}).
					Infof("library cache: the driver's files cannot be hard-linked from the cache (%v); the cache holds its own copy of each, once per driver version (reflinks where the file system can, else copies)", cache.LinkError)
			}
			if cfg.BinaryDir != "" {
				n.log.Infof("binaries: one directory mount at %s, appended to PATH (binaryDir)", cfg.BinaryDir)
			}
		case cfg.LibraryMode == config.LibraryDirectory:
			return nil, fmt.Errorf("libraryMode directory: preparing library directories in %s (key libraryCache): %w", cfg.LibraryCache, err)
		default:
			n.log.WithError(err).Warnf("libraryMode auto: cannot prepare library directories in %s (key libraryCache); mounting libraries one by one (slower container starts)", cfg.LibraryCache)
		}
	}
	return adjust.Prepare(snap, layout), nil
}

// gpuSetsNote says which graphics and display containers go without the
// application profile and /dev/dri/by-path links, prepared per set of
// GPUs in the library cache (built: whether it was): empty when every set
// has them, or the node has nothing that needs them.
func gpuSetsNote(cfg config.Config, snap *inventory.Snapshot, built bool) string {
	drm, graphics := false, false
	gpus := 0
	for _, g := range snap.GPUs {
		drm = drm || g.DRM != nil
		if g.Minor >= 0 && g.Minor <= 63 {
			gpus++
		}
	}
	for _, f := range snap.Files {
		graphics = graphics || f.Kind == inventory.Library && f.Capability == inventory.Graphics
	}
	const without = "graphics and display containers go without the EGL application profile (EGL lists every GPU of the node, of which they open only their own) and /dev/dri/by-path"
	switch {
	case gpus == 0 || !drm && !graphics:
		return ""
	case !built:
		return "GPU sets: no library cache (libraryMode " + string(cfg.LibraryMode) + ", key libraryMode): " + without + "; use libraryMode: auto or directory to have them"
	case gpus > libcache.MaxAllSetsGPUs:
		return fmt.Sprintf("GPU sets: the node has %d GPUs, more than %d: the application profile and /dev/dri/by-path links are prepared for each GPU alone and for all %d together; with another set of GPUs, %s", gpus, libcache.MaxAllSetsGPUs, gpus, without)
	}
	return ""
}

// gpuSetFiles converts the library cache's GPU-set files for adjust.
func gpuSetFiles(sets map[uint64]libcache.GPUSet) map[uint64]adjust.GPUSetFiles {
	if len(sets) == 0 {
		return nil
	}
	out := make(map[uint64]adjust.GPUSetFiles, len(sets))
	for m, s := range sets {
		out[m] = adjust.GPUSetFiles{Profile: s.Profile, ByPath: s.ByPath}
	}
	return out
}

// skipFirmware decides, for the firmware key's mode and the kernel
// release, whether containers go without the GSP firmware directory, and
// says why. Under "auto" only a kernel known to read firmware from the
// mount namespace of init (Linux 5.7 and later) goes without: an older or
// unreadable release keeps the mount, since there the driver may read
// the firmware through a container's root when a container is the first
// to open a GPU.
func skipFirmware(mode config.Firmware, kernel string) (bool, string) {
	switch mode {
	case config.FirmwareMount:
		return false, "firmware: mount"
	case config.FirmwareSkip:
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
		DirMount:        cfg.LibraryCacheMount,
		Binaries:        cfg.BinaryDir != "",
	}
}

// CleanLibraryCache removes the library directories of replaced driver
// versions that no container mounts (inUse says which are mounted).
func (n *Node) CleanLibraryCache(inUse func(dir string) bool) {
	st := n.state.Load()
	if st == nil || st.Config.LibraryMode == config.LibraryFiles {
		return
	}
	removed, err := libcache.Clean(cacheOptions(st.Config), st.Snapshot().DriverVersion, inUse)
	if err != nil {
		n.log.WithError(err).Warn("cleaning the library cache")
	}
	for _, r := range removed {
		n.log.Infof("removed unused library directories %s", r)
	}
}

// underRoot returns dirs as read under root.
func underRoot(root string, dirs []string) []string {
	out := make([]string, 0, len(dirs))
	for _, d := range dirs {
		out = append(out, filepath.Join(root, d))
	}
	return out
}

// Fixed returns a node that serves st as it is, without discovery: a
// state built in memory, for tests and benchmarks. Reload and Update
// discover as usual.
func Fixed(st *State, log *logrus.Logger, opts ...Option) *Node {
	n := &Node{log: log}
	for _, o := range opts {
		o(n)
	}
	if n.onChange != nil {
		n.onChange(st)
	}
	n.state.Store(st)
	return n
}

// Swap makes st current as Fixed does, without discovery: a state built
// in memory replacing the current one, for tests of what follows the
// node (OnChange, then the subscribers, are told as after a rediscovery).
func (n *Node) Swap(st *State) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.onChange != nil {
		n.onChange(st)
	}
	n.state.Store(st)
	n.observer().Inventory(st.Snapshot())
	n.notify(st)
}
