package node

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
)

// nvmlSONAME is the library NVML is loaded from, found among the driver
// files discovery listed.
const nvmlSONAME = "libnvidia-ml.so.1"

// DefaultNVMLBound is how long a discovery of `nri-gpu run` waits for
// NVML (loading it with nvmlInit_v2, then enumerating the GPUs). Past it
// the discovery goes on with NVML's last good answer (none at start: whole
// GPUs, as without NVML), and the node is rediscovered as soon as NVML
// answers. The runtime's deadlines include a discovery: a pre-registered
// plugin's registration (5 s) and its Configure (2 s), which carries the
// configuration.
const DefaultNVMLBound = time.Second

// nvmlHandle holds NVML loaded from the driver root, across
// rediscoveries: it is loaded once (again only when discovery finds the
// library at another path, as after a driver upgrade) and its status is
// logged when it changes, so that a node without NVML says so once.
//
// It keeps NVML's last good answer for each GPU: an answer worse than that
// one (an enumeration that fails, a GPU that NVML cannot query) never
// hands out more than before. The GPU keeps its last MIG layout (a GPU
// with MIG enabled stays not whole) until NVML answers for it again, and a
// GPU NVML cannot query is unhealthy.
type nvmlHandle struct {
	mu     sync.Mutex
	open   func(path string) (nvml.Lib, error)
	lib    nvml.Lib
	path   string
	status string
	// last is NVML's last good answer per GPU, by upper-case UUID.
	last map[string]discover.NVMLGPU
	// bound is how long a discovery waits for NVML; zero: as long as it
	// takes (nri-gpu inventory, doctor).
	bound time.Duration
	// slow is a call to NVML that ran past the bound and may still run:
	// no other is started until it returns.
	slow *nvmlCall
	// late, when set, is called when a call that ran past the bound
	// returns (the node rediscovers then).
	late func()
	// lateMu guards nvmlCall.late.
	lateMu sync.Mutex
}

// nvmlCall is one call to NVML, run in a goroutine of its own so that a
// discovery can stop waiting for it: the library loaded (when it is not
// yet), then the GPUs enumerated.
type nvmlCall struct {
	path string
	// done is closed when the fields below are set.
	done    chan struct{}
	opened  nvml.Lib
	openErr error
	gpus    []nvml.GPU
	err     error
	// late is set when the discovery stopped waiting (under lateMu).
	late bool
}

func newNVMLHandle() *nvmlHandle { return &nvmlHandle{open: nvml.Open} }

// libraryPath returns where this process reads snap's libnvidia-ml.so.1
// (under driverRootMount), or "" when discovery found none.
func libraryPath(cfg config.Config, snap *inventory.Snapshot) string {
	for _, f := range snap.Files {
		if f.Kind != inventory.Library || f.Name != nvmlSONAME {
			continue
		}
		rel, err := filepath.Rel(cfg.DriverRoot, f.HostPath)
		if err != nil || strings.HasPrefix(rel, "..") {
			return ""
		}
		mount := cfg.DriverRootMount
		if mount == "" {
			mount = cfg.DriverRoot
		}
		return filepath.Join(mount, rel)
	}
	return ""
}

