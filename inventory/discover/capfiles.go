package discover

import (
	"errors"
	"io/fs"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// configs discovers the driver's configuration files, X.Org modules and
// NGX DLLs (configFiles): for each, the first of its directories that
// holds it as a regular file, resolved inside the driver root.
func (d *discovery) configs() {
	for _, c := range configFiles {
		rel := strings.ReplaceAll(c.rel, "{v}", d.snap.DriverVersion)
		for _, dir := range c.dirs {
			cand := path.Join(dir, rel)
			resolved, err := resolveInRoot(d.drv, cand)
			if err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					d.warnf("skipping /%s: %v", cand, err)
				}
				continue
			}
			fi, err := d.drv.Stat(resolved)
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			dst := c.dst
			switch {
			case dst == "":
				dst = "/" + cand
			case strings.HasPrefix(dst, "{dir}/"):
				dst = "/" + path.Join(dir, strings.TrimPrefix(dst, "{dir}/"))
			}
			d.snap.Files = append(d.snap.Files, inventory.DriverFile{
				Kind: inventory.Config, Capability: c.cap, HostPath: d.hostPath(resolved), Name: dst,
			})
			break
		}
	}
}

// ipcs discovers the driver daemons' sockets and the MPS pipe directory
// that exist now (ipcEndpoints). A daemon started later is found at the
// next discovery (a reload).
func (d *discovery) ipcs() {
	for _, e := range ipcEndpoints {
		if e.dir {
			e.paths = []string{strings.TrimPrefix(d.mps, "/")}
		}
		for _, p := range e.paths {
			resolved, err := resolveInRoot(d.drv, p)
			if err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					d.warnf("skipping /%s: %v", p, err)
				}
				continue
			}
			fi, err := d.drv.Lstat(resolved)
			if err != nil {
				continue
			}
			if e.dir && !fi.IsDir() || !e.dir && fi.Mode().Type() != fs.ModeSocket {
				d.warnf("skipping /%s: not a %s (%s)", p, map[bool]string{true: "directory", false: "socket"}[e.dir], fi.Mode().Type())
				continue
			}
			d.snap.Files = append(d.snap.Files, inventory.DriverFile{
				Kind: inventory.Socket, Capability: e.cap, HostPath: d.hostPath(resolved), Name: "/" + e.paths[0],
			})
			break
		}
	}
}

// maxDRMEntries bounds the entries of a GPU's sysfs drm directory that
// are read: a real one holds card<N>, renderD<N> and maybe controlD<N>.
const maxDRMEntries = 16

// drmNodes finds the DRM nodes of the GPU at bus: the card<N> and
// renderD<N> entries of /sys/bus/pci/devices/<bus>/drm, as character
// devices of the drm major under /dev/dri. A GPU without nvidia-drm has
// none, and a node without sysfs (a container without /sys) too: that is
// no warning.
func (d *discovery) drmNodes(bus string, drmMajor int64) (card, render inventory.DeviceNode) {
	if drmMajor < 0 {
		return card, render
	}
	dir, err := openNoBlock(d.host, path.Join("sys/bus/pci/devices", bus, "drm"))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			d.warnf("GPU %s: DRM nodes unknown: %v", bus, err)
		}
		return card, render
	}
	names, _ := dir.Readdirnames(maxDRMEntries)
	dir.Close()
	slices.Sort(names)
	for _, name := range names {
		var prefix string
		var into *inventory.DeviceNode
		switch {
		case strings.HasPrefix(name, "card") && card.Path == "":
			prefix, into = "card", &card
		case strings.HasPrefix(name, "renderD") && render.Path == "":
			prefix, into = "renderD", &render
		default:
			continue
		}
		n := name[len(prefix):]
		if !isDecimal(n, 6) {
			continue
		}
		p := "/dev/dri/" + name
		node, err := CharDevice(d.host, p)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				d.deviceWarnf("GPU %s: %v", bus, err)
			}
			continue
		}
		if node.Major != drmMajor {
			d.deviceWarnf("GPU %s: %s is %d:%d, not of the drm major %d", bus, p, node.Major, node.Minor, drmMajor)
			continue
		}
		// The host node's group (render, video) comes along, so that a
		// container user in that group opens it as on the host.
		if fi, err := d.host.Lstat(strings.TrimPrefix(p, "/")); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				node.GID = st.Gid
			}
		}
		*into = node
	}
	return card, render
}

// isDecimal reports whether s is 1 to max decimal digits.
func isDecimal(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
