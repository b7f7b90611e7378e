// Package discover finds what an NVIDIA node offers (GPUs, device nodes,
// driver files per capability, driver and kernel versions) in procfs,
// devfs and the driver's files, without NVML, and returns it as an
// inventory.Snapshot. It is the only code that reads the host for NVIDIA
// devices; every path it follows is resolved inside the host or driver
// root, so a hostile symbolic link cannot lead it elsewhere.
package discover

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/nri-gpu/nri-gpu/inventory"
	"golang.org/x/sys/unix"
)

// Options say where discovery reads the node.
type Options struct {
	// HostRoot is the prefix under which the host's /proc and /dev are
	// read ("/" on the host, "/host" in a container with the host mounted
	// there).
	HostRoot string
	// DriverRoot is the root of the driver's user-space files as the
	// runtime sees it; mount sources are paths under it.
	DriverRoot string
	// DriverRootMount is where this process reads DriverRoot, when that
	// differs from the runtime's view; empty means DriverRoot.
	DriverRootMount string
	// MPSPipeDir is the MPS control daemon's pipe directory, as
	// nri-gpu's own environment names it (CUDA_MPS_PIPE_DIRECTORY, as
	// libnvidia-container reads it from its own environment): an absolute
	// path under the driver root; empty means inventory.DefaultMPSPipeDir.
	MPSPipeDir string
}

// maxSmallFile bounds what is read of a procfs or sysfs file.
const maxSmallFile = 64 << 10

// maxLDCache bounds what is read of ld.so.cache. Real ones are a few
// hundred KiB (this repository's CI host: 33 KiB; a desktop with every
// package of its distribution: under 1 MiB); a larger cache is refused
// before it is read. Parsing one costs up to about twice its size again
// (its string table copied once, the entries, sorted offsets), so a
// hostile cache costs discovery at most about 12 MiB, well within the
// DaemonSet's 64 MiB limit (GOMEMLIMIT 48 MiB) next to the plugin's own
// few MiB.
const maxLDCache = 4 << 20

// Discover reads the node and returns its snapshot. A node without GPUs or
// without a driver is a valid, empty snapshot with a warning; an error is
// returned only when a root cannot be opened at all.
func Discover(opts Options) (*inventory.Snapshot, error) {
	if opts.HostRoot == "" {
		opts.HostRoot = "/"
	}
	if opts.DriverRoot == "" {
		opts.DriverRoot = "/"
	}
	if opts.DriverRootMount == "" {
		opts.DriverRootMount = opts.DriverRoot
	}
	host, err := os.OpenRoot(opts.HostRoot)
	if err != nil {
		return nil, fmt.Errorf("opening hostRoot: %w", err)
	}
	defer host.Close()
	drv, err := os.OpenRoot(opts.DriverRootMount)
	if err != nil {
		return nil, fmt.Errorf("opening driverRoot: %w", err)
	}
	defer drv.Close()

	d := &discovery{host: host, drv: drv, mps: inventory.DefaultMPSPipeDir, snap: &inventory.Snapshot{
		HostRoot:   opts.HostRoot,
		DriverRoot: opts.DriverRoot,
	}}
	if opts.MPSPipeDir != "" {
		if p := path.Clean(opts.MPSPipeDir); p != opts.MPSPipeDir || !path.IsAbs(p) || p == "/" || len(p) > 1024 {
			d.warnf("%s=%q is not a clean absolute directory (such as %s): looking for the MPS pipe directory at %s", inventory.EnvMPSPipeDir, opts.MPSPipeDir, inventory.DefaultMPSPipeDir, inventory.DefaultMPSPipeDir)
		} else {
			d.mps = p
		}
	}
	d.kernel()
	if d.snap.DriverVersion != "" {
		d.driverFiles()
	}
	return d.snap, nil
}

// discovery holds the state of one Discover call.
type discovery struct {
	host, drv *os.Root
	mps       string // the MPS pipe directory (Options.MPSPipeDir)
	snap      *inventory.Snapshot
	dirCache  map[string][]string
}

// maxWarnings bounds the warnings of one discovery. A hostile driver root
// can make every candidate file a warning of up to 8 KiB (two paths of up
// to 4 KiB); real nodes have a handful.
const maxWarnings = 200

