package doctor

import (
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/devchar"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestDevCharLinks: the links check reads the runtime's cgroup driver
// from its configuration: with containerd's SystemdCgroup = true (or
// CRI-O, whose default is systemd) missing links are a warning whose fix
// names the links to make; with cgroupfs they are not needed; once nri-gpu
// made them the check passes.
func TestDevCharLinks(t *testing.T) {
	needNodes(t)
	f := newFixture(t, simnode.Options{IMEXChannels: 1})
	results := Run(f.o)
	expect(t, results, "dev/char links", Pass, "not needed: containerd (runc: SystemdCgroup unset, cgroupfs) use cgroupfs")

	f.write(t, "/etc/containerd/conf.d/30-systemd.toml", "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\nSystemdCgroup = true\n")
	results = Run(f.o)
	// 2 GPUs, their 4 DRM nodes, nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools, channel0.
	expect(t, results, "dev/char links", Warn, "11 of 11 nodes lack a /dev/char link: /dev/char/195:")
	expect(t, results, "dev/char links", Warn, "containerd runtime runc (SystemdCgroup = true) uses the systemd cgroup driver")
	fix := fixOf(results, "dev/char links")
	if !strings.Contains(fix, "nri-gpu run creates them at start") || !strings.Contains(fix, "ln -s ../nvidia") || !strings.Contains(fix, "(and 8 more)") {
		t.Errorf("fix %q", fix)
	}
	if !OK(results) {
		t.Errorf("a warning fails the report:\n%s", report(results))
	}

	f.o.Config.DevCharLinks.Enabled = new(bool)
	if fix := fixOf(Run(f.o), "dev/char links"); !strings.Contains(fix, "set devCharLinks.enabled: true") {
		t.Errorf("fix with devCharLinks off: %q", fix)
	}

	snap, err := discover.Discover(discover.Options{HostRoot: f.n.Root, DriverRoot: f.n.Root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := devchar.Ensure(devchar.Options{HostRoot: f.n.Root, StateDir: t.TempDir()}, devchar.Nodes(snap)); err != nil {
		t.Fatal(err)
	}
	expect(t, Run(f.o), "dev/char links", Pass, "all 11 nodes nri-gpu injects have their /dev/char link")

	// CRI-O without cgroup_manager: systemd, its default.
	f.remove(t, "/dev/char")
	f.remove(t, "/etc/containerd")
	f.write(t, "/etc/crio/crio.conf.d/10-nri.conf", "[crio.nri]\nenable_nri = true\n")
	f.o.ContainerdConfig, f.o.CRIOConfig = "", ""
	expect(t, Run(f.o), "dev/char links", Warn, "CRI-O (cgroup_manager = systemd, CRI-O's default) uses the systemd cgroup driver")
	f.write(t, "/etc/crio/crio.conf.d/20-cgroupfs.conf", "[crio.runtime]\ncgroup_manager = \"cgroupfs\"\n")
	expect(t, Run(f.o), "dev/char links", Pass, "not needed: CRI-O (cgroup_manager = cgroupfs) use cgroupfs")
}

func fixOf(results []Result, name string) string {
	for _, r := range results {
		if r.Name == name {
			return r.Fix
		}
	}
	return ""
}
