// Package adjust computes the container edits that give a container a set
// of devices and driver capabilities, and turns them into an NRI container
// adjustment. Edits come from a Source, the one interface through which
// the request path knows the node's devices: Prepared is the source of
// NVIDIA GPUs (an inventory snapshot with each driver file's place in a
// container worked out once), package cdisource the source of another
// vendor's CDI devices. It knows nothing of where a request came from;
// everything here is pure.
package adjust

import (
	"cmp"
	"path"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Environment variables the adjustment sets.
const (
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	EnvLibraryPath    = "LD_LIBRARY_PATH"
	EnvPath           = "PATH"
)

// DefaultPath is the PATH a container without one gets, with the binary
// directory appended: containerd's default for containers whose image sets
// none, so that setting PATH does not take the usual directories away.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// mountOptions are the options of every driver mount: read-only, no
// set-uid, no devices, and no propagation back to the host. Shared by all
// mounts, never modified.
var mountOptions = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}

// ipcMountOptions are the options of the driver daemons' sockets and the
// MPS pipe directory, the NVIDIA Container Toolkit's: writable (a client
// connects, MPS creates its pipes), no set-uid, no devices, no execution.
var ipcMountOptions = []string{"nosuid", "nodev", "rbind", "rprivate", "noexec"}

// Layout says where driver files appear in a container, and how they get
// there.
type Layout struct {
	// LibraryDir holds the 64-bit driver libraries under their SONAMEs.
	LibraryDir string
	// Library32Dir holds the 32-bit libraries of compat32.
	Library32Dir string
	// HostLibraryDirs, when set, maps each set of library-bearing
	// capabilities to a host directory that holds exactly the 64-bit
	// libraries of that set under their SONAMEs (see package libcache):
	// the directory is mounted whole at LibraryDir, one mount instead of
	// one per library. Nil means one mount per library.
	HostLibraryDirs map[inventory.Capabilities]string
	// HostLibrary32Dirs does the same for the 32-bit libraries.
	HostLibrary32Dirs map[inventory.Capabilities]string
	// BinaryDir, when set, is where binaries appear instead of /usr/bin;
	// it is appended to the container's PATH.
	BinaryDir string
	// HostBinaryDirs maps each set of binary-bearing capabilities to a
	// host directory holding exactly that set's binaries, mounted whole at
	// BinaryDir (only with BinaryDir set). Nil means one mount per binary.
	HostBinaryDirs map[inventory.Capabilities]string
	// HostGPUSets maps sets of GPUs (the mask of their device minors) to
	// files prepared on the host for graphics and display containers:
	// the application profile that limits EGL and Vulkan to the set's
	// GPUs, mounted at ProfileDestination, and a directory of the set's
	// /dev/dri/by-path links, mounted at /dev/dri/by-path. A set without
	// an entry goes without them.
	HostGPUSets map[uint64]GPUSetFiles
	// SkipFirmware leaves the GSP firmware directory out of every
	// container, for kernels that read firmware from the host's mount
	// namespace whoever opens the GPU.
	SkipFirmware bool
}

// GPUSetFiles are the host files prepared for one set of GPUs; an empty
// path is none.
type GPUSetFiles struct {
	Profile string
	ByPath  string
}

// ProfileDestination is where a container finds its application profile:
// the NVIDIA driver reads every file of this directory, and the NVIDIA
// Container Toolkit's update-application-profile hook writes this one.
const ProfileDestination = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"

// ByPathDestination is where a container finds its GPUs' by-path links.
const ByPathDestination = "/dev/dri/by-path"

// Edits are the changes that give a container its GPUs. Mounts and
// LibraryDirs may be shared with other requests' edits: replace them,
// never write into them.
type Edits struct {
	Devices []inventory.DeviceNode
	Mounts  []inventory.Mount
	// VisibleDevices is the value of NVIDIA_VISIBLE_DEVICES: the UUIDs of
	// the GPUs, or "none" when the container gets the driver only.
	VisibleDevices string
	// LibraryDirs are the container directories of driver libraries,
	// to be searched by the dynamic loader.
	LibraryDirs []string
	// BinaryDirs are the container directories of driver binaries that
	// must be on PATH (empty when binaries are at /usr/bin).
	BinaryDirs []string
	// Files counts the driver files the container gets (a prepared
	// library directory counts for the libraries it holds).
	Files int
	// Env are further KEY=VALUE settings (from CDI specs), set as given.
	Env []string
	// DefaultEnv are KEY=VALUE settings made only where the container's
	// environment lacks KEY (GBM_BACKENDS_PATH with graphics).
	DefaultEnv []string
	// Hooks are OCI hooks from CDI specs, with their explicit env.
	Hooks []inventory.Hook
	// plan is where Mounts came from, if they did.
	plan *plan
}

