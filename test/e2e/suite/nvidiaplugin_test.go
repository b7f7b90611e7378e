package suite

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestNVIDIADevicePluginOnContainerd: containers as the kubelet creates
// them from NVIDIA's device plugin's Allocate answer, on a real containerd,
// under the shipped closed policy (policy.default: deny):
// DEVICE_LIST_STRATEGY=envvar with PASS_DEVICE_SPECS=true (NVIDIA_VISIBLE_DEVICES
// naming the GPU, the GPU's and the control nodes as CRI devices) gets the
// driver from nri-gpu and sees exactly its GPU; volume-mounts without
// device specs (what a hostPath volume can forge) is refused.
func TestNVIDIADevicePluginOnContainerd(t *testing.T) {
	c := harness.StartForTest(t, harness.ContainerdOptions{})
	n := newNode(t, simnode.LayoutRHEL, "policy:\n  default: deny\n")
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: t.Context()}
	socket := filepath.Join(t.TempDir(), "status.sock")
	w.plugin = startPlugin(t, c, n, "--status-socket", socket)
	g := n.GPUs[2]
	dev := func(name string) *runtimeapi.Device {
		return &runtimeapi.Device{HostPath: filepath.Join(n.Root, "dev", name), ContainerPath: "/dev/" + name, Permissions: "rw"}
	}
	specs := []*runtimeapi.Device{dev(fmt.Sprint("nvidia", g.Minor))}
	for _, ctl := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} {
		if _, err := os.Stat(filepath.Join(n.Root, "dev", ctl)); err == nil { // the plugin passes those that exist
			specs = append(specs, dev(ctl))
		}
	}

	// envvar + PASS_DEVICE_SPECS: the kubelet's env replaces the image's.
	e := w.mustRun("envvar", nil, harness.ContainerSpec{Image: harness.GlibcImage, Devices: specs,
		Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": g.UUID, "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}})
	if got := gpuNodes(e); len(got) != 1 || got[0] != fmt.Sprint("/dev/nvidia", g.Minor) {
		t.Errorf("GPU nodes %q, want /dev/nvidia%d only", got, g.Minor)
	}
	if out, code := e.sh("gpucheck cuda nvml"); code != 0 || !strings.Contains(out, "libcuda.so.1: ok") || !strings.Contains(out, "devices=1") {
		t.Errorf("gpucheck:\n%s\n%s", out, e.view())
	}
	if v := envOf(e, "NVIDIA_VISIBLE_DEVICES"); v != g.UUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %s", v, g.UUID)
	}
	// Booked as the runtime's (the kubelet's) choice.
	if got, want := allocTable(t, socket), "0=free 1=free 2=shared[default/envvar/envvar] 3=free"; got != want {
		t.Errorf("table %s\nwant %s", got, want)
	}

	// volume-mounts without device specs: the list alone, as a pod with a
	// hostPath volume could write it.
	var list []*runtimeapi.Mount
	for _, x := range n.GPUs {
		list = append(list, &runtimeapi.Mount{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/" + x.UUID})
	}
	_, err := w.run("list", nil, harness.ContainerSpec{Mounts: list, Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}})
	if err == nil || !strings.Contains(err.Error(), "PASS_DEVICE_SPECS=true") {
		t.Errorf("the device plugin's list without device nodes: %v, want a refusal naming PASS_DEVICE_SPECS=true", err)
	}
}
