package discover_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestDiscoverDRMNodes checks that each GPU gets the card and render node
// sysfs names under its bus id, with the host node's numbers, mode and
// group, and that the BMC's card0 (another PCI device) goes to none.
func TestDiscoverDRMNodes(t *testing.T) {
	n := generateWithNodes(t, simnode.Options{NumGPUs: 3, SwapMinors: true})
	s := discoverAt(t, n.Root)
	if len(s.Warnings) > 0 {
		t.Errorf("unexpected warnings: %q", s.Warnings)
	}
	if len(s.GPUs) != 3 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	for i, g := range s.GPUs {
		for _, c := range []struct {
			got  inventory.DeviceNode
			want string
		}{{g.Card(), simnode.CardPath(i)}, {g.Render(), simnode.RenderPath(i)}} {
			if c.got.Path != c.want || c.got.Major != 226 || c.got.Mode != 0o660 || c.got.GID != simnode.RenderGID {
				t.Errorf("GPU %d (%s): DRM node %+v, want %s 226:N mode 660 gid %d", i, g.BusID, c.got, c.want, simnode.RenderGID)
			}
		}
		if g.Card().Path == "/dev/dri/card0" {
			t.Errorf("GPU %d got the BMC's card0", i)
		}
	}
}

// TestDiscoverDRMNodesMissing checks that a GPU whose sysfs names a DRM
// node that /dev lacks, or that is not of the drm major, gets none, with
// a warning only for the wrong one; and that a node without sysfs drm
// entries (no nvidia-drm) is no warning.
func TestDiscoverDRMNodesMissing(t *testing.T) {
	n := generateWithNodes(t, simnode.Options{NumGPUs: 2})
	if err := os.Remove(n.HostPath(simnode.RenderPath(0))); err != nil {
		t.Fatal(err)
	}
	// GPU 1's card node is /dev/null's numbers.
	card1 := n.HostPath(simnode.CardPath(1))
	if err := os.Remove(card1); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", card1); err != nil {
		t.Fatal(err)
	}
	s := discoverAt(t, n.Root)
	if len(s.GPUs) != 2 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	if s.GPUs[0].Render().Path != "" || s.GPUs[0].Card().Path != simnode.CardPath(0) {
		t.Errorf("GPU 0 DRM nodes %+v %+v", s.GPUs[0].Card(), s.GPUs[0].Render())
	}
	if s.GPUs[1].Card().Path != "" || s.GPUs[1].Render().Path != simnode.RenderPath(1) {
		t.Errorf("GPU 1 DRM nodes %+v %+v", s.GPUs[1].Card(), s.GPUs[1].Render())
	}
	if !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, simnode.CardPath(1)) }) {
		t.Errorf("no warning about the symbolic link at %s: %q", simnode.CardPath(1), s.Warnings)
	}

	if err := os.RemoveAll(n.HostPath("/sys/bus/pci/devices")); err != nil {
		t.Fatal(err)
	}
	s = discoverAt(t, n.Root)
	for _, g := range s.GPUs {
		if g.Card().Path != "" || g.Render().Path != "" {
			t.Errorf("GPU %d has DRM nodes without sysfs: %+v %+v", g.Index, g.Card(), g.Render())
		}
	}
	if len(s.Warnings) > 0 {
		t.Errorf("warnings without sysfs: %q", s.Warnings)
	}
}

// TestDiscoverIPC checks that the persistenced and fabric manager sockets
// (utility) and the MPS pipe directory (compute) are found where the
// daemons made them, with their container paths, and not otherwise; and
// that a regular file where a socket belongs is a warning, not a mount.
func TestDiscoverIPC(t *testing.T) {
	n := generate(t, simnode.Options{NumGPUs: 1, IPC: true})
	s := discoverAt(t, n.Root)
	got := map[string]inventory.Capability{}
	for _, f := range s.Files {
		if f.Kind == inventory.Socket {
			got[f.Name] = f.Capability
			if f.HostPath != filepath.Join(n.Root, f.Name) {
				t.Errorf("%s from %s", f.Name, f.HostPath)
			}
		}
	}
	want := map[string]inventory.Capability{
		simnode.PersistencedSocket: inventory.Utility, simnode.FabricManagerSocket: inventory.Utility, simnode.MPSPipeDir: inventory.Compute,
	}
	if !mapsEqual(got, want) {
		t.Errorf("IPC endpoints %v, want %v", got, want)
	}

	plain := generate(t, simnode.Options{NumGPUs: 1})
	if err := os.MkdirAll(plain.HostPath("/run/nvidia-persistenced"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain.HostPath(simnode.PersistencedSocket), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s = discoverAt(t, plain.Root)
	if slices.ContainsFunc(s.Files, func(f inventory.DriverFile) bool { return f.Kind == inventory.Socket }) {
		t.Errorf("IPC endpoints on a node without daemons: %+v", s.Files)
	}
	if !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, "not a socket") }) {
		t.Errorf("no warning about the regular file at %s: %q", simnode.PersistencedSocket, s.Warnings)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestDiscoverHostileConfigFiles plants, where discovery looks for the
// vendor files and IPC endpoints, links out of the driver root and a FIFO:
// none is injected, the escapes are warnings, discovery finishes.
func TestDiscoverHostileConfigFiles(t *testing.T) {
	n := generate(t, simnode.Options{NumGPUs: 1, IPC: true})
	egl := n.HostPath("/usr/share/glvnd/egl_vendor.d/10_nvidia.json")
	if err := os.Remove(egl); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../../../../../../../etc/passwd", egl); err != nil {
		t.Fatal(err)
	}
	icd := n.HostPath("/usr/share/vulkan/icd.d/nvidia_icd.json")
	if err := os.Remove(icd); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(icd, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := n.HostPath(simnode.PersistencedSocket)
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../../../../../../run/systemd/private", sock); err != nil {
		t.Fatal(err)
	}
	s := discoverAt(t, n.Root)
	for _, f := range s.Files {
		switch f.Name {
		case "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/etc/vulkan/icd.d/nvidia_icd.json", simnode.PersistencedSocket:
			t.Errorf("hostile %s injected from %s", f.Name, f.HostPath)
		}
	}
	for _, want := range []string{"10_nvidia.json", "nvidia-persistenced/socket"} {
		if !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, want) }) {
			t.Errorf("no warning about %s: %q", want, s.Warnings)
		}
	}
	if !slices.ContainsFunc(s.Files, func(f inventory.DriverFile) bool { return f.Name == simnode.FabricManagerSocket }) {
		t.Error("the fabric manager socket must still be found")
	}
}