// Prepared is a snapshot's driver files with their container paths worked
// out once per snapshot and layout, so that requests only pick from it.
// Like the snapshot, it is never modified once made.
type Prepared struct {
	snap *inventory.Snapshot
	// units are what is handed out: GPUs without MIG, MIG devices.
	units  []inventory.GPU
	files  []preparedFile
	layout Layout
	// present64 and present32 are the capabilities that have libraries
	// of each class, presentBin those that have binaries.
	present64, present32, presentBin inventory.Capabilities
	// plans holds, for every set of capabilities, the mounts (and what
	// goes with them) it gets: worked out once, shared by every request
	// of that set, never modified.
	plans [1 << 7]plan
}

// plan is the file part of the edits of one set of capabilities.
type plan struct {
	mounts  []inventory.Mount
	libDirs []string
	binDirs []string
	// usrBin are the binaries one by one at /usr/bin, for a container
	// whose PATH cannot be extended (see PathRepeated); set only with
	// binDirs.
	usrBin []inventory.Mount
	env    []string
	files  int
	// api are mounts as NRI messages, shared by every adjustment of the
	// set: adjustments are only marshalled, never modified, so the
	// messages are built once per snapshot instead of once per request.
	api []*api.Mount
}

type preparedFile struct {
	kind  inventory.FileKind
	cap   inventory.Capability
	mount inventory.Mount
	// devLink marks the second mount of a library under its development
	// name (libcuda.so), which a prepared directory holds as a link.
	devLink bool
	// extra marks a file below the library directory under a name of its
	// own (inventory.LibraryExtras), which a prepared directory holds.
	extra bool
}

// Prepare computes where each driver file of the snapshot goes in a
// container with layout l: libraries under their SONAMEs in the layout's
// library directories (with libcuda.so beside libcuda.so.1), binaries in
// /usr/bin or the layout's binary directory, the firmware directory at
// /lib/firmware/nvidia/<version> unless the layout skips it.
func Prepare(snap *inventory.Snapshot, l Layout) *Prepared {
	p := &Prepared{snap: snap, layout: l, units: snap.Units()}
	for _, f := range snap.Files {
		switch f.Kind {
		case inventory.Library:
			p.present64 |= inventory.Capabilities(f.Capability)
		case inventory.Library32:
			p.present32 |= inventory.Capabilities(f.Capability)
		case inventory.Binary:
			p.presentBin |= inventory.Capabilities(f.Capability)
		}
		var dst string
		switch f.Kind {
		case inventory.Library:
			dst = path.Join(l.LibraryDir, f.Name)
		case inventory.Library32:
			dst = path.Join(l.Library32Dir, f.Name)
		case inventory.Binary:
			dst = path.Join(cmp.Or(l.BinaryDir, "/usr/bin"), f.Name)
		case inventory.FirmwareDir:
			if l.SkipFirmware {
				continue
			}
			dst = path.Join("/lib/firmware/nvidia", f.Name)
		case inventory.Config:
			dst = f.Name
		case inventory.Socket:
			p.files = append(p.files, preparedFile{kind: f.Kind, cap: f.Capability, mount: inventory.Mount{
				Source: f.HostPath, Destination: f.Name, Type: "bind", Options: ipcMountOptions,
			}})
			continue
		default:
			continue
		}
		p.files = append(p.files, preparedFile{kind: f.Kind, cap: f.Capability, mount: inventory.Mount{Source: f.HostPath, Destination: dst}})
		if dev, ok := inventory.DevLink(f.Name); ok && (f.Kind == inventory.Library || f.Kind == inventory.Library32) {
			// One mount per file: the same file again under the name
			// -lcuda searches for.
			p.files = append(p.files, preparedFile{kind: f.Kind, cap: f.Capability, devLink: true,
				mount: inventory.Mount{Source: f.HostPath, Destination: path.Join(path.Dir(dst), dev)}})
		}
	}
	for _, x := range inventory.LibraryExtras(snap.Files) {
		p.files = append(p.files, preparedFile{kind: inventory.Library, cap: x.Capability, extra: true,
			mount: inventory.Mount{Source: x.File.HostPath, Destination: path.Join(l.LibraryDir, x.Name)}})
	}
	for caps := range p.plans {
		p.plans[caps] = p.plan(inventory.Capabilities(caps))
	}
	return p
}