// addMIG asks NVML about snap's GPUs and returns snap with its MIG
// devices (discover.AddMIG), and snap.NVML saying whether NVML answered.
// log, when not nil, is told when NVML's status changes.
func (h *nvmlHandle) addMIG(cfg config.Config, snap *inventory.Snapshot, log *logrus.Logger) (*inventory.Snapshot, probe) {
	if cfg.CDIImport != nil || snap.DriverVersion == "" {
		return snap, probe{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	gpus, warnings, pr, status := h.devices(cfg, snap)
	out := discover.AddMIG(discover.Options{HostRoot: cfg.HostRoot, DriverRoot: cfg.DriverRoot, DriverRootMount: cfg.DriverRootMount}, snap, gpus)
	if status != h.status && log != nil {
		logNVMLStatus(log, h, status, gpus, out)
	}
	h.status = status
	out.NVML = status
	out.Warnings = append(out.Warnings, warnings...)
	return out, pr
}

// logNVMLStatus says how NVML's status changed to status, and what the
// node goes by: NVML's answer, its last MIG layout (mig: the last answers
// with MIG enabled), or, where NVML never answered, what the driver shows
// (out's MIG-enabled GPUs: GPU instances under /proc/driver/nvidia).
func logNVMLStatus(log *logrus.Logger, h *nvmlHandle, status string, gpus []discover.NVMLGPU, out *inventory.Snapshot) {
	mig := migEnabled(gpus)
	kept := 0
	for _, g := range mig {
		kept += len(g.MIG)
	}
	var shown []string
	for _, g := range out.GPUs {
		if g.MIGEnabled && !slices.ContainsFunc(mig, func(n discover.NVMLGPU) bool { return strings.EqualFold(n.UUID, g.UUID) }) {
			shown = append(shown, fmt.Sprint(g.Index))
		}
	}
	switch {
	case status == "ok" && h.status == "":
		log.Infof("NVML: %s loaded: MIG devices and XID health are available", h.path)
	case status == "ok":
		log.Infof("NVML: %s answers again: MIG devices and XID health are available", h.path)
	case len(mig) > 0:
		log.Warnf("NVML %s: the last MIG layout NVML reported stays in force (%d GPUs with MIG enabled, %d MIG devices) until it answers again", status, len(mig), kept)
	case len(shown) > 0:
		log.Warnf("NVML %s: GPUs %s show GPU instances: not handed out whole, no MIG devices until NVML answers; the others served whole; no XID health", status, strings.Join(shown, ", "))
	default:
		log.Warnf("NVML %s: serving whole GPUs; no MIG devices, no XID health", status)
	}
}

// probe is what one enumeration said of the GPUs' health: by UUID, those
// NVML queried (usable) and those it failed to (errs, with its error).
type probe struct {
	usable map[string]bool
	errs   map[string]string
}

// devices asks NVML for the GPUs of snap, and returns what the node is to
// go by: NVML's answer, and for a GPU it cannot answer for (or none, when
// the enumeration fails) its last good answer, with a warning; the probe
// of the GPUs' health, and NVML's status ("ok", or why not). The caller
// holds mu.
func (h *nvmlHandle) devices(cfg config.Config, snap *inventory.Snapshot) (gpus []discover.NVMLGPU, warnings []string, pr probe, status string) {
	all, err := h.enumerate(libraryPath(cfg, snap), cfg.DriverRoot)
	if err != nil {
		status = "unavailable: " + err.Error()
		gpus = h.lastOf(snap)
		if mig := migEnabled(gpus); len(mig) > 0 {
			warnings = append(warnings, fmt.Sprintf("NVML: %v: GPUs %s keep the MIG layout NVML last reported until it answers again (not handed out whole)", err, gpuList(snap, mig)))
		}
		return gpus, warnings, pr, status
	}
	if h.last == nil {
		h.last = map[string]discover.NVMLGPU{}
	}
	pr = probe{usable: map[string]bool{}, errs: map[string]string{}}
	answered := map[string]bool{}
	for _, g := range all {
		if g.Err == nil {
			ng := nvmlGPU(g)
			pr.usable[g.UUID] = true
			answered[strings.ToUpper(g.UUID)] = true
			h.last[strings.ToUpper(g.UUID)] = ng
			gpus = append(gpus, ng)
			continue
		}
		// A GPU NVML cannot query is unhealthy, whatever the error: its
		// MIG mode is not known. It keeps its last MIG layout. NVML
		// numbers GPUs in bus order, as discovery does.
		uuid := g.UUID
		if uuid == "" {
			if sg, ok := gpuAt(snap, g.Index); ok {
				uuid = sg.UUID
			}
		}
		w := fmt.Sprintf("NVML: GPU %d (%s): %v: unhealthy", g.Index, uuid, g.Err)
		if uuid != "" {
			pr.errs[uuid] = g.Err.Error()
			answered[strings.ToUpper(uuid)] = true
			if last, ok := h.last[strings.ToUpper(uuid)]; ok {
				gpus = append(gpus, last)
				w += fmt.Sprintf("; the MIG layout NVML last reported for it stays (MIG enabled: %v, %d MIG devices)", last.MIGEnabled, len(last.MIG))
			}
		}
		warnings = append(warnings, w)
	}
	// A GPU NVML answered for before and no longer lists.
	for _, sg := range snap.GPUs {
		last, ok := h.last[strings.ToUpper(sg.UUID)]
		if !ok || answered[strings.ToUpper(sg.UUID)] {
			continue
		}
		pr.errs[sg.UUID] = "NVML no longer lists it"
		gpus = append(gpus, last)
		warnings = append(warnings, fmt.Sprintf("NVML: GPU %d (%s): no longer listed by NVML: unhealthy; the MIG layout NVML last reported for it stays", sg.Index, sg.UUID))
	}
	return gpus, warnings, pr, "ok"
}

// nvmlGPU converts NVML's answer for a GPU it could query.
func nvmlGPU(g nvml.GPU) discover.NVMLGPU {
	ng := discover.NVMLGPU{UUID: g.UUID, MIGEnabled: g.MIGEnabled, MemoryMiB: g.MemoryMiB, Props: &inventory.GPUProps{
		ProductName: g.Name, MemoryBytes: g.MemoryBytes, Brand: g.Brand, Architecture: g.Architecture,
		ComputeCapability: g.ComputeCapability, AddressingMode: g.AddressingMode, CUDADriverVersion: g.CUDADriverVersion,
	}}
	for _, m := range g.MIG {
		nm := discover.NVMLMIG{UUID: m.UUID, Index: m.Index, GI: m.GI, CI: m.CI, Profile: m.Profile, MemoryMiB: m.MemoryMiB,
			Engines: inventory.MIGEngines(m.Engines)}
		if p := m.Placement; p != nil {
			nm.Placement = &inventory.MIGPlacement{ProfileID: p.ProfileID, Start: p.Start, Size: p.Size}
		}
		ng.MIG = append(ng.MIG, nm)
	}
	return ng
}

// lastOf returns the last good answers of snap's GPUs: what stays in
// force while NVML does not answer. A GPU that had MIG enabled keeps its
// MIG layout (it is not handed out whole); every GPU keeps the properties
// NVML last reported of it, so that what is published of it (the DRA
// driver's attributes) does not change while NVML is busy or failing.
func (h *nvmlHandle) lastOf(snap *inventory.Snapshot) []discover.NVMLGPU {
	var out []discover.NVMLGPU
	for _, g := range snap.GPUs {
		if last, ok := h.last[strings.ToUpper(g.UUID)]; ok {
			out = append(out, last)
		}
	}
	return out
}

// migEnabled returns those of gpus with MIG enabled.
func migEnabled(gpus []discover.NVMLGPU) []discover.NVMLGPU {
	var out []discover.NVMLGPU
	for _, g := range gpus {
		if g.MIGEnabled {
			out = append(out, g)
		}
	}
	return out
}

// gpuList names snap's GPUs among gpus by index, for messages.
func gpuList(snap *inventory.Snapshot, gpus []discover.NVMLGPU) string {
	var idx []string
	for _, g := range snap.GPUs {
		if slices.ContainsFunc(gpus, func(n discover.NVMLGPU) bool { return strings.EqualFold(n.UUID, g.UUID) }) {
			idx = append(idx, fmt.Sprint(g.Index))
		}
	}
	return strings.Join(idx, ", ")
}

// enumerate loads NVML from path when needed and enumerates the GPUs,
// waiting for it at most h.bound. An error says why there is no answer:
// no library, a library that does not load, an enumeration that fails,
// or NVML still busy past the bound. The caller holds mu.
func (h *nvmlHandle) enumerate(path, driverRoot string) ([]nvml.GPU, error) {
	if c := h.slow; c != nil {
		select {
		case <-c.done:
			// It answered meanwhile: keep the library it loaded; its
			// answer is old, so ask again.
			h.slow = nil
			if c.opened != nil && h.lib == nil && c.path == path {
				h.lib, h.path = c.opened, c.path
			} else if c.opened != nil {
				_ = c.opened.Close()
			}
		default:
			return nil, h.slowError()
		}
	}
	if path == "" {
		h.closeLocked()
		return nil, errors.New("discovery found no " + nvmlSONAME + " under driverRoot " + driverRoot)
	}
	if h.lib != nil && h.path != path {
		h.closeLocked()
	}
	c := &nvmlCall{path: path, done: make(chan struct{})}
	go h.call(c, h.lib)
	if !h.wait(c) {
		h.slow = c
		return nil, h.slowError()
	}
	if c.openErr != nil {
		return nil, c.openErr
	}
	if c.opened != nil {
		h.lib, h.path = c.opened, path
	}
	return c.gpus, c.err
}

// slowError says that NVML is still busy past the bound; the same text
// each time, so that it is logged once.
func (h *nvmlHandle) slowError() error {
	return fmt.Errorf("NVML has not answered within %s (loading %s, nvmlInit_v2 or an enumeration); the node is rediscovered when it does", h.bound, nvmlSONAME)
}

// call runs c: loads the library when lib is nil, then enumerates.
func (h *nvmlHandle) call(c *nvmlCall, lib nvml.Lib) {
	if lib == nil {
		c.opened, c.openErr = h.open(c.path)
		lib = c.opened
	}
	if lib != nil {
		c.gpus, c.err = lib.Devices()
	}
	close(c.done)
	h.lateMu.Lock()
	late := c.late
	h.lateMu.Unlock()
	if late && h.late != nil {
		h.late()
	}
}

// wait waits for c up to h.bound, and reports whether it answered.
func (h *nvmlHandle) wait(c *nvmlCall) bool {
	if h.bound <= 0 {
		<-c.done
		return true
	}
	t := time.NewTimer(h.bound)
	defer t.Stop()
	select {
	case <-c.done:
		return true
	case <-t.C:
	}
	h.lateMu.Lock()
	defer h.lateMu.Unlock()
	select {
	case <-c.done:
		return true
	default:
		c.late = true
		return false
	}
}

func gpuAt(snap *inventory.Snapshot, i int) (inventory.GPU, bool) {
	for _, g := range snap.GPUs {
		if g.Index == i {
			return g, true
		}
	}
	return inventory.GPU{}, false
}

// closeLocked shuts NVML down (nvml.Lib.Close waits for the event waits
// on it and frees their sets first). The caller holds mu, or owns h.
func (h *nvmlHandle) closeLocked() {
	if h.lib != nil {
		_ = h.lib.Close()
		h.lib, h.path = nil, ""
	}
}

// Lib returns the loaded NVML, or nil.
func (h *nvmlHandle) Lib() nvml.Lib {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lib
}

// NVMLPath returns where this process reads the libnvidia-ml.so.1 that
// discovery found in snap (under driverRootMount), or "" when it found
// none: the library nri-gpu loads NVML from.
func NVMLPath(cfg config.Config, snap *inventory.Snapshot) string { return libraryPath(cfg, snap) }
