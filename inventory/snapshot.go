// Package inventory holds what a node offers for GPU injection, as plain
// values: the GPUs and their device nodes, the driver's control nodes, the
// driver files of each capability, the driver and kernel versions. A
// Snapshot is the result of one discovery (package inventory/discover for
// NVIDIA GPUs, package cdisource for another vendor's CDI specs); it is
// never modified, and a refresh makes a new one.
//
// Nothing here reads the host: the request path works on these types, and
// a test checks that no package it imports, directly or not, does I/O.
package inventory

import "fmt"

// DeviceNode is a character device node to create in a container.
type DeviceNode struct {
	// Path is the node's path, the same on the host and in the container.
	Path  string
	Major int64
	Minor int64
	// Mode is the host node's permission bits (a uint32, not an
	// fs.FileMode, so that these types import nothing of the file system).
	Mode uint32
}

// GPU is one GPU that may be handed out.
type GPU struct {
	// Index is the GPU's position in PCI bus order, as nvidia-smi and
	// NVIDIA_VISIBLE_DEVICES number GPUs.
	Index int
	Minor int
	UUID  string
	// BusID is the PCI address in /proc's form, "0000:38:00.0".
	BusID string
	Model string
	Node  DeviceNode
	// Name is the device's CDI name when it comes from another vendor's
	// CDI spec (Snapshot.Vendor set); requests may name it.
	Name string
	// Edits are the device's own edits besides Node, for devices that
	// come from a CDI spec; nil for NVIDIA GPUs found by discovery.
	Edits *Edits
}

// ID names the GPU whatever the inventory's order: its UUID, or the CDI
// name of another vendor's device.
func (g GPU) ID() string {
	if g.UUID != "" {
		return g.UUID
	}
	return g.Name
}

// Edits are container edits taken from a CDI spec: what a device brings
// besides its main node. Paths of mounts are host paths as the runtime
// sees them, checked to exist at discovery.
type Edits struct {
	Nodes  []DeviceNode
	Mounts []Mount
	// Env entries are KEY=VALUE; they set (replace) the variable.
	Env   []string
	Hooks []Hook
}

// Mount is a mount of a host path into a container.
type Mount struct {
	Source      string
	Destination string
	Type        string
	Options     []string
}

// Hook is an OCI hook with an absolute path and an explicit environment.
type Hook struct {
	// Stage is the OCI hook stage: prestart, createRuntime,
	// createContainer, startContainer, poststart, poststop.
	Stage   string
	Path    string
	Args    []string
	Env     []string
	Timeout *int
}

// FileKind says what a driver file is, and so where it goes.
type FileKind uint8

// Kinds of driver files.
const (
	// Library is a 64-bit shared library, loaded by SONAME.
	Library FileKind = iota
	// Library32 is a 32-bit shared library (compat32).
	Library32
	// Binary is an executable such as nvidia-smi.
	Binary
	// FirmwareDir is the directory of the driver's GSP firmware.
	FirmwareDir
)

func (k FileKind) String() string {
	switch k {
	case Library:
		return "library"
	case Library32:
		return "library32"
	case Binary:
		return "binary"
	case FirmwareDir:
		return "firmware"
	}
	return "unknown"
}

// DriverFile is a driver file found on the host.
type DriverFile struct {
	Kind FileKind
	// Capability is the capability that brings the file; zero for files
	// every injection gets (firmware).
	Capability Capability
	// HostPath is the file's path as the runtime sees it (under
	// driverRoot), used as the bind-mount source.
	HostPath string
	// Name is the name the file goes by in a container: the SONAME of a
	// library, the base name of a binary or firmware directory.
	Name string
}

// ControlNodes are the driver's node-wide device nodes; a nil field was not
// found on the node.
type ControlNodes struct {
	Ctl      *DeviceNode // /dev/nvidiactl
	UVM      *DeviceNode // /dev/nvidia-uvm
	UVMTools *DeviceNode // /dev/nvidia-uvm-tools
	Modeset  *DeviceNode // /dev/nvidia-modeset
}

// Snapshot is the result of one discovery. It is never modified after
// Discover returns it; a refresh makes a new one.
type Snapshot struct {
	HostRoot   string
	DriverRoot string
	// DriverVersion is the kernel module's version; empty when no driver
	// is loaded.
	DriverVersion string
	// KernelRelease is the running kernel's release
	// (/proc/sys/kernel/osrelease); empty when it cannot be read.
	KernelRelease string
	// GPUs that may be handed out, sorted by Index. Indexes may have gaps
	// where a GPU is present but unusable (see Warnings).
	GPUs    []GPU
	Control ControlNodes
	// Files are the driver files found, sorted by kind then name.
	Files []DriverFile
	// Warnings say what discovery found wrong or missing.
	Warnings []string

	// Vendor is the CDI kind ("amd.com/gpu") of a snapshot whose devices
	// come from another vendor's CDI specs; empty for NVIDIA discovery.
	// Such a snapshot has no driver files or control nodes; its devices'
	// edits come from the specs, and Common holds the specs' own edits.
	Vendor string
	Common *Edits
}

// HasFirmware reports whether discovery found the driver's GSP firmware.
func (s *Snapshot) HasFirmware() bool {
	for _, f := range s.Files {
		if f.Kind == FirmwareDir {
			return true
		}
	}
	return false
}

// Empty reports whether the snapshot offers no GPU.
func (s *Snapshot) Empty() bool { return len(s.GPUs) == 0 }

// Usable reports whether requests can be served at all: an NVIDIA driver
// with its control node, or another vendor's CDI devices.
func (s *Snapshot) Usable() bool {
	if s.Vendor != "" {
		return true
	}
	return s.DriverVersion != "" && s.Control.Ctl != nil
}

// FilesFor returns the driver files that the given capabilities bring,
// including those every injection gets, in the snapshot's order. 32-bit
// libraries come only with compat32, and then for the other capabilities
// of the set.
func (s *Snapshot) FilesFor(caps Capabilities) []DriverFile {
	out := make([]DriverFile, 0, len(s.Files))
	for _, f := range s.Files {
		if f.Kind == Library32 && !caps.Has(Compat32) {
			continue
		}
		if f.Capability == 0 || caps.Has(f.Capability) {
			out = append(out, f)
		}
	}
	return out
}

// IndexRange describes the GPU indexes for error messages: "0-3", "0,2-3",
// or "none".
func (s *Snapshot) IndexRange() string {
	if len(s.GPUs) == 0 {
		return "none"
	}
	out := ""
	for i := 0; i < len(s.GPUs); {
		j := i
		for j+1 < len(s.GPUs) && s.GPUs[j+1].Index == s.GPUs[j].Index+1 {
			j++
		}
		if out != "" {
			out += ","
		}
		if i == j {
			out += fmt.Sprint(s.GPUs[i].Index)
		} else {
			out += fmt.Sprintf("%d-%d", s.GPUs[i].Index, s.GPUs[j].Index)
		}
		i = j + 1
	}
	return out
}