// Bounds of the files read for one library of one class, so that a
// hostile ld.so.cache, which can name 65,536 paths each costing up to 256
// lookups to resolve, costs a bounded amount, and cannot hide the files of
// the usual directories behind its own.
const (
	// maxCacheCandidates bounds the paths taken from ld.so.cache: a
	// real cache names two or three per library and class (the SONAME
	// link, the development link).
	maxCacheCandidates = 16
	// maxCandidates bounds the paths read in all, ld.so.cache's and the
	// usual directories' (where older versions may be left behind).
	maxCandidates = 64
)

func (d *discovery) warnf(format string, args ...any) {
	d.warn(fmt.Sprintf(format, args...))
}

// warn records a warning and reports whether it was kept.
func (d *discovery) warn(msg string) bool {
	switch len(d.snap.Warnings) {
	case maxWarnings:
		d.snap.Warnings = append(d.snap.Warnings, fmt.Sprintf("more than %d warnings: the rest are left out", maxWarnings))
		return false
	case maxWarnings + 1:
		return false
	}
	d.snap.Warnings = append(d.snap.Warnings, msg)
	return true
}

// deviceWarnf records a warning about the device nodes or the GPU list
// (also among all warnings).
func (d *discovery) deviceWarnf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if d.warn(msg) {
		d.snap.DeviceWarnings = append(d.snap.DeviceWarnings, msg)
	}
}

// kernel discovers the driver version, the majors, the GPUs and the
// control nodes.
func (d *discovery) kernel() {
	s := d.snap
	data, err := readSmall(d.host, "proc/driver/nvidia/version")
	if errors.Is(err, fs.ErrNotExist) {
		data, err = readSmall(d.host, "sys/module/nvidia/version")
	}
	if err != nil {
		d.warnf("no NVIDIA kernel driver loaded (%v): the node offers no GPU", err)
		return
	}
	if s.DriverVersion, err = ParseDriverVersion(data); err != nil {
		d.warnf("reading the driver version: %v: the node offers no GPU", err)
		return
	}
	if data, err := readSmall(d.host, "proc/sys/kernel/osrelease"); err != nil {
		d.warnf("reading the kernel release: %v", err)
	} else {
		s.KernelRelease = strings.TrimSpace(string(data))
	}

	data, err = readSmall(d.host, "proc/devices")
	if err != nil {
		d.warnf("reading /proc/devices: %v: the node offers no GPU", err)
		return
	}
	majors, err := ParseProcDevices(data)
	if err != nil {
		d.warnf("%v: the node offers no GPU", err)
		return
	}
	nvMajor, ok := majors["nvidia-frontend"]
	if !ok {
		nvMajor, ok = majors["nvidia"]
	}
	if !ok {
		d.warnf("/proc/devices lists no nvidia major: the node offers no GPU")
		return
	}

	s.Control.Ctl = d.node("/dev/nvidiactl", nvMajor, 255)
	if s.Control.Ctl == nil {
		d.deviceWarnf("/dev/nvidiactl is missing: the node offers no GPU")
		return
	}
	s.Control.Modeset = d.node("/dev/nvidia-modeset", nvMajor, 254)
	if uvm, ok := majors["nvidia-uvm"]; ok {
		s.Control.UVM = d.node("/dev/nvidia-uvm", uvm, 0)
		s.Control.UVMTools = d.node("/dev/nvidia-uvm-tools", uvm, 1)
	}
	if s.Control.UVM == nil {
		d.deviceWarnf("nvidia-uvm is not loaded or /dev/nvidia-uvm is missing: compute requests get no UVM nodes")
	}
	drmMajor, ok := majors["drm"]
	if !ok {
		drmMajor = -1
	}
	d.gpus(nvMajor, drmMajor)
	d.imexChannels(majors)
}

