package suite

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestPolicy runs nri-gpu with the secure policy of docs/policy.md on a real
// containerd: images' NVIDIA_VISIBLE_DEVICES gets nothing and is rewritten
// to void, the device plugin's mount list still works, annotations work
// only in their namespaces, an unmet NVIDIA_REQUIRE_CUDA fails creation with
// the toolkit's wording, and a container that already has a GPU node from
// the runtime gets only what it lacks.
func TestPolicy(t *testing.T) {
	w := newWorld(t, simnode.LayoutDebian, "policy:\n  visibleDevices: deny\n  annotationNamespaces: [ml]\n  cdiNamespaces: [ml]\n  managementNamespaces: [gpu-operator]\n")
	n := w.node

	t.Run("image env denied and voided", func(t *testing.T) {
		c, err := w.runIn("default", "cudaimage", nil, harness.ContainerSpec{Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := gpuNodes(c); len(got) != 0 {
			t.Errorf("GPU nodes %q under visibleDevices: deny\n%s", got, c.view())
		}
		if got := envOf(c, "NVIDIA_VISIBLE_DEVICES"); got != "void" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want void", got)
		}
		if !strings.Contains(w.plugin.log.String(), "env NVIDIA_VISIBLE_DEVICES ignored") {
			t.Errorf("no log line for the ignored variable")
		}
	})

	t.Run("device plugin mount list", func(t *testing.T) {
		g := n.GPUs[1]
		c, err := w.runIn("default", "devplugin", nil, harness.ContainerSpec{
			Env:    map[string]string{"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
			Mounts: []*runtimeapi.Mount{{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/" + g.UUID}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := gpuNodes(c), []string{fmt.Sprintf("/dev/nvidia%d", g.Minor)}; len(got) != 1 || got[0] != want[0] {
			t.Errorf("GPU nodes %q, want %q\n%s", got, want, c.view())
		}
		if got := envOf(c, "NVIDIA_VISIBLE_DEVICES"); got != g.UUID {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %s", got, g.UUID)
		}
	})

	t.Run("annotations by namespace", func(t *testing.T) {
		_, err := w.runIn("web", "webgpu", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{})
		if err == nil || !strings.Contains(err.Error(), `nri-gpu: annotation gpus.nri-gpu.dev/pod: not allowed in namespace "web" (policy.annotationNamespaces: [ml])`) {
			t.Errorf("annotation in web: %v", err)
		}
		c, err := w.runIn("ml", "mlgpu", map[string]string{"nvidia.cdi.k8s.io/container.mlgpu": "nvidia.com/gpu=3"}, harness.ContainerSpec{})
		if err != nil {
			t.Fatal(err)
		}
		if got := envOf(c, "NVIDIA_VISIBLE_DEVICES"); got != n.GPUs[3].UUID {
			t.Errorf("CDI annotation in ml: NVIDIA_VISIBLE_DEVICES=%q\n%s", got, c.view())
		}
		if e := openError(c, fmt.Sprintf("/dev/nvidia%d", n.GPUs[3].Minor)); !strings.Contains(e, enxio) {
			t.Errorf("opening the GPU: %q, want %q", e, enxio)
		}
	})

	t.Run("unmet requirement", func(t *testing.T) {
		_, err := w.runIn("ml", "newcuda", map[string]string{"gpus.nri-gpu.dev/pod": "1"},
			harness.ContainerSpec{Env: map[string]string{"NVIDIA_REQUIRE_CUDA": "cuda>=13.5"}})
		want := "nri-gpu: env NVIDIA_REQUIRE_CUDA: requirement error: unsatisfied condition: cuda>=13.5, please update your driver to a newer version, or use an earlier cuda container"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want one containing %q", err, want)
		}
	})

	t.Run("GPU node already from the runtime", func(t *testing.T) {
		g := n.GPUs[0]
		node := fmt.Sprintf("/dev/nvidia%d", g.Minor)
		c, err := w.runIn("ml", "hasgpu", map[string]string{"gpus.nri-gpu.dev/pod": "device=0"}, harness.ContainerSpec{
			Image:   harness.GlibcImage,
			Devices: []*runtimeapi.Device{{HostPath: n.HostPath(node), ContainerPath: node, Permissions: "rw"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(w.plugin.log.String(), "the runtime already gives the container "+node) {
			t.Errorf("no log line naming %s:\n%s", node, w.plugin.log.String())
		}
		if e := openError(c, node); !strings.Contains(e, enxio) {
			t.Errorf("opening %s: %q, want %q", node, e, enxio)
		}
		if out, code := c.sh("gpucheck cuda nvml"); code != 0 || !strings.Contains(out, "devices=1") {
			t.Errorf("the container cannot use its GPU: %s\n%s", out, c.view())
		}
	})

	t.Run("CDI devices already from the runtime", func(t *testing.T) {
		spec := filepath.Join(w.c.CDIDir(), "nri-gpu.yaml")
		if out, err := exec.Command(nriGPU(t), "cdi", "generate", "--config", n.config, "-o", spec).CombinedOutput(); err != nil {
			t.Fatalf("nri-gpu cdi generate: %v\n%s", err, out)
		}
		c, err := w.runIn("ml", "hascdi", map[string]string{"gpus.nri-gpu.dev/pod": "all"}, harness.ContainerSpec{CDIDevices: []string{"nvidia.com/gpu=1"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := gpuNodes(c); len(got) != 1 || got[0] != fmt.Sprintf("/dev/nvidia%d", n.GPUs[1].Minor) {
			t.Errorf("GPU nodes %q, want only GPU 1's (from the runtime's CDI)\n%s", got, c.view())
		}
		// containerd 2.4 lists the CDI devices in NRI; 2.2 has resolved
		// them into the spec's device nodes (and mounts) before NRI sees
		// it: either way nri-gpu adds no GPU.
		found := false
		for _, line := range strings.Split(w.plugin.log.String(), "\n") {
			found = found || strings.Contains(line, "container=hascdi") && strings.Contains(line, "the runtime already gives the container") &&
				strings.Contains(line, "nothing injected") && (strings.Contains(line, "nvidia.com/gpu=1") || strings.Contains(line, fmt.Sprintf("/dev/nvidia%d", n.GPUs[1].Minor)))
		}
		if !found {
			t.Errorf("no log line for the runtime's CDI devices:\n%s", w.plugin.log.String())
		}
	})
}
