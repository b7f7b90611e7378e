package suite

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestCDIImport serves an AMD-style CDI spec's devices through nri-gpu and
// checks the container's view: the spec's nodes (allowed by the cgroup),
// mount and env, and nothing of NVIDIA's.
func TestCDIImport(t *testing.T) {
	c := startRuntime(t, harness.ContainerdOptions{})
	dir, err := os.MkdirTemp("", "nri-gpu-e2e-amd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	v, err := simnode.GenerateVendor(filepath.Join(dir, "root"), 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("cdiImport:\n  kind: amd.com/gpu\n  specDirs: [%s]\n", filepath.Dir(v.SpecPath))), 0o644)
	n := &node{Node: &simnode.Node{Root: v.Root}, config: cfg}
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: t.Context()}
	w.plugin = startPlugin(t, c, n)

	g := w.mustRun("rocm", map[string]string{"gpus.nri-gpu.dev/pod": "device=1"}, harness.ContainerSpec{})
	out, _ := g.sh("ls /dev /dev/dri | tr '\\n' ' '; echo; echo HSA_SIM=$HSA_SIM; ls /opt/rocm/lib; echo NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-unset}")
	for _, want := range []string{"kfd", "renderD129", "HSA_SIM=1", "librocm-sim.so.1", "NVIDIA_VISIBLE_DEVICES=unset"} {
		if !strings.Contains(out, want) {
			t.Errorf("container view lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "renderD128") || strings.Contains(out, "nvidia") {
		t.Errorf("container got more than asked:\n%s", out)
	}
	for _, p := range []string{"/dev/kfd", "/dev/dri/renderD129"} {
		if e := openError(g, p); !strings.Contains(e, enxio) {
			t.Errorf("opening %s: %q, want %q", p, e, enxio)
		}
	}
}