// gpus discovers the GPUs under /proc/driver/nvidia/gpus. The index is the
// position in bus order among the GPUs that are not excluded; a GPU that
// cannot be used keeps its index so that the others keep theirs. It is
// one piece on purpose: one pass over the directory whose checks of a GPU
// (information file, bus id, device node, DRM nodes) each warn and skip
// it in place.
func (d *discovery) gpus(nvMajor, drmMajor int64) {
	dir, err := openNoBlock(d.host, "proc/driver/nvidia/gpus")
	if err != nil {
		d.deviceWarnf("listing GPUs: %v: the node offers no GPU", err)
		return
	}
	entries, err := dir.ReadDir(-1)
	dir.Close()
	if err != nil {
		d.deviceWarnf("listing GPUs: %v: the node offers no GPU", err)
		return
	}
	type found struct {
		bus  string
		info GPUInfo
		err  error
	}
	var all []found
	for _, e := range entries {
		bus, err := inventory.NormalizeBusID(e.Name())
		if err != nil {
			d.warnf("ignoring /proc/driver/nvidia/gpus/%s: not a PCI bus id", e.Name())
			continue
		}
		f := found{bus: bus}
		data, err := readSmall(d.host, path.Join("proc/driver/nvidia/gpus", e.Name(), "information"))
		if err == nil {
			f.info, err = ParseGPUInformation(data)
		}
		if err == nil && f.info.BusID != "" && f.info.BusID != bus {
			err = fmt.Errorf("the Bus Location %s differs from its directory", f.info.BusID)
		}
		f.err = err
		all = append(all, f)
	}
	slices.SortFunc(all, func(a, b found) int { return cmp.Compare(a.bus, b.bus) })

	index := 0
	seenMinor := map[int]string{}
	for _, f := range all {
		if f.err != nil {
			d.warnf("GPU %s (index %d): unusable: %v", f.bus, index, f.err)
			index++
			continue
		}
		if f.info.Excluded {
			d.warnf("GPU %s (%s) is excluded by the driver: not offered", f.bus, f.info.UUID)
			continue
		}
		i := index
		index++
		if other, dup := seenMinor[f.info.Minor]; dup {
			d.warnf("GPU %s (index %d): Device Minor %d is also used by %s: unusable", f.bus, i, f.info.Minor, other)
			continue
		}
		seenMinor[f.info.Minor] = f.bus
		n := d.node(fmt.Sprintf("/dev/nvidia%d", f.info.Minor), nvMajor, int64(f.info.Minor))
		if n == nil {
			d.deviceWarnf("GPU %s (index %d): device node /dev/nvidia%d is missing or wrong: unusable", f.bus, i, f.info.Minor)
			continue
		}
		var drm *inventory.DRMNodes
		if card, render := d.drmNodes(f.bus, drmMajor); card.Path != "" || render.Path != "" {
			drm = &inventory.DRMNodes{Card: card, Render: render}
		}
		d.snap.GPUs = append(d.snap.GPUs, inventory.GPU{
			Index: i,
			Minor: f.info.Minor,
			UUID:  strings.ToUpper(f.info.UUID[:3]) + "-" + strings.ToLower(f.info.UUID[4:]),
			BusID: f.bus,
			Model: f.info.Model,
			Node:  *n,
			// NUMANode from sysfs; -1 where it says nothing.
			NUMANode: d.numaNode(f.bus),
			DRM:      drm,
		})
	}
	if len(all) == 0 {
		d.deviceWarnf("the driver lists no GPU: the node offers no GPU")
	}
}

// numaNode returns the NUMA node of the PCI device at bus, from
// /sys/bus/pci/devices/<bus>/numa_node under hostRoot, or
// inventory.NoNUMANode when sysfs has no such file (a container without
// /sys, a simulated node) or says -1 (a machine without NUMA). A value
// that is not a small integer is a warning, and unknown.
func (d *discovery) numaNode(bus string) int {
	rel := path.Join("sys/bus/pci/devices", bus, "numa_node")
	data, err := readSmall(d.host, rel)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			d.warnf("GPU %s: NUMA node unknown: %v", bus, err)
		}
		return inventory.NoNUMANode
	}
	n, err := ParseNUMANode(data)
	if err != nil {
		d.warnf("GPU %s: NUMA node unknown: /%s: %v", bus, rel, err)
		return inventory.NoNUMANode
	}
	return n
}

// ParseNUMANode parses a sysfs numa_node file: a decimal integer from -1
// (no NUMA node) to 1023, and a newline.
func ParseNUMANode(data []byte) (int, error) {
	s := strings.TrimSpace(string(data))
	n, err := strconv.Atoi(s)
	if err != nil || n < -1 || n > maxNUMANode {
		return inventory.NoNUMANode, fmt.Errorf("%q is not a NUMA node (valid: -1 to %d)", truncate(s, 32), maxNUMANode)
	}
	return n, nil
}

// maxNUMANode bounds a NUMA node number (the kernel's default
// CONFIG_NODES_SHIFT allows at most 1024 nodes).
const maxNUMANode = 1023

