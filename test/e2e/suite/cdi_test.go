package suite

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestCDIExportMatchesInjection starts one container through containerd's
// own CDI with the spec `nri-gpu cdi generate` wrote, and one through
// nri-gpu, and compares what each sees. The spec puts binaries at
// /usr/bin (a CDI spec can only replace PATH), so nri-gpu runs with
// layout: toolkit here.
func TestCDIExportMatchesInjection(t *testing.T) {
	w := newWorld(t, simnode.LayoutDebian, "layout: toolkit\n")
	spec := filepath.Join(w.c.CDIDir(), "nri-gpu.yaml")
	out, err := exec.Command(nriGPU(t), "cdi", "generate", "--config", w.node.config, "-o", spec).CombinedOutput()
	if err != nil {
		t.Fatalf("nri-gpu cdi generate: %v\n%s", err, out)
	}
	data, _ := os.ReadFile(spec)

	viaCDI := w.mustRun("viacdi", nil, harness.ContainerSpec{Image: harness.GlibcImage, CDIDevices: []string{"nvidia.com/gpu=1"}})
	viaNRI := w.mustRun("vianri", map[string]string{"gpus.nri-gpu.dev/pod": "device=1"}, harness.ContainerSpec{Image: harness.GlibcImage})
	view := `ls -l /dev | grep nvidia | awk '{print $1, $5, $6, $NF}'; ls /usr/local/nvidia/lib64 /usr/bin | grep -i nvidia; ls /lib/firmware/nvidia; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; gpucheck cuda nvml`
	a, codeA := viaCDI.sh(view)
	b, codeB := viaNRI.sh(view)
	if codeA != 0 || codeB != 0 || a != b {
		t.Errorf("views differ (exit %d vs %d)\n--- containerd CDI (nvidia.com/gpu=1) ---\n%s\n--- nri-gpu (device=1) ---\n%s\n--- spec ---\n%s", codeA, codeB, a, b, data)
	}
	if !strings.Contains(a, "devices=1") {
		t.Errorf("the CDI container does not see one GPU:\n%s", a)
	}
}

// TestEmitCDI runs nri-gpu with emit: cdi: GPUs go to the runtime as CDI
// device references that containerd resolves from the spec in its spec
// directory, and the container sees the same as with edits. On CRI-O 1.34
// the GPUs go as edits.
func TestEmitCDI(t *testing.T) {
	c := startRuntime(t, harness.RuntimeOptions{})
	n := newNode(t, simnode.LayoutRHEL, "emit: cdi\ncdiSpecDirs: [/var/run/cdi]\n")
	spec := filepath.Join(c.CDIDir(), "nri-gpu.yaml")
	if out, err := exec.Command(nriGPU(t), "cdi", "generate", "--config", n.config, "-o", spec).CombinedOutput(); err != nil {
		t.Fatalf("nri-gpu cdi generate: %v\n%s", err, out)
	}
	// The plugin reads the runtime's spec directory under hostRoot.
	if err := os.MkdirAll(filepath.Join(n.Root, "var/run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(c.CDIDir(), filepath.Join(n.Root, "var/run/cdi")); err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: t.Context()}
	w.plugin = startPlugin(t, c, n)

	g := w.mustRun("emitcdi", map[string]string{"gpus.nri-gpu.dev/pod": "device=2"}, harness.ContainerSpec{Image: harness.GlibcImage})
	// containerd 2.4 reports its NRI version (v0.12) in Configure; 2.2
	// does not, and a version nri-gpu cannot tell gets edits. containerd
	// 1.7 (NRI v0.8.0) and CRI-O 1.34 drop CDI devices returned through
	// NRI: edits, and one warning per connection naming the runtime.
	want := "emit=cdi"
	switch {
	case isContainerd1() || onCRIO():
		want = `emit="edits (the runtime's NRI does not inject CDI devices)"`
		warn := "emit: cdi: containerd " + harness.VersionFromEnv() + " drops CDI devices returned through NRI"
		if onCRIO() {
			warn = "emit: cdi: CRI-O " + strings.TrimPrefix(harness.CRIOVersion, "v") + " drops CDI devices returned through NRI"
		}
		w.mustRun("emitcdi2", map[string]string{"gpus.nri-gpu.dev/pod": "device=1"}, harness.ContainerSpec{})
		if got := strings.Count(w.plugin.log.String(), warn); got != 1 {
			t.Errorf("%d warnings %q, want 1:\n%s", got, warn, w.plugin.log.String())
		}
	case harness.VersionFromEnv() == harness.CompatContainerdVersion:
		want = `emit="edits (the runtime's NRI does not inject CDI devices)"`
	}
	if !strings.Contains(w.plugin.log.String(), want) {
		t.Errorf("nri-gpu log lacks %s:\n%s", want, w.plugin.log.String())
	}
	out, code := g.sh("ls /dev | grep nvidia | tr '\\n' ' '; gpucheck cuda nvml")
	node := "nvidia" + itoa(n.GPUs[2].Minor) + " "
	if code != 0 || !strings.Contains(out, node) || !strings.Contains(out, "devices=1") {
		t.Errorf("container view:\n%s\n%s", out, g.view())
	}
	if got := envOf(g, "NVIDIA_VISIBLE_DEVICES"); got != n.GPUs[2].UUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q", got)
	}
}