// plan works out the mounts of a set of capabilities.
func (p *Prepared) plan(caps inventory.Capabilities) plan {
	var pl plan
	// Whole prepared directories replace the libraries' own mounts.
	dir64, whole64 := p.layout.HostLibraryDirs[caps&p.present64]
	dir32, whole32 := p.layout.HostLibrary32Dirs[caps&p.present32]
	whole32 = whole32 && caps.Has(inventory.Compat32)
	dirBin, wholeBin := p.layout.HostBinaryDirs[caps&p.presentBin]
	wholeBin = wholeBin && p.layout.BinaryDir != ""

	var lib64, lib32, bin bool
	for i := range p.files {
		f := &p.files[i]
		if f.kind == inventory.Library32 && !caps.Has(inventory.Compat32) ||
			f.cap != 0 && !caps.Has(f.cap) {
			continue
		}
		if !f.devLink && !f.extra {
			pl.files++
		}
		if f.kind == inventory.Socket && f.cap == inventory.Compute && f.mount.Destination != inventory.DefaultMPSPipeDir {
			// The MPS pipe directory where CUDA_MPS_PIPE_DIRECTORY put
			// it on the host: libcuda looks at the default unless told.
			pl.env = append(pl.env, inventory.EnvMPSPipeDir+"="+f.mount.Destination)
		}
		if f.extra && path.Base(path.Dir(f.mount.Destination)) == "gbm" {
			// GBM searches its backends in the distribution's library
			// directory unless told otherwise.
			pl.env = append(pl.env, inventory.EnvGBMBackendsPath+"="+path.Dir(f.mount.Destination))
		}
		switch f.kind {
		case inventory.Library:
			lib64 = true
			if whole64 {
				continue
			}
		case inventory.Library32:
			lib32 = true
			if whole32 {
				continue
			}
		case inventory.Binary:
			bin = true
			if p.layout.BinaryDir != "" {
				pl.usrBin = append(pl.usrBin, inventory.Mount{Source: f.mount.Source, Destination: path.Join("/usr/bin", path.Base(f.mount.Destination))})
			}
			if wholeBin {
				continue
			}
		}
		pl.mounts = append(pl.mounts, f.mount)
	}
	if lib64 {
		if whole64 {
			pl.mounts = append(pl.mounts, inventory.Mount{Source: dir64, Destination: p.layout.LibraryDir})
		}
		pl.libDirs = append(pl.libDirs, p.layout.LibraryDir)
	}
	if lib32 {
		if whole32 {
			pl.mounts = append(pl.mounts, inventory.Mount{Source: dir32, Destination: p.layout.Library32Dir})
		}
		pl.libDirs = append(pl.libDirs, p.layout.Library32Dir)
	}
	if bin && p.layout.BinaryDir != "" {
		if wholeBin {
			pl.mounts = append(pl.mounts, inventory.Mount{Source: dirBin, Destination: p.layout.BinaryDir})
		}
		pl.binDirs = []string{p.layout.BinaryDir}
	} else {
		pl.usrBin = nil
	}
	// Full slice expressions: an append by a user of the edits copies
	// instead of writing into the shared plan.
	pl.mounts = pl.mounts[:len(pl.mounts):len(pl.mounts)]
	pl.libDirs = pl.libDirs[:len(pl.libDirs):len(pl.libDirs)]
	pl.env = pl.env[:len(pl.env):len(pl.env)]
	pl.api = apiMounts(pl.mounts)
	return pl
}

// apiMounts returns mounts as NRI messages.
func apiMounts(ms []inventory.Mount) []*api.Mount {
	msgs := make([]api.Mount, len(ms))
	out := make([]*api.Mount, len(ms))
	for i := range ms {
		m, src := &msgs[i], &ms[i]
		m.Source, m.Destination, m.Type, m.Options = src.Source, src.Destination, "bind", mountOptions
		if src.Type != "" {
			m.Type, m.Options = src.Type, src.Options
		}
		out[i] = m
	}
	return out[:len(out):len(out)]
}

