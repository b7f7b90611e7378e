package suite

import (
	"fmt"
	"os"
	"os/exec"
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
	c := startRuntime(t, harness.RuntimeOptions{})
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

// TestNVIDIADevicePluginCDIOnContainerd: DEVICE_LIST_STRATEGY=cdi-cri on a
// real containerd: the kubelet passes NVIDIA's device plugin's CDI device
// (k8s.device-plugin.nvidia.com/gpu=<UUID>, from a spec in the runtime's
// CDI directory) and containerd resolves it. nri-gpu injects nothing on
// top (the image's NVIDIA_VISIBLE_DEVICES=all, allowed here, does not
// make it inject the driver a second time), and books the GPU as the
// runtime's, so that a count request cannot have it.
func TestNVIDIADevicePluginCDIOnContainerd(t *testing.T) {
	c := startRuntime(t, harness.RuntimeOptions{})
	n := newNode(t, simnode.LayoutDebian, "sharing: exclusive\n")
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: t.Context()}
	socket := filepath.Join(t.TempDir(), "status.sock")
	w.plugin = startPlugin(t, c, n, "--status-socket", socket)
	// The device plugin's spec: nri-gpu's own, under the plugin's kind.
	out, err := exec.Command(nriGPU(t), "cdi", "generate", "--config", n.config, "-o", "-").CombinedOutput()
	if err != nil {
		t.Fatalf("nri-gpu cdi generate: %v\n%s", err, out)
	}
	spec := strings.Replace(string(out), "kind: nvidia.com/gpu", "kind: k8s.device-plugin.nvidia.com/gpu", 1)
	if spec == string(out) {
		t.Fatalf("no kind line in the spec:\n%s", out)
	}
	if err := os.WriteFile(filepath.Join(c.CDIDir(), "k8s.device-plugin.nvidia.com-gpu.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	g := n.GPUs[1]
	e := w.mustRun("cdicri", nil, harness.ContainerSpec{Image: harness.GlibcImage, CDIDevices: []string{"k8s.device-plugin.nvidia.com/gpu=" + g.UUID},
		Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}})
	if out, code := e.sh("gpucheck cuda nvml"); code != 0 || !strings.Contains(out, "devices=1") {
		t.Errorf("gpucheck:\n%s\n%s", out, e.view())
	}
	// containerd 2.4 lists the CDI device in NRI; containerd 2.2 and 1.7
	// and CRI-O have resolved it into device nodes and mounts before NRI
	// sees the container: either way nri-gpu injects nothing.
	want := "the runtime already gives the container the CDI devices k8s.device-plugin.nvidia.com/gpu=" + g.UUID + ": nothing injected"
	if runtimeName() != harness.RuntimeContainerd24 {
		want = fmt.Sprintf("the runtime already gives the container /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools, /dev/nvidia%d and every driver file: nothing injected", g.Minor)
	}
	if log := w.plugin.log.String(); !strings.Contains(log, want) {
		t.Errorf("nri-gpu did not leave the runtime's CDI device alone on %s, want %q:\n%s", runtimeName(), want, log)
	}
	if got, want := allocTable(t, socket), "0=free 1=exclusive[default/cdicri/cdicri] 2=free 3=free"; got != want {
		t.Errorf("table %s\nwant %s", got, want)
	}
	if _, err := w.run("count", map[string]string{"gpus.nri-gpu.dev/pod": "4"}, harness.ContainerSpec{}); err == nil {
		t.Error("a count of 4 was met while the runtime gave GPU 1 to a container")
	}
}
