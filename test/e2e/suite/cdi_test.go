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
// nri-gpu, and compares what each sees.
func TestCDIExportMatchesInjection(t *testing.T) {
	w := newWorld(t, simnode.LayoutDebian, "")
	spec := filepath.Join(w.c.CDISpecDir, "nri-gpu.yaml")
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