// Snapshot returns the snapshot p was prepared from.
func (p *Prepared) Snapshot() *inventory.Snapshot { return p.snap }

// Edits returns the edits for the given GPUs and capabilities: the GPUs'
// device nodes, the control nodes the capabilities need, and bind mounts of
// the driver files of the capabilities.
func (p *Prepared) Edits(gpus []inventory.GPU, caps inventory.Capabilities) Edits {
	e := Edits{Devices: make([]inventory.DeviceNode, 0, len(gpus)+4)}
	for i := range gpus {
		g := &gpus[i]
		if g.MIG == nil {
			e.Devices = append(e.Devices, g.Node)
			continue
		}
		// A MIG device: its parent's node (once, whatever the
		// number of its MIG devices), its GPU and compute instance's
		// access capabilities.
		if !slices.ContainsFunc(gpus[:i], func(o inventory.GPU) bool { return o.Node == g.Node }) {
			e.Devices = append(e.Devices, g.Node)
		}
		if !slices.ContainsFunc(gpus[:i], func(o inventory.GPU) bool { return o.MIG != nil && o.MIG.GINode == g.MIG.GINode }) {
			e.Devices = append(e.Devices, g.MIG.GINode)
		}
		e.Devices = append(e.Devices, g.MIG.CINode)
	}
	c := p.snap.Control
	for _, n := range [...]struct {
		node *inventory.DeviceNode
		want bool
	}{
		{c.Ctl, true},
		{c.UVM, caps.Has(inventory.Compute)},
		{c.UVMTools, caps.Has(inventory.Compute)},
		{c.Modeset, caps.Has(inventory.Display)},
	} {
		if n.node != nil && n.want {
			e.Devices = append(e.Devices, *n.node)
		}
	}
	pl := &p.plans[caps&inventory.AllCapabilities]
	e.Mounts, e.LibraryDirs, e.BinaryDirs, e.Files, e.plan = pl.mounts, pl.libDirs, pl.binDirs, pl.files, pl
	e.DefaultEnv = pl.env

	if caps.Has(inventory.Graphics) || caps.Has(inventory.Display) {
		p.graphicsEdits(&e, gpus)
	}

	if len(gpus) == 0 {
		e.VisibleDevices = "none"
	} else {
		var b strings.Builder
		b.Grow(len(gpus) * 41)
		for i := range gpus {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(gpus[i].UUID)
		}
		e.VisibleDevices = b.String()
	}
	return e
}

// graphicsEdits adds what graphics and display containers get for their
// GPUs: the GPUs' DRM nodes (as the toolkit finds them by bus id: EGL and
// Vulkan open the render node, X.Org the card), and the set's prepared
// application profile and by-path links.
func (p *Prepared) graphicsEdits(e *Edits, gpus []inventory.GPU) {
	var mask uint64
	fits := len(gpus) > 0
	drm := false
	for i := range gpus {
		g := &gpus[i]
		if g.DRM != nil {
			drm = true
			for _, n := range [...]*inventory.DeviceNode{&g.DRM.Card, &g.DRM.Render} {
				if n.Path != "" {
					e.Devices = append(e.Devices, *n)
				}
			}
		}
		if g.Minor < 0 || g.Minor > 63 {
			fits = false
		} else {
			mask |= 1 << uint(g.Minor)
		}
	}
	set, ok := p.layout.HostGPUSets[mask]
	if !fits || !ok || set.Profile == "" && set.ByPath == "" {
		return
	}
	// A copy: the plan's mounts are shared.
	mounts := make([]inventory.Mount, len(e.Mounts), len(e.Mounts)+2)
	copy(mounts, e.Mounts)
	if set.Profile != "" {
		mounts = append(mounts, inventory.Mount{Source: set.Profile, Destination: ProfileDestination})
	}
	if set.ByPath != "" && drm {
		mounts = append(mounts, inventory.Mount{Source: set.ByPath, Destination: ByPathDestination})
	}
	e.Mounts = mounts
}