// node returns the device node at p (under hostRoot) when it is a
// character device with the expected numbers, or nil. Its permission bits
// are taken over as the container node's mode.
func (d *discovery) node(p string, major, minor int64) *inventory.DeviceNode {
	n, err := CharDevice(d.host, p)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			d.deviceWarnf("%v", err)
		}
		return nil
	}
	if n.Major != major || n.Minor != minor {
		d.deviceWarnf("%s is %d:%d, expected %d:%d", p, n.Major, n.Minor, major, minor)
		return nil
	}
	return &n
}

// CharDevice returns the character device node at p (an absolute path,
// looked up under root without following a final symbolic link), with the
// host node's numbers and permission bits.
func CharDevice(root *os.Root, p string) (inventory.DeviceNode, error) {
	fi, err := root.Lstat(strings.TrimPrefix(path.Clean(p), "/"))
	if err != nil {
		return inventory.DeviceNode{}, err
	}
	if fi.Mode()&fs.ModeCharDevice == 0 {
		return inventory.DeviceNode{}, fmt.Errorf("%s is not a character device", p)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return inventory.DeviceNode{}, fmt.Errorf("%s: no device number", p)
	}
	return inventory.DeviceNode{Path: p, Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev)), Mode: uint32(fi.Mode().Perm())}, nil
}

// driverFiles discovers libraries, binaries and firmware under the driver
// root.
func (d *discovery) driverFiles() {
	var cache []LDCacheEntry
	data, err := readLimited(d.drv, "etc/ld.so.cache", maxLDCache)
	if err == nil {
		cache, err = ParseLDCache(data)
	}
	if err != nil {
		d.warnf("reading ld.so.cache of the driver root: %v: searching the usual directories only", err)
	}

	for _, c := range inventory.AllCapabilities.List() {
		for _, base := range libraryNames[c] {
			if f, ok := d.library(cache, base, c, true); ok {
				d.snap.Files = append(d.snap.Files, f)
			}
			if f, ok := d.library(cache, base, c, false); ok {
				d.snap.Files = append(d.snap.Files, f)
			}
		}
		for _, name := range binaryNames[c] {
			if f, ok := d.binary(name, c); ok {
				d.snap.Files = append(d.snap.Files, f)
			}
		}
	}
	for _, dir := range firmwareDirs {
		rel := path.Join(dir, "nvidia", d.snap.DriverVersion)
		resolved, err := resolveInRoot(d.drv, rel)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				d.warnf("skipping /%s: %v", rel, err)
			}
			continue
		}
		if fi, err := d.drv.Stat(resolved); err == nil && fi.IsDir() {
			d.snap.Files = append(d.snap.Files, inventory.DriverFile{
				Kind: inventory.FirmwareDir, HostPath: d.hostPath(resolved), Name: d.snap.DriverVersion,
			})
			break
		}
	}

	d.configs()
	d.ipcs()

	if !slices.ContainsFunc(d.snap.Files, func(f inventory.DriverFile) bool { return f.Kind == inventory.Library }) {
		d.warnf("no driver library found under driverRoot %s: containers get device nodes only", d.snap.DriverRoot)
	}
	slices.SortStableFunc(d.snap.Files, func(a, b inventory.DriverFile) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name))
	})
}

