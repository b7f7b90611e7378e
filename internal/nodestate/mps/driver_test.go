package mps_test

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/mps"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestPrepareDriver: from a discovery of a simulated Debian node (whose
// driver libraries share /usr/lib/x86_64-linux-gnu with the C library),
// the daemon's binary and a directory of links, by SONAME, to the
// driver's compute and utility libraries only; kept as it is when nothing
// changed, replaced after a driver upgrade.
func TestPrepareDriver(t *testing.T) {
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1, Layout: simnode.LayoutDebian})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = n.Root, n.Root, n.Root
	cfg.DevicePlugin.MPSRoot = t.TempDir()
	snap, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root})
	if err != nil {
		t.Fatal(err)
	}
	d, err := mps.PrepareDriver(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	if d.Binary != n.HostPath("/usr/bin/nvidia-cuda-mps-control") || d.LibraryDir != filepath.Join(cfg.DevicePlugin.MPSRoot, "lib-"+n.DriverVersion) {
		t.Errorf("driver %+v", d)
	}
	got := links2(t, d.LibraryDir)
	var names []string
	for name, target := range got {
		names = append(names, name)
		if !strings.HasPrefix(target, n.HostPath(n.LibDir)+"/") {
			t.Errorf("%s -> %s, outside the driver's library directory", name, target)
		}
	}
	sort.Strings(names)
	want := []string{"libcuda.so.1", "libcudadebugger.so.1", "libnvidia-allocator.so.1", "libnvidia-cfg.so.1", "libnvidia-gpucomp.so." + n.DriverVersion,
		"libnvidia-ml.so.1", "libnvidia-nscq.so." + n.DriverVersion, "libnvidia-nvvm.so.4", "libnvidia-opencl.so.1", "libnvidia-pkcs11-openssl3.so." + n.DriverVersion,
		"libnvidia-pkcs11.so." + n.DriverVersion, "libnvidia-ptxjitcompiler.so.1"}
	if d := cmp.Diff(want, names); d != "" {
		t.Errorf("links (-want +got):\n%s", d)
	}
	before, _ := os.Stat(d.LibraryDir)
	if _, err := mps.PrepareDriver(cfg, snap); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(d.LibraryDir); !os.SameFile(before, after) {
		t.Error("an unchanged library directory was made anew")
	}
	up, err := simnode.Upgrade(n, "590.48.01", simnode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err = discover.Discover(discover.Options{HostRoot: up.Root, DriverRoot: up.Root})
	if err != nil {
		t.Fatal(err)
	}
	d2, err := mps.PrepareDriver(cfg, snap)
	if err != nil || d2.LibraryDir == d.LibraryDir || !strings.HasSuffix(links2(t, d2.LibraryDir)["libcuda.so.1"], "libcuda.so.590.48.01") {
		t.Errorf("after an upgrade: %+v, %v", d2, err)
	}
	snap.Files = nil
	if _, err := mps.PrepareDriver(cfg, snap); err == nil || !strings.Contains(err.Error(), "discovery found no nvidia-cuda-mps-control under driverRoot") {
		t.Errorf("without the binary: %v", err)
	}
}

func links2(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		target, _ := os.Readlink(filepath.Join(dir, e.Name()))
		out[e.Name()] = target
	}
	return out
}
