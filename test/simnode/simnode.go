// Package simnode lays out a simulated NVIDIA GPU node in a directory, for
// tests that must not depend on real GPUs.
//
// The generated directory works both as a host root (where /proc, /sys and
// /dev are read) and as a driver root (where the driver's user-space files
// live). It holds:
//
//   - the kernel side: /proc/driver/nvidia/{version,gpus/<bus>/information},
//     /proc/devices, /sys/module/nvidia/version and the /dev/nvidia* nodes
//     (real character devices, or empty regular files);
//   - the user-space driver: real ELF shared objects built with gcc and named
//     like the NVIDIA installer names them, with their SONAME symlinks, real
//     ELF tools (nvidia-smi, ...), GSP firmware blobs, /etc/ld.so.conf and an
//     /etc/ld.so.cache built by ldconfig.
//
// A node is of one CPU architecture (Options.Arch: amd64, or arm64 as Grace
// nodes are), by default the one the test runs on: its ELF files are built
// by gcc for it (Debian's cross compiler for another) and its cache by an
// ldconfig of it (LDConfigEnv for another; the kernel runs it with
// qemu-user).
//
// The tree is merged-/usr like current RHEL and Debian: /lib and /lib64 are
// relative symlinks to usr/lib and usr/lib64, so the firmware listed as
// /lib/firmware/nvidia/<version>/... lives under usr/lib/firmware.
//
// Compiled objects are cached in Options.CacheDir, so only the first
// Generate for a driver version pays for gcc.
package simnode

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Layout selects the distribution-specific directory for driver libraries.
type Layout string

// Supported layouts.
const (
	LayoutRHEL   Layout = "rhel"   // libraries in /usr/lib64
	LayoutDebian Layout = "debian" // libraries in /usr/lib/<multiarch triplet>: /usr/lib/x86_64-linux-gnu
)

// LibDir returns the directory (absolute, inside the node tree) that holds
// the driver libraries for the layout on a node of the architecture arch
// (Go's name; "" the test's), or "" for an unknown layout or architecture.
func (l Layout) LibDir(arch string) string {
	a, err := archOf(arch)
	if err != nil {
		return ""
	}
	switch l {
	case LayoutRHEL:
		return "/usr/lib64"
	case LayoutDebian:
		return "/usr/lib/" + a.triplet
	}
	return ""
}

// GPU describes one simulated GPU as the kernel module reports it in
// /proc/driver/nvidia/gpus/<bus>/information.
type GPU struct {
	Index    int    // PCI order (sorted by bus id) = nvidia-smi index
	Minor    int    // Device Minor
	BusID    string // 4-digit domain form as /proc shows it: "0000:38:00.0"
	UUID     string // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (lower-case hex)
	Model    string // e.g. "NVIDIA H100 80GB HBM3"
	Excluded bool   // "GPU Excluded: Yes"
	// NUMANode, when not empty, is written to
	// /sys/bus/pci/devices/<bus>/numa_node ("0", "1", "-1" for a machine
	// without NUMA, or anything else for tests of bad values); empty
	// writes no such file, and discovery then reports the NUMA node as
	// unknown.
	NUMANode string
}

// Options controls what Generate and Upgrade lay out. The zero value gives a
// node with four H100 GPUs, driver 580.126.09 and the RHEL layout.
type Options struct {
	NumGPUs int // default 4 when 0 and GPUs is nil
	// GPUs is an explicit list that overrides NumGPUs. Index is recomputed
	// from BusID order. Empty UUID and Model get the generated defaults; when
	// every Minor is 0 the minors are assigned like for generated GPUs.
	GPUs          []GPU
	SwapMinors    bool   // make index order differ from minor order (minors reversed); ignored for explicit minors
	DriverVersion string // default "580.126.09"
	CUDAVersion   int    // value cuDriverGetVersion reports, default 13000 (i.e. 13.0)
	Layout        Layout // default LayoutRHEL
	// Arch is the node's CPU architecture, Go's name: amd64 or arm64
	// (Grace: GH200, GB200); default the one the test runs on. See
	// CanBuild for what another one needs.
	Arch        string
	UVMMajor    int  // default 510
	DeviceNodes bool // create real char device nodes with mknod (needs root, see CanMknod); when false create empty regular files instead
	NoDriver    bool // kernel side only: no libraries, binaries, firmware, ld.so.cache
	// IMEXChannels, when positive, creates that many IMEX channels,
	// /dev/nvidia-caps-imex-channels/channel0 upwards (IMEXMajor:N), as
	// the driver does on an NVLink multi-node system (GB200 NVL72).
	IMEXChannels int
	// IPC makes the driver daemons' endpoints: the persistenced and
	// fabric manager sockets and the MPS pipe directory (PersistencedSocket,
	// FabricManagerSocket, MPSPipeDir). Off by default: a node without
	// those daemons running.
	IPC bool
	// KernelRelease is written to /proc/sys/kernel/osrelease; default
	// DefaultKernelRelease. "-" writes no such file.
	KernelRelease string
	CacheDir      string // where compiled ELF files are cached between calls; default os.UserCacheDir()/nri-gpu-simnode
	// NVMLWithoutProps builds the simulated libnvidia-ml.so.1 without the
	// functions of GPU properties and GPU instances (brand, architecture,
	// compute capability, addressing mode, CUDA version, GPU instance
	// profiles and placements), as a library from before them.
	NVMLWithoutProps bool
}

