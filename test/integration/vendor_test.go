package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestCDIImportOverNRI serves another vendor's CDI devices (an AMD-style
// spec): the same annotation grammar, and the spec's edits as the
// adjustment.
func TestCDIImportOverNRI(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	v, err := simnode.GenerateVendor(filepath.Join(dir, "amd"), 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("cdiImport:\n  kind: amd.com/gpu\n  specDirs: [%s]\n", filepath.Dir(v.SpecPath))), 0o644)
	r := startRuntime(t, dir)
	defer r.stop()
	startPlugin(t, "run", "--config", cfg, "--socket", r.socket)
	select {
	case <-r.synced:
	case <-time.After(20 * time.Second):
		t.Fatal("the plugin did not connect")
	}
	r.waitAnswer(20*time.Second, map[string]string{"gpus.nri-gpu.dev/pod": "device=0"})

	adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/container.rocm": "device=1"}, "rocm")
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	for _, d := range adj.GetLinux().GetDevices() {
		devs = append(devs, fmt.Sprintf("%s %d:%d", d.Path, d.Major, d.Minor))
	}
	slices.Sort(devs)
	want := []string{fmt.Sprintf("/dev/dri/renderD129 %d:129", simnode.DRIMajor), fmt.Sprintf("/dev/kfd %d:0", simnode.KFDMajor)}
	if !slices.Equal(devs, want) {
		t.Errorf("devices %q, want %q", devs, want)
	}
	var env []string
	for _, e := range adj.GetEnv() {
		env = append(env, e.Key+"="+e.Value)
	}
	if !slices.Equal(env, []string{"HSA_SIM=1"}) {
		t.Errorf("env %q, want only the spec's (no NVIDIA variables)", env)
	}
	if m := adj.GetMounts(); len(m) != 1 || m[0].Destination != "/opt/rocm/lib" || m[0].Source != filepath.Join(v.Root, "opt/rocm/lib") {
		t.Errorf("mounts %v", m)
	}
	spec := applyToSpec(t, adj)
	if len(spec.Linux.Resources.Devices) == 0 {
		t.Error("no cgroup rules")
	}

	if adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/pod": "all"}, "all"); err != nil || len(adj.GetLinux().GetDevices()) != 3 {
		t.Errorf("all: %v, %v", adj, err)
	}
	_, err = r.create(map[string]string{"gpus.nri-gpu.dev/pod": "device=5"}, "bad")
	if err == nil || !strings.Contains(err.Error(), `unknown device "5" (amd.com/gpu devices of the node: "0,1")`) {
		t.Errorf("unknown device: %v", err)
	}
	// NVIDIA's variable does not apply to another vendor's devices.
	if adj, err := r.create(nil, "cuda", "NVIDIA_VISIBLE_DEVICES=all"); err != nil || len(adj.GetLinux().GetDevices()) != 0 {
		t.Errorf("NVIDIA_VISIBLE_DEVICES on an AMD node: %v, %v", adj, err)
	}
}