// Adjustment returns the NRI adjustment that applies the edits to a
// container whose environment is env. Each device node comes with its
// cgroup allow rule (the runtime adds it for every adjusted device). The
// library directories are appended to the container's own LD_LIBRARY_PATH,
// so that libraries an image ships keep precedence and keep working;
// LD_LIBRARY_PATH is left alone when it already lists them.
func (e *Edits) Adjustment(env []string) *api.ContainerAdjustment {
	// The messages are allocated in blocks, one per kind, rather than one
	// by one: this is the request path.
	devs := make([]api.LinuxDevice, len(e.Devices))
	modes := make([]api.OptionalFileMode, len(e.Devices))
	kvs := make([]api.KeyValue, 0, 3)
	adj := &api.ContainerAdjustment{
		Linux: &api.LinuxContainerAdjustment{Devices: make([]*api.LinuxDevice, len(e.Devices))},
		Env:   make([]*api.KeyValue, 0, 2),
	}
	for i := range e.Devices {
		d, n := &devs[i], &e.Devices[i]
		modes[i].Value = n.Mode
		d.Path, d.Type, d.Major, d.Minor, d.FileMode = n.Path, "c", n.Major, n.Minor, &modes[i]
		if n.GID != 0 {
			d.Gid = &api.OptionalUInt32{Value: n.GID}
		}
		adj.Linux.Devices[i] = d
	}
	path, setPath := appendDirs(env, EnvPath, e.BinaryDirs, DefaultPath)
	switch pl := e.plan; {
	case e.binariesAtUsrBin(env, setPath):
		// The runtime would keep its own PATH: the binaries go where
		// every PATH looks, and PATH is left alone.
		ms := make([]inventory.Mount, 0, len(e.Mounts)+len(pl.usrBin))
		for _, m := range e.Mounts {
			if !underAny(m.Destination, e.BinaryDirs) {
				ms = append(ms, m)
			}
		}
		adj.Mounts, setPath = apiMounts(append(ms, pl.usrBin...)), false
	case pl != nil && len(pl.mounts) == len(e.Mounts) && (len(e.Mounts) == 0 || &pl.mounts[0] == &e.Mounts[0]):
		adj.Mounts = pl.api // the plan's mounts, unchanged: share its messages
	default:
		adj.Mounts = apiMounts(e.Mounts)
	}
	if e.VisibleDevices != "" {
		kvs = append(kvs, api.KeyValue{})
		kvs[len(kvs)-1].Key, kvs[len(kvs)-1].Value = EnvVisibleDevices, e.VisibleDevices
	}
	if v, ok := LibraryPath(env, e.LibraryDirs); ok {
		kvs = append(kvs, api.KeyValue{})
		kvs[len(kvs)-1].Key, kvs[len(kvs)-1].Value = EnvLibraryPath, v
	}
	if setPath {
		kvs = append(kvs, api.KeyValue{})
		kvs[len(kvs)-1].Key, kvs[len(kvs)-1].Value = EnvPath, path
	}
	for i := range kvs {
		adj.Env = append(adj.Env, &kvs[i])
	}
	for _, kv := range e.Env {
		k, v, _ := strings.Cut(kv, "=")
		adj.AddEnv(k, v)
	}
	for _, kv := range e.DefaultEnv {
		k, v, _ := strings.Cut(kv, "=")
		if !hasEnv(env, k) {
			adj.AddEnv(k, v)
		}
	}
	if len(e.Hooks) > 0 {
		adj.AddHooks(apiHooks(e.Hooks))
	}
	return adj
}

// apiHooks returns the hooks (a CDI spec's, cdiImport) as NRI hooks, each
// in its OCI stage; a hook of another stage is dropped.
func apiHooks(hs []inventory.Hook) *api.Hooks {
	hooks := &api.Hooks{}
	stages := map[string]*[]*api.Hook{
		"prestart": &hooks.Prestart, "createRuntime": &hooks.CreateRuntime,
		"createContainer": &hooks.CreateContainer, "startContainer": &hooks.StartContainer,
		"poststart": &hooks.Poststart, "poststop": &hooks.Poststop,
	}
	for _, h := range hs {
		stage, ok := stages[h.Stage]
		if !ok {
			continue
		}
		hook := &api.Hook{Path: h.Path, Args: h.Args, Env: h.Env}
		if h.Timeout != nil {
			hook.Timeout = api.Int(*h.Timeout)
		}
		*stage = append(*stage, hook)
	}
	return hooks
}