// File is one driver file laid out in the node tree.
type File struct {
	Path       string // absolute path inside the node tree, e.g. "/usr/lib64/libcuda.so.580.126.09"
	SONAME     string // for libraries: "libcuda.so.1"; empty for binaries/firmware
	Capability string // utility, compute, video, graphics, ngx, display, or "firmware"
	// Container, for a file that is neither a library, a binary nor
	// firmware (a vendor JSON file, an X.Org module, an NGX DLL), lists
	// where a container with its capability finds it.
	Container []string
}

// Node is the result of Generate: what was laid out and where.
type Node struct {
	Root          string // absolute path of the node tree
	GPUs          []GPU  // sorted by Index
	DriverVersion string
	Arch          string // Go's name: amd64, arm64
	LibDir        string // "/usr/lib64" or "/usr/lib/x86_64-linux-gnu" (arm64: aarch64-linux-gnu)
	UVMMajor      int
	Files         []File // every driver file laid out (real files, not the soname symlinks)
}

// HostPath returns the path on the real file system of p, an absolute path
// inside the node tree (such as a File.Path).
func (n *Node) HostPath(p string) string {
	return filepath.Join(n.Root, filepath.FromSlash(p))
}

// Defaults used when an Options field is zero.
const (
	DefaultNumGPUs       = 4
	DefaultDriverVersion = "580.126.09"
	DefaultCUDAVersion   = 13000
	DefaultUVMMajor      = 510
	DefaultModel         = "NVIDIA H100 80GB HBM3"
	// DefaultKernelRelease is a kernel that loads firmware from the mount
	// namespace of init (Linux 5.7 and later), like most nodes today.
	DefaultKernelRelease = "6.8.0-49-generic"
)

// uuidSeed is mixed into the hash that derives GPU UUIDs from bus ids, so
// that runs are reproducible but the UUIDs do not look like plain hashes of
// the bus id.
const uuidSeed = "nri-gpu-simnode/v1"

// busNumbers are the PCI bus numbers of the GPUs of a typical 8-GPU HGX
// board; further GPUs continue in the next PCI domains.
var busNumbers = []int{0x1b, 0x38, 0x5c, 0x6b, 0x9d, 0xbb, 0xcb, 0xdb}

