// Package adjust computes the container edits that give a container a set
// of GPUs and driver capabilities from an inventory snapshot, and turns
// them into an NRI container adjustment. It knows nothing of where a
// request came from; everything here is pure.
package adjust

import (
	"path"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Environment variables the adjustment sets.
const (
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	EnvLibraryPath    = "LD_LIBRARY_PATH"
)

// mountOptions are the options of every driver mount: read-only, no
// set-uid, no devices, and no propagation back to the host. Shared by all
// mounts, never modified.
var mountOptions = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}

// Layout says where driver files appear in a container.
type Layout struct {
	// LibraryDir holds the 64-bit driver libraries under their SONAMEs.
	LibraryDir string
	// Library32Dir holds the 32-bit libraries of compat32.
	Library32Dir string
}

// Mount is a read-only bind mount of a host file into a container.
type Mount struct {
	Source      string
	Destination string
}

// Edits are the changes that give a container its GPUs.
type Edits struct {
	Devices []inventory.DeviceNode
	Mounts  []Mount
	// VisibleDevices is the value of NVIDIA_VISIBLE_DEVICES: the UUIDs of
	// the GPUs, or "none" when the container gets the driver only.
	VisibleDevices string
	// LibraryDirs are the container directories of driver libraries,
	// to be searched by the dynamic loader.
	LibraryDirs []string
	// Files counts the driver files mounted.
	Files int
}

// Build returns the edits for the given GPUs and capabilities: the GPUs'
// device nodes, the control nodes the capabilities need, and bind mounts of
// the driver files of the capabilities (libraries under their SONAMEs in
// the layout's library directories, binaries in /usr/bin, the firmware
// directory at its usual path).
func Build(snap *inventory.Snapshot, gpus []inventory.GPU, caps inventory.Capabilities, l Layout) Edits {
	e := Edits{Devices: make([]inventory.DeviceNode, 0, len(gpus)+4)}
	for _, g := range gpus {
		e.Devices = append(e.Devices, g.Node)
	}
	c := snap.Control
	for _, n := range []struct {
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

	var lib64, lib32 bool
	e.Mounts = make([]Mount, 0, len(snap.Files))
	for _, f := range snap.Files {
		if f.Kind == inventory.Library32 && !caps.Has(inventory.Compat32) ||
			f.Capability != 0 && !caps.Has(f.Capability) {
			continue
		}
		var dst string
		switch f.Kind {
		case inventory.Library:
			dst, lib64 = path.Join(l.LibraryDir, f.Name), true
		case inventory.Library32:
			dst, lib32 = path.Join(l.Library32Dir, f.Name), true
		case inventory.Binary:
			dst = path.Join("/usr/bin", f.Name)
		case inventory.FirmwareDir:
			dst = path.Join("/lib/firmware/nvidia", f.Name)
		default:
			continue
		}
		e.Mounts = append(e.Mounts, Mount{Source: f.HostPath, Destination: dst})
	}
	e.Files = len(e.Mounts)
	if lib64 {
		e.LibraryDirs = append(e.LibraryDirs, l.LibraryDir)
	}
	if lib32 {
		e.LibraryDirs = append(e.LibraryDirs, l.Library32Dir)
	}

	if len(gpus) == 0 {
		e.VisibleDevices = "none"
	} else {
		var b strings.Builder
		b.Grow(len(gpus) * 41)
		for i, g := range gpus {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(g.UUID)
		}
		e.VisibleDevices = b.String()
	}
	return e
}

// Adjustment returns the NRI adjustment that applies the edits to a
// container whose environment is env. Each device node comes with its
// cgroup allow rule (the runtime adds it for every adjusted device). The
// library directories are appended to the container's own LD_LIBRARY_PATH,
// so that libraries an image ships keep precedence and keep working;
// LD_LIBRARY_PATH is left alone when it already lists them.
func (e *Edits) Adjustment(env []string) *api.ContainerAdjustment {
	adj := &api.ContainerAdjustment{}
	for i := range e.Devices {
		d := &e.Devices[i]
		adj.AddDevice(&api.LinuxDevice{
			Path:     d.Path,
			Type:     "c",
			Major:    d.Major,
			Minor:    d.Minor,
			FileMode: api.FileMode(d.Mode),
		})
	}
	for _, m := range e.Mounts {
		adj.AddMount(&api.Mount{
			Source:      m.Source,
			Destination: m.Destination,
			Type:        "bind",
			Options:     mountOptions,
		})
	}
	adj.AddEnv(EnvVisibleDevices, e.VisibleDevices)
	if v, ok := LibraryPath(env, e.LibraryDirs); ok {
		adj.AddEnv(EnvLibraryPath, v)
	}
	return adj
}

// LibraryPath returns the LD_LIBRARY_PATH a container with environment env
// needs for dirs to be searched: its own value with the missing dirs
// appended. ok is false when nothing needs to change.
func LibraryPath(env []string, dirs []string) (string, bool) {
	cur := ""
	for _, kv := range env {
		if strings.HasPrefix(kv, EnvLibraryPath+"=") {
			cur = kv[len(EnvLibraryPath)+1:]
			break
		}
	}
	val := cur
	changed := false
	for _, d := range dirs {
		if hasPathEntry(cur, d) {
			continue
		}
		// An empty LD_LIBRARY_PATH searches nothing; ":dir" would add
		// the working directory, so an empty value is replaced.
		if val == "" {
			val = d
		} else {
			val += ":" + d
		}
		changed = true
	}
	return val, changed
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
