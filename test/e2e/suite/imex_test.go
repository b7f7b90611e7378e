package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// imexWorld is a containerd with nri-gpu on a simulated node that has IMEX
// channels 0-2, as a GB200 NVL72 node does, under extraConfig.
func imexWorld(t *testing.T, extraConfig string) *world {
	t.Helper()
	c := startRuntime(t, harness.RuntimeOptions{})
	dir, err := os.MkdirTemp("", "nri-gpu-e2e-node-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sn, err := simnode.Generate(filepath.Join(dir, "root"), simnode.Options{NumGPUs: 2, DeviceNodes: true, IMEXChannels: 3})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	data := fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\n%s", sn.Root, sn.Root, extraConfig)
	if err := os.WriteFile(cfg, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	n := &node{Node: sn, config: cfg}
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: context.Background()}
	w.plugin = startPlugin(t, c, n)
	return w
}

// TestIMEXChannels: on a real containerd and runc, a container that asks
// for IMEX channel 1 gets exactly /dev/nvidia-caps-imex-channels/channel1,
// which it can open (ENXIO: the cgroup allows it, no driver behind the
// simulated major), while channel 0, made inside the container with the
// same major, is refused by the device cgroup (EPERM). A channel the node
// lacks and a namespace the policy does not list refuse the container.
func TestIMEXChannels(t *testing.T) {
	w := imexWorld(t, "policy:\n  imexNamespaces: [nvl72]\n")
	major := simnode.IMEXMajor(w.node.UVMMajor)

	check := func(t *testing.T, c *ctr) {
		t.Helper()
		out, _ := c.sh("ls /dev/nvidia-caps-imex-channels")
		if got := strings.Fields(out); len(got) != 1 || got[0] != "channel1" {
			t.Fatalf("IMEX channels in the container: %q, want [channel1]\n%s", got, c.view())
		}
		if got, want := majorMinor(c, "/dev/nvidia-caps-imex-channels/channel1"), fmt.Sprintf("%d:1", major); got != want {
			t.Errorf("channel1 is %s, want %s", got, want)
		}
		if e := openError(c, "/dev/nvidia-caps-imex-channels/channel1"); !strings.Contains(e, enxio) {
			t.Errorf("opening channel1: %q, want %q (allowed by the cgroup)", e, enxio)
		}
		out, code := c.sh(fmt.Sprintf("mknod /tmp/channel0 c %d 0 && head -c 1 /tmp/channel0 2>&1 >/dev/null", major))
		if code == 0 || !strings.Contains(out, eperm) {
			t.Errorf("opening channel 0 (mknod in the container): %q (exit %d), want %q from the device cgroup", out, code, eperm)
		}
	}

	t.Run("env", func(t *testing.T) {
		c, err := w.runIn("nvl72", "imexenv", nil, harness.ContainerSpec{Env: map[string]string{"NVIDIA_IMEX_CHANNELS": "1"}})
		if err != nil {
			t.Fatal(err)
		}
		check(t, c)
	})
	t.Run("annotation with a GPU", func(t *testing.T) {
		c, err := w.runIn("nvl72", "imexann", map[string]string{"gpus.nri-gpu.dev/pod": `1,"imex-channels=1"`}, harness.ContainerSpec{})
		if err != nil {
			t.Fatal(err)
		}
		check(t, c)
		if got := gpuNodes(c); len(got) != 1 {
			t.Errorf("GPU nodes %q, want one", got)
		}
	})
	t.Run("missing channel", func(t *testing.T) {
		_, err := w.runIn("nvl72", "imexmissing", nil, harness.ContainerSpec{Env: map[string]string{"NVIDIA_IMEX_CHANNELS": "1,5"}})
		if err == nil || !strings.Contains(err.Error(), `nri-gpu: env NVIDIA_IMEX_CHANNELS: unknown IMEX channel "5" (node has 0-2)`) {
			t.Errorf("channel 5: %v", err)
		}
	})
	t.Run("namespace not listed", func(t *testing.T) {
		_, err := w.runIn("default", "imexdenied", nil, harness.ContainerSpec{Env: map[string]string{"NVIDIA_IMEX_CHANNELS": "1"}})
		if err == nil || !strings.Contains(err.Error(), `nri-gpu: env NVIDIA_IMEX_CHANNELS: IMEX channels: not allowed in namespace "default" (policy.imexNamespaces: [nvl72])`) {
			t.Errorf("namespace default: %v", err)
		}
	})
}
