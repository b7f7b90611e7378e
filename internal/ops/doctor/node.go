package doctor

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
)

// checkKernel checks the kernel layer: the driver loaded, the majors in
// /proc/devices, the device nodes. It returns the node's inventory, and
// whether the layer passed.
func checkKernel(o *Options, out *[]Result) (*inventory.Snapshot, bool) {
	cfg := o.Config
	snap, err := discover.Discover(discover.Options{HostRoot: cfg.HostRoot, DriverRoot: cfg.DriverRoot, DriverRootMount: cfg.DriverRootMount, MPSPipeDir: os.Getenv(inventory.EnvMPSPipeDir)})
	skipRest := func() {
		add(out, Kernel, "majors", Skip, "no kernel driver", "fix the driver first")
		add(out, Kernel, "device nodes", Skip, "no kernel driver", "fix the driver first")
	}
	if err != nil {
		add(out, Kernel, "driver", Fail, err.Error(), "check hostRoot and driverRoot in the configuration (--config)")
		skipRest()
		return nil, false
	}
	if snap.DriverVersion == "" {
		msg := "no NVIDIA kernel module loaded"
		if len(snap.Warnings) > 0 {
			msg = snap.Warnings[0]
		}
		add(out, Kernel, "driver", Fail, msg, "load the driver (modprobe nvidia), or install it if the node has none")
		skipRest()
		return snap, false
	}
	add(out, Kernel, "driver", Pass, "NVIDIA kernel module "+snap.DriverVersion+" loaded", "")

	ok := true
	data, err := os.ReadFile(o.host("/proc/devices"))
	majors, perr := discover.ParseProcDevices(data)
	switch {
	case err != nil:
		add(out, Kernel, "majors", Fail, "reading /proc/devices: "+err.Error(), "check hostRoot in the configuration")
		ok = false
	case perr != nil:
		add(out, Kernel, "majors", Fail, perr.Error(), "check hostRoot in the configuration")
		ok = false
	default:
		nv, has := majors["nvidia-frontend"]
		if !has {
			nv, has = majors["nvidia"]
		}
		uvm, hasUVM := majors["nvidia-uvm"]
		switch {
		case !has:
			add(out, Kernel, "majors", Fail, "/proc/devices lists no nvidia major", "reload the driver: modprobe -r nvidia && modprobe nvidia")
			ok = false
		case !hasUVM:
			add(out, Kernel, "majors", Fail, fmt.Sprintf("nvidia %d, but nvidia-uvm is not loaded: CUDA needs it", nv), "modprobe nvidia-uvm (or nvidia-modprobe -u -c0)")
			ok = false
		default:
			add(out, Kernel, "majors", Pass, fmt.Sprintf("nvidia %d, nvidia-uvm %d", nv, uvm), "")
		}
	}

	devProblems := snap.DeviceWarnings
	fix := "create the device nodes: nvidia-modprobe -c <minor> for each GPU (or run nvidia-smi once as root); check that hostRoot shows the host's /dev"
	switch {
	case len(snap.GPUs) == 0:
		msg := "no usable GPU"
		if len(devProblems) > 0 {
			msg += ": " + firstLines(devProblems, 2)
		}
		add(out, Kernel, "device nodes", Fail, msg, fix)
		ok = false
	case len(devProblems) > 0:
		add(out, Kernel, "device nodes", Fail, fmt.Sprintf("%d GPUs usable, but %s", len(snap.GPUs), firstLines(devProblems, 2)), fix)
		ok = false
	default:
		var nodes []string
		for _, g := range snap.GPUs {
			nodes = append(nodes, g.Node.Path)
		}
		add(out, Kernel, "device nodes", Pass, fmt.Sprintf("%d GPUs: %s, /dev/nvidiactl, /dev/nvidia-uvm", len(snap.GPUs), strings.Join(nodes, " ")), "")
	}
	return snap, ok
}

// checkUserSpace checks the driver's libraries: present, and of the
// kernel module's version.
func checkUserSpace(o *Options, snap *inventory.Snapshot, out *[]Result) {
	if snap == nil || snap.DriverVersion == "" {
		add(out, UserSpace, "libraries", Skip, "no kernel driver to match", "fix the kernel layer first")
		return
	}
	if p := snap.DriverProblem(); p != "" {
		add(out, UserSpace, "libraries", Fail, p,
			fmt.Sprintf("install the driver's user-space libraries of version %s (the same package version as the kernel module), or reboot after a driver upgrade so the module matches the libraries; check driverRoot (%s)", snap.DriverVersion, o.Config.DriverRoot))
		return
	}
	var libs int
	for _, f := range snap.Files {
		if f.Kind == inventory.Library || f.Kind == inventory.Library32 {
			libs++
		}
	}
	if !slices.ContainsFunc(snap.Files, func(f inventory.DriverFile) bool { return f.Name == "libcuda.so.1" }) {
		add(out, UserSpace, "libraries", Warn, fmt.Sprintf("%d libraries of %s, but no libcuda.so.1: CUDA applications will fail", libs, snap.DriverVersion),
			"install the driver's compute libraries (libcuda)")
		return
	}
	add(out, UserSpace, "libraries", Pass, fmt.Sprintf("%d driver libraries of %s under driverRoot %s, %d files in all", libs, snap.DriverVersion, snap.DriverRoot, len(snap.Files)), "")
}

// checkImported checks the node layers of a node whose devices come from
// another vendor's CDI specs (cdiImport): that the specs define devices
// nri-gpu can serve (their nodes and mounts exist on the host, no hook
// unless allowed). The vendor's kernel driver and libraries are its own
// business: they reach containers through the specs' edits.
func checkImported(o *Options, out *[]Result) {
	ci := o.Config.CDIImport
	fix := fmt.Sprintf("generate the %s CDI spec with the vendor's tool into one of cdiImport.specDirs %v (under hostRoot %s)", ci.Kind, ci.SpecDirs, o.Config.HostRoot)
	snap, err := node.Discover(o.Config)
	switch {
	case err != nil:
		add(out, Kernel, "devices", Fail, err.Error(), "check cdiImport in the configuration (--config)")
	case len(snap.GPUs) == 0:
		msg := "no usable " + ci.Kind + " device"
		if len(snap.Warnings) > 0 {
			msg += ": " + firstLines(snap.Warnings, 2)
		}
		add(out, Kernel, "devices", Fail, msg, fix)
	case len(snap.Warnings) > 0:
		add(out, Kernel, "devices", Warn, fmt.Sprintf("%d %s devices, but %s", len(snap.GPUs), ci.Kind, firstLines(snap.Warnings, 2)), "fix or remove the specs named; "+fix)
	default:
		names := make([]string, 0, len(snap.GPUs))
		for _, g := range snap.GPUs {
			names = append(names, g.Name)
		}
		add(out, Kernel, "devices", Pass, fmt.Sprintf("%d %s devices from CDI specs: %s", len(snap.GPUs), ci.Kind, strings.Join(names, " ")), "")
	}
	add(out, UserSpace, "libraries", Skip, ci.Kind+" devices bring their files in their CDI specs (cdiImport), checked with the devices", "")
}