// BinariesAtUsrBin reports whether a container with environment env gets
// its binaries one by one at /usr/bin instead of in BinaryDirs: when PATH
// would have to be extended but env sets it more than once (PathRepeated).
// CRI-O 1.34 shows a plugin the PATH of its spec template and then the
// image's (or the pod spec's), and applies an adjusted PATH to the first
// only, so that the second, unchanged, is what the container gets.
func (e *Edits) BinariesAtUsrBin(env []string) bool {
	if e.plan == nil || len(e.plan.usrBin) == 0 || !PathRepeated(env) {
		return false
	}
	_, setPath := appendDirs(env, EnvPath, e.BinaryDirs, DefaultPath)
	return setPath
}

// binariesAtUsrBin is BinariesAtUsrBin for a caller that has worked out
// already whether PATH must be extended (setPath).
func (e *Edits) binariesAtUsrBin(env []string, setPath bool) bool {
	return setPath && e.plan != nil && len(e.plan.usrBin) > 0 && PathRepeated(env)
}

// UsrBin are the binaries of the edits as mounts at /usr/bin, where the
// layout: toolkit (and a CDI spec nri-gpu generates) puts them; nil when
// the edits' binaries are at /usr/bin already or there are none.
func (e *Edits) UsrBin() []inventory.Mount {
	if e.plan == nil || len(e.BinaryDirs) == 0 {
		return nil
	}
	return e.plan.usrBin
}

// DropBinaryDirs takes the binary directories and their mounts out of the
// edits: for a container that has every binary at /usr/bin already.
func (e *Edits) DropBinaryDirs() {
	ms := e.Mounts[:0:0]
	for _, m := range e.Mounts {
		if !underAny(m.Destination, e.BinaryDirs) {
			ms = append(ms, m)
		}
	}
	e.Mounts, e.BinaryDirs = ms, nil
}

// PathRepeated reports whether env sets PATH more than once.
func PathRepeated(env []string) bool {
	n := 0
	for _, kv := range env {
		if strings.HasPrefix(kv, EnvPath+"=") {
			n++
		}
	}
	return n > 1
}

// underAny reports whether p is one of dirs or below one.
func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// LibraryPath returns the LD_LIBRARY_PATH a container with environment env
// needs for dirs to be searched: its own value with the missing dirs
// appended. ok is false when nothing needs to change.
func LibraryPath(env []string, dirs []string) (string, bool) {
	return appendDirs(env, EnvLibraryPath, dirs, "")
}

// appendDirs returns the value of the colon-separated list key in env with
// the missing dirs appended; unset is the list's value when env does not
// set it. ok is false when nothing needs to change.
func appendDirs(env []string, key string, dirs []string, unset string) (string, bool) {
	if len(dirs) == 0 {
		return "", false
	}
	// The last setting: the one a runtime that dedups the environment
	// (CRI-O) keeps; containerd shows each variable once.
	cur, found := unset, false
	for _, kv := range env {
		if len(kv) > len(key) && kv[len(key)] == '=' && strings.HasPrefix(kv, key) {
			cur, found = kv[len(key)+1:], true
		}
	}
	val := cur
	changed := !found && unset != ""
	for _, d := range dirs {
		if hasPathEntry(cur, d) {
			continue
		}
		// An empty list searches nothing; ":dir" would add the working
		// directory, so an empty value is replaced.
		if val == "" {
			val = d
		} else {
			val += ":" + d
		}
		changed = true
	}
	return val, changed
}

// hasEnv reports whether env sets key (to any value, empty included).
func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if len(kv) > len(key) && kv[len(key)] == '=' && strings.HasPrefix(kv, key) {
			return true
		}
	}
	return false
}

// hasPathEntry reports whether the colon-separated list holds dir.
func hasPathEntry(list, dir string) bool {
	for list != "" {
		var entry string
		entry, list, _ = strings.Cut(list, ":")
		if entry == dir || entry == dir+"/" {
			return true
		}
	}
	return false
}

// CDIAdjustment returns an adjustment that hands GPUs to the runtime as CDI
// device references (fully qualified names), which the runtime resolves
// from its own CDI specs, plus NVIDIA_VISIBLE_DEVICES. The specs' edits
// replace this plugin's device nodes and mounts.
func CDIAdjustment(names []string, visibleDevices string) *api.ContainerAdjustment {
	adj := &api.ContainerAdjustment{}
	for _, n := range names {
		adj.AddCDIDevice(&api.CDIDevice{Name: n})
	}
	adj.AddEnv(EnvVisibleDevices, visibleDevices)
	return adj
}