var (
	versionRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+){1,3}$`)
	busIDRE   = regexp.MustCompile(`^([0-9a-f]{4}|[0-9a-f]{8}):[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	uuidRE    = regexp.MustCompile(`^gpu-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// DefaultBusID returns the bus id Generate gives the i-th generated GPU.
func DefaultBusID(i int) string {
	return fmt.Sprintf("%04x:%02x:00.0", i/len(busNumbers), busNumbers[i%len(busNumbers)])
}

// UUIDFor returns the deterministic UUID Generate gives a GPU at busID.
func UUIDFor(busID string) string {
	sum := sha256.Sum256([]byte(uuidSeed + "\x00" + busID))
	h := hex.EncodeToString(sum[:16])
	return "GPU-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// config is Options with defaults applied and validated.
type config struct {
	gpus        []GPU
	version     string
	cudaVersion int
	layout      Layout
	arch        arch
	libDir      string
	uvmMajor    int
	deviceNodes bool
	noDriver    bool
	ipc         bool
	cacheDir    string
	kernel      string
	// imexChannels is Options.IMEXChannels.
	imexChannels int
	// nvmlNoProps is Options.NVMLWithoutProps.
	nvmlNoProps bool
}

func normalize(opts Options) (*config, error) {
	c := &config{
		version:     opts.DriverVersion,
		cudaVersion: opts.CUDAVersion,
		layout:      opts.Layout,
		uvmMajor:    opts.UVMMajor,
		deviceNodes: opts.DeviceNodes,
		noDriver:    opts.NoDriver,
		ipc:         opts.IPC,
		cacheDir:    opts.CacheDir,
		kernel:      opts.KernelRelease,
		nvmlNoProps: opts.NVMLWithoutProps,
	}
	if err := checkIMEX(opts.IMEXChannels); err != nil {
		return nil, err
	}
	c.imexChannels = opts.IMEXChannels
	if c.kernel == "" {
		c.kernel = DefaultKernelRelease
	}
	if c.version == "" {
		c.version = DefaultDriverVersion
	}
	if !versionRE.MatchString(c.version) {
		return nil, fmt.Errorf("simnode: invalid driver version %q", c.version)
	}
	if c.cudaVersion == 0 {
		c.cudaVersion = DefaultCUDAVersion
	}
	if c.cudaVersion < 0 {
		return nil, fmt.Errorf("simnode: invalid CUDA version %d", c.cudaVersion)
	}
	if c.layout == "" {
		c.layout = LayoutRHEL
	}
	a, err := archOf(opts.Arch)
	if err != nil {
		return nil, err
	}
	c.arch = a
	if c.libDir = c.layout.LibDir(c.arch.name); c.libDir == "" {
		return nil, fmt.Errorf("simnode: unknown layout %q", c.layout)
	}
	if c.uvmMajor == 0 {
		c.uvmMajor = DefaultUVMMajor
	}
	if c.uvmMajor < 1 || c.uvmMajor > 4095 || c.uvmMajor == nvidiaMajor {
		return nil, fmt.Errorf("simnode: invalid nvidia-uvm major %d", c.uvmMajor)
	}
	gpus, err := buildGPUs(opts)
	if err != nil {
		return nil, err
	}
	c.gpus = gpus
	return c, nil
}

// buildGPUs returns the GPU list, sorted by bus id, with Index set.
func buildGPUs(opts Options) ([]GPU, error) {
	var gpus []GPU
	autoMinors := true
	if opts.GPUs != nil {
		gpus = append([]GPU(nil), opts.GPUs...)
		for _, g := range gpus {
			if g.Minor != 0 {
				autoMinors = false
			}
		}
	} else {
		n := opts.NumGPUs
		if n == 0 {
			n = DefaultNumGPUs
		}
		if n < 0 || n > 254 {
			return nil, fmt.Errorf("simnode: invalid number of GPUs %d", n)
		}
		for i := 0; i < n; i++ {
			gpus = append(gpus, GPU{BusID: DefaultBusID(i)})
		}
	}
	seenBus := map[string]bool{}
	for i := range gpus {
		g := &gpus[i]
		bus := strings.ToLower(strings.TrimSpace(g.BusID))
		if !busIDRE.MatchString(bus) {
			return nil, fmt.Errorf("simnode: invalid bus id %q", g.BusID)
		}
		if len(bus) == len("00000000:00:00.0") {
			if bus[:4] != "0000" {
				return nil, fmt.Errorf("simnode: PCI domain of %q does not fit in 4 digits", g.BusID)
			}
			bus = bus[4:]
		}
		if seenBus[bus] {
			return nil, fmt.Errorf("simnode: duplicate bus id %q", bus)
		}
		seenBus[bus] = true
		g.BusID = bus
		if g.UUID == "" {
			g.UUID = UUIDFor(bus)
		}
		if !uuidRE.MatchString(strings.ToLower(g.UUID)) {
			return nil, fmt.Errorf("simnode: invalid GPU UUID %q", g.UUID)
		}
		g.UUID = "GPU-" + strings.ToLower(g.UUID[4:])
		if g.Model == "" {
			g.Model = DefaultModel
		}
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].BusID < gpus[j].BusID })
	seenMinor := map[int]bool{}
	for i := range gpus {
		gpus[i].Index = i
		if autoMinors {
			gpus[i].Minor = i
			if opts.SwapMinors {
				gpus[i].Minor = len(gpus) - 1 - i
			}
		}
		m := gpus[i].Minor
		if m < 0 || m > 253 {
			return nil, fmt.Errorf("simnode: GPU %s: device minor %d out of range 0..253", gpus[i].BusID, m)
		}
		if seenMinor[m] {
			return nil, fmt.Errorf("simnode: duplicate device minor %d", m)
		}
		seenMinor[m] = true
	}
	return gpus, nil
}

// Generate lays out a simulated NVIDIA node under root (created if needed)
// and returns what it laid out. Generating into a tree that already holds a
// node of the same driver version overwrites it in place.
func Generate(root string, opts Options) (*Node, error) {
	c, err := normalize(opts)
	if err != nil {
		return nil, err
	}
	root, err = filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if err := layoutBase(root); err != nil {
		return nil, err
	}
	n := &Node{
		Root:          root,
		GPUs:          c.gpus,
		DriverVersion: c.version,
		Arch:          c.arch.name,
		LibDir:        c.libDir,
		UVMMajor:      c.uvmMajor,
		Files:         []File{},
	}
	if err := writeKernel(n, c); err != nil {
		return nil, err
	}
	// The simulated NVML's state: the GPUs, without MIG (SetMIG changes
	// it), so that NVML and the kernel agree as on a real node.
	if err := n.WriteNVMLState(NVMLState{}); err != nil {
		return nil, err
	}
	if !c.noDriver {
		files, err := writeDriver(root, c)
		if err != nil {
			return nil, err
		}
		n.Files = files
		if err := buildLDCache(root, c); err != nil {
			return nil, err
		}
	}
	if c.ipc {
		if err := writeIPC(root); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Upgrade lays out a second driver version into an existing node like a
// driver upgrade followed by a module reload does: new libraries, binaries
// and firmware, new version files (/proc and /sys), an ld.so.cache pointing
// at the new libraries, and the files of the old version (listed in
// n.Files) removed together with the symlinks that pointed at them.
//
// opts supplies CUDAVersion, CacheDir and NVMLWithoutProps; its Layout
// must be empty or match n.LibDir, and its GPU, UVM and device-node fields
// are ignored (the GPUs of n stay as they are). With opts.NoDriver the old driver files are removed and
// no new ones are laid out. n itself is not modified; the returned Node
// describes the upgraded tree.
func Upgrade(n *Node, newVersion string, opts Options) (*Node, error) {
	if n == nil || n.Root == "" {
		return nil, errors.New("simnode: Upgrade of a nil node")
	}
	layout := LayoutRHEL
	if n.LibDir == LayoutDebian.LibDir(n.Arch) {
		layout = LayoutDebian
	} else if n.LibDir != LayoutRHEL.LibDir(n.Arch) {
		return nil, fmt.Errorf("simnode: node has unknown library directory %q", n.LibDir)
	}
	if opts.Layout != "" && opts.Layout != layout {
		return nil, fmt.Errorf("simnode: cannot upgrade a %s node with layout %s", layout, opts.Layout)
	}
	c, err := normalize(Options{
		GPUs:          n.GPUs,
		DriverVersion: newVersion,
		CUDAVersion:   opts.CUDAVersion,
		Layout:        layout,
		Arch:          n.Arch,
		UVMMajor:      n.UVMMajor,
		NoDriver:      opts.NoDriver,
		CacheDir:      opts.CacheDir,
		// An upgrade may bring the property functions, or lose them.
		NVMLWithoutProps: opts.NVMLWithoutProps,
	})
	if err != nil {
		return nil, err
	}
	c.gpus = append([]GPU(nil), n.GPUs...) // keep indexes and minors exactly
	out := &Node{
		Root:          n.Root,
		GPUs:          c.gpus,
		DriverVersion: c.version,
		Arch:          n.Arch,
		LibDir:        n.LibDir,
		UVMMajor:      n.UVMMajor,
		Files:         []File{},
	}
	if err := writeVersionFiles(out.Root, c); err != nil {
		return nil, err
	}
	if err := writeGPUInfo(out.Root, c, false); err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	if !c.noDriver {
		files, err := writeDriver(out.Root, c)
		if err != nil {
			return nil, err
		}
		out.Files = files
		for _, f := range files {
			keep[f.Path] = true
		}
	}
	if err := removeOldDriver(out.Root, n, keep); err != nil {
		return nil, err
	}
	if !c.noDriver {
		// Rebuild the cache now that the old libraries are gone.
		if err := buildLDCache(out.Root, c); err != nil {
			return nil, err
		}
	} else if err := os.Remove(filepath.Join(out.Root, "etc", "ld.so.cache")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return out, nil
}
