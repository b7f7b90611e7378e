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

// KindNVIDIA is the CDI kind of NVIDIA GPUs: how CDI specs, the NVIDIA
// toolkit's annotations and the Kubernetes device plugin name them.
const KindNVIDIA = "nvidia.com/gpu"

// DeviceNode is a character device node to create in a container.
type DeviceNode struct {
	// Path is the node's path, the same on the host and in the container.
	Path  string
	Major int64
	Minor int64
	// Mode is the host node's permission bits (a uint32, not an
	// fs.FileMode, so that these types import nothing of the file system).
	Mode uint32
	// GID is the host node's group when it is not root's (the render
	// group of /dev/dri nodes), so that a container user in that group
	// can open it as on the host; 0 leaves the runtime's default.
	GID uint32
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
	// CDI spec (package cdisource); requests may name it.
	Name string
	// MIG is set on the unit of a MIG device (MIGDevice.Unit): Index is
	// then its key (MIGKey), UUID its MIG UUID, Node its parent's node.
	MIG *MIGDevice
	// MIGEnabled is set when NVML reports MIG mode on: the GPU is not
	// handed out whole, only its MIG devices (Snapshot.MIG).
	MIGEnabled bool
	// MemoryMiB is the GPU's total memory as NVML reports it; 0 without
	// NVML. (A MIG device's is in MIG.)
	MemoryMiB uint64
	// NUMANode is the NUMA node the GPU is attached to, as sysfs says
	// (/sys/bus/pci/devices/<bus id>/numa_node); -1 when unknown: no
	// NUMA, no sysfs, or a GPU that does not come from NVIDIA discovery.
	// The zero value is NUMA node 0: discovery sets -1 where sysfs is
	// silent.
	NUMANode int
	// DRM are the GPU's DRM nodes, found through sysfs by bus id; nil
	// when it has none (no nvidia-drm module, no sysfs). Containers get
	// them with the graphics or display capability. A pointer, so that a
	// GPU stays small: the request path copies GPUs.
	DRM *DRMNodes
	// Props are what NVML says of the GPU beyond discovery; nil without
	// NVML. A pointer, as DRM.
	Props *GPUProps
}

// GPUProps are a GPU's properties that only NVML knows (the DRA
// driver's ResourceSlices publish them); an empty field is unknown.
type GPUProps struct {
	// ProductName is NVML's name of the GPU, "NVIDIA H100 80GB HBM3"
	// (the same string as /proc's Model).
	ProductName string
	// MemoryBytes is the GPU's total memory.
	MemoryBytes uint64
	// Brand is NVML's brand as NVIDIA's go-nvlib names it ("Nvidia",
	// "Tesla", "GeForce", ...).
	Brand string
	// Architecture is NVML's architecture as go-nvlib names it
	// ("Ampere", "Hopper", "Blackwell", ...).
	Architecture string
	// ComputeCapability is the CUDA compute capability, "9.0".
	ComputeCapability string
	// AddressingMode is "HMM", "ATS" or "None" on a platform with
	// coherent memory (Grace Hopper); empty elsewhere.
	AddressingMode string
	// CUDADriverVersion is the CUDA version the driver supports as NVML
	// reports it, "13.0".
	CUDADriverVersion string
}

// DRMNodes are a GPU's /dev/dri/card<N> and /dev/dri/renderD<N>; a zero
// Path where the GPU lacks one.
type DRMNodes struct {
	Card, Render DeviceNode
}

// Card returns the GPU's DRM card node; a zero Path when it has none.
func (g GPU) Card() DeviceNode {
	if g.DRM == nil {
		return DeviceNode{}
	}
	return g.DRM.Card
}

// Render returns the GPU's DRM render node; a zero Path when it has none.
func (g GPU) Render() DeviceNode {
	if g.DRM == nil {
		return DeviceNode{}
	}
	return g.DRM.Render
}

// NoNUMANode is GPU.NUMANode where the NUMA node is unknown.
const NoNUMANode = -1

// ID names the GPU whatever the inventory's order: its UUID, or the CDI
// name of another vendor's device.
func (g GPU) ID() string {
	if g.UUID != "" {
		return g.UUID
	}
	return g.Name
}

// Mount is a mount of a host path into a container: a read-only bind
// mount of a driver file unless Type and Options say otherwise (mounts
// taken from another vendor's CDI spec).
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
	// Config is a file the driver installs that applications find at a
	// fixed path (an EGL or Vulkan vendor file, an Xorg module, an NGX
	// DLL): it is mounted read-only at Name, an absolute container path.
	Config
	// Socket is an IPC endpoint of a driver daemon (the persistenced or
	// fabric manager socket, the MPS pipe directory): it is mounted at
	// Name, its own path, with the toolkit's IPC mount options
	// (read-write, nosuid, nodev, noexec).
	Socket
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
	case Config:
		return "config"
	case Socket:
		return "socket"
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
	// library, the base name of a binary or firmware directory, the
	// absolute container path of a Config or Socket.
	Name string
	// OwnVersion marks a library that carries a version of its own, not
	// the driver's (the EGL external platform libraries): its file name
	// says nothing of the driver's health.
	OwnVersion bool
}

// devLinks are the unversioned development names that a container's
// library directory holds next to the SONAME they point to: JIT linkers
// (Triton, numba, CuPy's nvrtc users) link with -lcuda, which searches for
// libcuda.so, and the driver installs no such name.
var devLinks = map[string]string{"libcuda.so.1": "libcuda.so"}

// DevLink returns the development name of a library with the given SONAME,
// if it has one (libcuda.so for libcuda.so.1).
func DevLink(soname string) (string, bool) {
	n, ok := devLinks[soname]
	return n, ok
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
	// IMEXChannels are the IMEX channel nodes found, sorted by number
	// (see IMEXChannel); empty on a node without them.
	IMEXChannels []IMEXChannel
	// MIG are the MIG devices of the MIG-enabled GPUs, sorted by parent
	// index then MIG index; empty without NVML.
	MIG []MIGDevice
	// MIGControl are the MIG management capabilities.
	MIGControl MIGControl
	// NVML says whether NVML was used: "" before it is tried (discovery
	// alone), "ok", or why not ("unavailable: ...").
	NVML string
	// Files are the driver files found, sorted by kind then name.
	Files []DriverFile
	// Warnings say what discovery found wrong or missing.
	Warnings []string
	// DeviceWarnings are those of Warnings about the device nodes and
	// the list of GPUs (nri-gpu doctor's kernel layer).
	DeviceWarnings []string
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

// IndexRange describes the GPU indexes for error messages: "0-3", "0,2-3",
// or "none".
func (s *Snapshot) IndexRange() string { return IndexRange(s.GPUs) }

// IndexRange describes the indexes of gpus (sorted by index) for error
// messages: "0-3", "0,2-3", or "none".
func IndexRange(gpus []GPU) string {
	if len(gpus) == 0 {
		return "none"
	}
	out := ""
	for i := 0; i < len(gpus); {
		j := i
		for j+1 < len(gpus) && gpus[j+1].Index == gpus[j].Index+1 {
			j++
		}
		if out != "" {
			out += ","
		}
		if i == j {
			out += UnitLabel(gpus[i].Index)
		} else {
			out += UnitLabel(gpus[i].Index) + "-" + UnitLabel(gpus[j].Index)
		}
		i = j + 1
	}
	return out
}
