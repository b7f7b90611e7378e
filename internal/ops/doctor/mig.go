package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
)

// openNVML loads NVML; a variable for tests.
var openNVML, realOpenNVML = nvml.Open, nvml.Open

// nvmlLib is nvml.Lib, for tests.
type nvmlLib = nvml.Lib

// checkNVML checks what nri-gpu needs for MIG devices and XID health: NVML
// loaded from the driver root (where from, its version), each GPU's MIG
// mode, and, where MIG is on, that every MIG device NVML reports is
// numbered by /proc/driver/nvidia-caps/mig-minors under the nvidia-caps
// major of /proc/devices (else nri-gpu does not offer it).
func checkNVML(o *Options, snap *inventory.Snapshot, out *[]Result) {
	const name = "NVML/MIG"
	if snap == nil || snap.DriverVersion == "" || len(snap.GPUs) == 0 {
		add(out, UserSpace, name, Skip, "no kernel driver or GPU", "fix the kernel layer first")
		return
	}
	cfg := o.Config
	path := node.NVMLPath(cfg, snap)
	if path == "" {
		add(out, UserSpace, name, Warn, "discovery found no libnvidia-ml.so.1 under driverRoot "+cfg.DriverRoot+": nri-gpu serves whole GPUs, no MIG devices, no XID health",
			"install the driver's libnvidia-ml.so.1 (of "+snap.DriverVersion+") under driverRoot, or set driverRoot to where it is")
		return
	}
	lib, err := openNVML(path)
	if err != nil {
		add(out, UserSpace, name, Warn, fmt.Sprintf("NVML at %s: %v: nri-gpu serves whole GPUs, no MIG devices, no XID health", path, err),
			"check that "+path+" is the driver's library of "+snap.DriverVersion+" and that the driver is loaded (nvidia-smi)")
		return
	}
	defer lib.Close()
	from := "NVML from " + path
	if v, ok := lib.(nvml.Versioner); ok {
		if nv, dv := v.Version(); nv != "" || dv != "" {
			from = fmt.Sprintf("NVML %s (driver %s) from %s", nv, dv, path)
		}
	}
	gpus, err := lib.Devices()
	if err != nil {
		add(out, UserSpace, name, Warn, fmt.Sprintf("%s: enumerating GPUs: %v: no MIG devices, no XID health", from, err), "run nvidia-smi on the host: NVML fails there too")
		return
	}
	modes, lost, in, reported := migModes(gpus)
	verdict := from + ": " + strings.Join(modes, ", ")
	if len(lost) > 0 {
		add(out, UserSpace, name, Warn, verdict+"; NVML cannot query "+firstLines(lost, 2)+" (unhealthy: count requests skip it)", "check the GPU with nvidia-smi and the kernel log (XID); reset it (nvidia-smi -r) or reboot")
		return
	}
	if reported == 0 && !anyMIG(in) {
		add(out, UserSpace, name, Pass, verdict+"; XID health available", "")
		return
	}
	// MIG is on: the capability minors and their major.
	major, entries := o.migNumbers()
	res := discover.AddMIG(discover.Options{HostRoot: cfg.HostRoot, DriverRoot: cfg.DriverRoot, DriverRootMount: cfg.DriverRootMount}, snap, in)
	verdict += fmt.Sprintf("; %d of %d MIG devices numbered (%s, %s)", len(res.MIG), reported, entries, major)
	news := res.Warnings[len(snap.Warnings):]
	switch {
	case len(res.MIG) < reported:
		add(out, UserSpace, name, Fail, verdict+": "+firstLines(news, 2),
			"MIG devices without their capability minors are not offered: load the driver's nvidia-caps support (nvidia-modprobe -f /proc/driver/nvidia-caps/mig-minors, or run nvidia-smi once as root) and check that hostRoot shows the host's /proc")
	case len(news) > 0:
		add(out, UserSpace, name, Warn, verdict+": "+firstLines(news, 2), "see nri-gpu inventory; a MIG-enabled GPU without MIG devices offers nothing: create them (nvidia-smi mig -cgi ... -C) or disable MIG (nvidia-smi -mig 0)")
	default:
		add(out, UserSpace, name, Pass, verdict+"; XID health available", "")
	}
}

// migModes returns what NVML says of each GPU for the verdict ("GPU 0 MIG
// off"), the GPUs NVML cannot query, the answer as discovery takes it, and
// how many MIG devices NVML reports.
func migModes(gpus []nvml.GPU) (modes, lost []string, in []discover.NVMLGPU, reported int) {
	for _, g := range gpus {
		if g.Err != nil {
			lost = append(lost, fmt.Sprintf("GPU %d: %v", g.Index, g.Err))
			continue
		}
		mode := "off"
		if g.MIGEnabled {
			mode = fmt.Sprintf("on, %d MIG devices", len(g.MIG))
			reported += len(g.MIG)
		}
		modes = append(modes, fmt.Sprintf("GPU %d MIG %s", g.Index, mode))
		ng := discover.NVMLGPU{UUID: g.UUID, MIGEnabled: g.MIGEnabled}
		for _, m := range g.MIG {
			ng.MIG = append(ng.MIG, discover.NVMLMIG{UUID: m.UUID, Index: m.Index, GI: m.GI, CI: m.CI, Profile: m.Profile, MemoryMiB: m.MemoryMiB})
		}
		in = append(in, ng)
	}
	return modes, lost, in, reported
}

// migNumbers says, for the verdict, what the host's /proc/devices and
// /proc/driver/nvidia-caps/mig-minors give MIG devices: the nvidia-caps
// major, and how many instances mig-minors numbers.
func (o *Options) migNumbers() (major, entries string) {
	major = "nvidia-caps major missing"
	if data, err := os.ReadFile(o.host("/proc/devices")); err == nil {
		if majors, err := discover.ParseProcDevices(data); err == nil {
			if m, ok := majors["nvidia-caps"]; ok {
				major = fmt.Sprintf("nvidia-caps major %d", m)
			}
		}
	}
	entries = "mig-minors missing"
	switch data, err := os.ReadFile(o.host("/proc/driver/nvidia-caps/mig-minors")); {
	case err == nil:
		if mm, err := discover.ParseMIGMinors(data); err == nil {
			entries = fmt.Sprintf("mig-minors numbers %d GPU and %d compute instances", len(mm.GI), len(mm.CI))
		} else {
			entries = "mig-minors: " + err.Error()
		}
	case !errors.Is(err, fs.ErrNotExist):
		entries = "mig-minors: " + err.Error()
	}
	return major, entries
}

func anyMIG(gpus []discover.NVMLGPU) bool {
	for _, g := range gpus {
		if g.MIGEnabled {
			return true
		}
	}
	return false
}
