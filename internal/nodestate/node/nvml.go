package node

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
)

// nvmlSONAME is the library NVML is loaded from, found among the driver
// files discovery listed.
const nvmlSONAME = "libnvidia-ml.so.1"

// nvmlHandle holds NVML loaded from the driver root, across
// rediscoveries: it is loaded once (again only when discovery finds the
// library at another path, as after a driver upgrade) and its status is
// logged when it changes, so that a node without NVML says so once.
type nvmlHandle struct {
	mu     sync.Mutex
	open   func(path string) (nvml.Lib, error)
	lib    nvml.Lib
	path   string
	status string
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
	if status != h.status && log != nil {
		if status == "ok" {
			log.Infof("NVML: %s loaded: MIG devices and XID health are available", h.path)
		} else {
			log.Warnf("NVML %s: serving whole GPUs; no MIG devices, no XID health", status)
		}
	}
	h.status = status
	out := discover.AddMIG(discover.Options{HostRoot: cfg.HostRoot, DriverRoot: cfg.DriverRoot, DriverRootMount: cfg.DriverRootMount}, snap, gpus)
	out.NVML = status
	out.Warnings = append(out.Warnings, warnings...)
	return out, pr
}

// probe is what one enumeration said of the GPUs' health: by UUID, those
// NVML queried (usable) and those it failed to (errs, with its error).
type probe struct {
	usable map[string]bool
	errs   map[string]string
}

// devices loads NVML when needed and enumerates the GPUs. The caller holds
// mu.
func (h *nvmlHandle) devices(cfg config.Config, snap *inventory.Snapshot) (gpus []discover.NVMLGPU, warnings []string, pr probe, status string) {
	path := libraryPath(cfg, snap)
	if path == "" {
		h.closeLocked()
		return nil, nil, pr, "unavailable: discovery found no " + nvmlSONAME + " under driverRoot " + cfg.DriverRoot
	}
	if h.lib == nil || h.path != path {
		h.closeLocked()
		lib, err := h.open(path)
		if err != nil {
			return nil, nil, pr, "unavailable: " + err.Error()
		}
		h.lib, h.path = lib, path
	}
	all, err := h.lib.Devices()
	if err != nil {
		return nil, nil, pr, "unavailable: " + err.Error()
	}
	pr = probe{usable: map[string]bool{}, errs: map[string]string{}}
	out := make([]discover.NVMLGPU, 0, len(all))
	for _, g := range all {
		if g.Err != nil {
			// A GPU NVML cannot query keeps what discovery
			// says of it, unhealthy; its MIG devices are not
			// offered. NVML numbers GPUs in bus order, as
			// discovery does.
			uuid := g.UUID
			if uuid == "" {
				if sg, ok := gpuAt(snap, g.Index); ok {
					uuid = sg.UUID
				}
			}
			// Only a GPU NVML reports lost or in need of a reset is
			// unhealthy; another error is a warning.
			if uuid != "" && (nvml.IsCode(g.Err, nvml.ErrGPUIsLost) || nvml.IsCode(g.Err, nvml.ErrResetRequired)) {
				pr.errs[uuid] = g.Err.Error()
			}
			warnings = append(warnings, fmt.Sprintf("NVML: GPU %d (%s): %v", g.Index, uuid, g.Err))
			continue
		}
		pr.usable[g.UUID] = true
		ng := discover.NVMLGPU{UUID: g.UUID, MIGEnabled: g.MIGEnabled, MemoryMiB: g.MemoryMiB}
		for _, m := range g.MIG {
			ng.MIG = append(ng.MIG, discover.NVMLMIG{UUID: m.UUID, Index: m.Index, GI: m.GI, CI: m.CI, Profile: m.Profile, MemoryMiB: m.MemoryMiB})
		}
		out = append(out, ng)
	}
	return out, warnings, pr, "ok"
}

func gpuAt(snap *inventory.Snapshot, i int) (inventory.GPU, bool) {
	for _, g := range snap.GPUs {
		if g.Index == i {
			return g, true
		}
	}
	return inventory.GPU{}, false
}

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