// library finds the library named base ("libcuda.so") of the wanted class.
// Candidates come from ld.so.cache, then from the usual directories; the
// first one that resolves inside the driver root to a shared object whose
// SONAME starts with base wins, preferring a file of the driver's version.
// It is one piece on purpose: the candidates' order and the checks each
// passes (resolved in the root, class, SONAME, version) read as one
// search.
func (d *discovery) library(cache []LDCacheEntry, base string, c inventory.Capability, want64 bool) (inventory.DriverFile, bool) {
	var candidates []string
	prefix := base + "."
	for _, e := range cache {
		if (e.Name == base || strings.HasPrefix(e.Name, prefix)) &&
			(want64 && e.Is64Bit() || !want64 && e.Is32Bit()) {
			if len(candidates) == maxCacheCandidates {
				d.warnf("ld.so.cache of the driver root names more than %d files for %s (%s): the rest are not read", maxCacheCandidates, base, classOf(want64))
				break
			}
			candidates = append(candidates, e.Path)
		}
	}
	dirs := libraryDirs
	if !want64 {
		dirs = compat32Dirs
	}
	for _, dir := range dirs {
		for _, name := range d.readDir(dir) {
			if strings.HasPrefix(name, base+".") {
				candidates = append(candidates, "/"+path.Join(dir, name))
			}
		}
	}

	var best *inventory.DriverFile
	bestVersioned := false
	seen := map[string]bool{}
	read := 0
	for _, cand := range candidates {
		cand = path.Clean(cand)
		if seen[cand] {
			continue
		}
		seen[cand] = true
		if read++; read > maxCandidates {
			d.warnf("the library directories of the driver root hold more than %d files for %s (%s): the rest are not read", maxCandidates, base, classOf(want64))
			break
		}
		rel, err := resolveInRoot(d.drv, strings.TrimPrefix(cand, "/"))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				d.warnf("skipping %s: %v", cand, err)
			}
			continue
		}
		if seen["/"+rel] && "/"+rel != cand {
			continue
		}
		seen["/"+rel] = true
		info, err := readELF(d.drv, rel)
		if err != nil {
			d.warnf("skipping %s (resolved to /%s in the driver root): %v", cand, rel, err)
			continue
		}
		if info.Is64 != want64 {
			continue
		}
		if !strings.HasPrefix(info.SONAME, base+".") || strings.Contains(info.SONAME, "/") {
			d.warnf("skipping %s: SONAME %q does not belong to %s", cand, info.SONAME, base)
			continue
		}
		versioned := strings.HasSuffix(path.Base(rel), "."+d.snap.DriverVersion)
		if best != nil && (bestVersioned || !versioned) {
			continue
		}
		kind := inventory.Library
		if !want64 {
			kind = inventory.Library32
		}
		best = &inventory.DriverFile{Kind: kind, Capability: c, HostPath: d.hostPath(rel), Name: info.SONAME, OwnVersion: unversionedLibraries[base]}
		bestVersioned = versioned
	}
	if best == nil {
		return inventory.DriverFile{}, false
	}
	if !bestVersioned && !unversionedLibraries[base] {
		d.warnf("%s does not carry the kernel module's version %s: the driver install may be broken", best.HostPath, d.snap.DriverVersion)
	}
	return *best, true
}

// classOf names the class of library wanted.
func classOf(want64 bool) string {
	if want64 {
		return "64-bit"
	}
	return "32-bit"
}

// binary finds the driver binary name in the usual directories.
func (d *discovery) binary(name string, c inventory.Capability) (inventory.DriverFile, bool) {
	for _, dir := range binaryDirs {
		rel, err := resolveInRoot(d.drv, path.Join(dir, name))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				d.warnf("skipping /%s: %v", path.Join(dir, name), err)
			}
			continue
		}
		fi, err := d.drv.Stat(rel)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		return inventory.DriverFile{Kind: inventory.Binary, Capability: c, HostPath: d.hostPath(rel), Name: name}, true
	}
	return inventory.DriverFile{}, false
}

// readDir lists a directory of the driver root once per discovery.
func (d *discovery) readDir(dir string) []string {
	if names, ok := d.dirCache[dir]; ok {
		return names
	}
	if d.dirCache == nil {
		d.dirCache = map[string][]string{}
	}
	var names []string
	if f, err := openNoBlock(d.drv, dir); err == nil {
		names, _ = f.Readdirnames(-1)
		f.Close()
	}
	slices.Sort(names)
	d.dirCache[dir] = names
	return names
}

// hostPath returns the runtime's path of rel under the driver root.
func (d *discovery) hostPath(rel string) string {
	return filepath.Join(d.snap.DriverRoot, rel)
}

func readSmall(root *os.Root, rel string) ([]byte, error) {
	return readLimited(root, rel, maxSmallFile)
}

// readLimited reads at most limit bytes of a file under root; a longer
// file is an error rather than silently cut. A file whose size says it is
// longer is refused before it is read; one whose size says nothing (procfs
// files are 0 bytes) is read up to limit+1 bytes.
func readLimited(root *os.Root, rel string, limit int64) ([]byte, error) {
	f, err := openNoBlock(root, rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", rel, fi.Mode().Type())
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes (%d)", rel, limit, fi.Size())
	}
	// Sized by the file when it says its size, so that reading a cache
	// of n bytes allocates n, not the 2n to 3n of a growing buffer.
	buf := make([]byte, 0, max(fi.Size(), 512)+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, fmt.Errorf("%s: larger than %d bytes", rel, limit)
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
