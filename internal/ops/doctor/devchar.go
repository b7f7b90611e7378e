package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/devchar"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// cgroupDriver says which runtimes of the node's configuration hand their
// containers' device rules to systemd (the systemd cgroup driver), as far
// as their configuration files say: containerd's runtimes with
// options.SystemdCgroup = true, CRI-O's cgroup_manager (systemd unless set
// to cgroupfs). known is false when neither configuration was found.
func cgroupDriver(o *Options) (systemd []string, cgroupfs []string, known bool) {
	if ctd, err := loadContainerd(o.ContainerdConfig, o.Config.HostRoot); err == nil {
		known = true
		runtimes, _ := getTable(ctd.criRuntime(), "containerd", "runtimes")
		if len(runtimes) == 0 {
			cgroupfs = append(cgroupfs, "containerd (runc: SystemdCgroup unset, cgroupfs)")
		}
		names := make([]string, 0, len(runtimes))
		for name := range runtimes {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			rt, _ := runtimes[name].(tree)
			if on, _ := getBool(rt, "options", "SystemdCgroup"); on {
				systemd = append(systemd, fmt.Sprintf("containerd runtime %s (SystemdCgroup = true)", name))
			} else {
				cgroupfs = append(cgroupfs, fmt.Sprintf("containerd runtime %s (cgroupfs)", name))
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		known = true
	}
	if crio, err := loadCRIO(o.CRIOConfig); err == nil && crio != nil {
		known = true
		switch m := getString(crio.Tree, "crio", "runtime", "cgroup_manager"); m {
		case "", "systemd":
			if m == "" {
				m = "systemd, CRI-O's default"
			}
			systemd = append(systemd, "CRI-O (cgroup_manager = "+m+")")
		default:
			cgroupfs = append(cgroupfs, "CRI-O (cgroup_manager = "+m+")")
		}
	}
	return systemd, cgroupfs, known
}

// checkDevChar checks the /dev/char/<major>:<minor> links of the nodes
// nri-gpu injects, against the runtime's cgroup driver: with the systemd
// driver, a missing link can cost a container its GPUs at the next
// `systemctl daemon-reload` (see package devchar).
func checkDevChar(o *Options, snap *inventory.Snapshot, out *[]Result) {
	const name = "dev/char links"
	if snap == nil || len(snap.GPUs) == 0 {
		add(out, Injection, name, Skip, "no GPU to link", "fix the kernel layer first")
		return
	}
	nodes := devchar.Nodes(snap)
	problems, err := devchar.Check(o.Config.HostRoot, nodes)
	if err != nil {
		add(out, Injection, name, Fail, err.Error(), "check hostRoot in the configuration")
		return
	}
	systemd, cgroupfs, known := cgroupDriver(o)
	if len(problems) == 0 {
		add(out, Injection, name, Pass, fmt.Sprintf("all %d nodes nri-gpu injects have their /dev/char link", len(nodes)), "")
		return
	}
	var missing, cmds []string
	for _, p := range problems {
		missing = append(missing, p.Link.Path()+" ("+p.Node.Path+"): "+p.What)
		if p.What == "missing" && len(cmds) < 3 {
			cmds = append(cmds, "ln -s "+p.Link.Target+" "+p.Link.Path())
		}
	}
	how := "nri-gpu run creates them at start (devCharLinks.enabled, on by default; it needs the host's /dev/char writable): check its log for devCharLinks"
	if !o.Config.DevCharLinks.On() {
		how = "set devCharLinks.enabled: true (nri-gpu run then creates them), or create them at boot (nvidia-ctk system create-dev-char-symlinks --create-all)"
	}
	fix := how
	if len(cmds) > 0 {
		fix += "; by hand: " + strings.Join(cmds, "; ")
		if n := len(problems) - len(cmds); n > 0 {
			fix += fmt.Sprintf(" (and %d more)", n)
		}
	}
	verdict := fmt.Sprintf("%d of %d nodes lack a /dev/char link: %s", len(problems), len(nodes), firstLines(missing, 2))
	switch {
	case len(systemd) > 0:
		add(out, Injection, name, Warn, verdict+"; "+strings.Join(systemd, ", ")+" uses the systemd cgroup driver: after systemctl daemon-reload, containers may lose these devices (\"Failed to initialize NVML: Unknown Error\")", fix)
	case known:
		add(out, Injection, name, Pass, fmt.Sprintf("%d of %d nodes lack a /dev/char link; not needed: %s use cgroupfs", len(problems), len(nodes), strings.Join(cgroupfs, ", ")), "")
	default:
		add(out, Injection, name, Warn, verdict+"; the runtime's cgroup driver is unknown (no configuration found): with the systemd driver, containers may lose these devices at systemctl daemon-reload", fix)
	}
}
