package suite

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// cudaImagePath and cudaImageLibraryPath are the PATH and LD_LIBRARY_PATH
// nvidia/cuda images set, which list the default layout's directories.
const (
	cudaImagePath        = "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	cudaImageLibraryPath = "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
)

// TestDefaultLayout checks the default layout (layout: nvidia): the
// driver's binaries come as one directory mount at /usr/local/nvidia/bin,
// appended to the image's PATH, and run by name from there; nothing is
// mounted at /usr/bin; the library directory holds libcuda.so, which a
// search of the library path by that name (what -lcuda and JIT linkers
// do) finds and loads; a container whose pod spec sets its own
// LD_LIBRARY_PATH still loads libcuda.so.1; an nvidia/cuda-like image
// keeps its PATH and LD_LIBRARY_PATH as they are; a compute-only request
// gets the MPS binaries but not nvidia-smi.
//
// On CRI-O 1.34 an image that sets PATH (as this one does) cannot have it
// extended: CRI-O shows a plugin PATH twice (its spec template's, then the
// image's) and keeps the image's over the plugin's. There the binaries go
// one by one to /usr/bin instead, still run by name, PATH stays the image's,
// and nri-gpu says so once per connection (docs/compatibility.md); the
// nvidia/cuda-like image, whose PATH lists the directory, gets the directory.
func TestDefaultLayout(t *testing.T) {
	const dir = "/usr/local/nvidia/bin"
	w := newWorld(t, simnode.LayoutDebian, "")
	c := w.mustRun("default", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{Image: harness.GlibcImage})
	binDir, binMounts, wantPath := dir, "1", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:"+dir
	if onCRIO() {
		binDir, binMounts, wantPath = "/usr/bin", "0", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	if out, code := c.sh("command -v nvidia-smi && nvidia-smi"); code != 0 || !strings.HasPrefix(out, binDir+"/nvidia-smi\n") || !strings.Contains(out, "NVIDIA-SMI "+w.node.DriverVersion) {
		t.Errorf("nvidia-smi by name: exit %d, want it from %s\n%s\n%s", code, binDir, out, c.view())
	}
	if path := envOf(c, "PATH"); path != wantPath {
		t.Errorf("PATH=%q on %s: want %q", path, runtimeName(), wantPath)
	}
	if out, code := c.sh("ls /usr/bin | grep nvidia"); code == 0 && !onCRIO() {
		t.Errorf("binaries at /usr/bin in the default layout:\n%s", out)
	}
	// One mount for each directory, read-only, and the libraries load.
	for d, want := range map[string]string{dir: binMounts, "/usr/local/nvidia/lib64": "1"} {
		if out, _ := c.sh("grep -c ' " + d + " ' /proc/self/mountinfo"); strings.TrimSpace(out) != want {
			t.Errorf("mounts at %s: %q, want %s\n%s", d, out, want, c.view())
		}
	}
	if out, code := c.sh("echo x > " + binDir + "/nvidia-smi"); code == 0 {
		t.Errorf("wrote to %s/nvidia-smi: %q", binDir, out)
	}
	// libcuda.so: a link to libcuda.so.1 in the directory, found by the
	// loader's search of LD_LIBRARY_PATH by that name.
	if out, code := c.sh("readlink /usr/local/nvidia/lib64/libcuda.so && gpucheck cuda-dev cuda nvml"); code != 0 ||
		!strings.HasPrefix(out, "libcuda.so.1\n") || !strings.Contains(out, "libcuda.so: ok") {
		t.Errorf("libcuda.so by a library path search:\n%s\n%s", out, c.view())
	}

	// The pod spec's own LD_LIBRARY_PATH: the directory is appended.
	own := w.mustRun("ownldpath", map[string]string{"gpus.nri-gpu.dev/pod": "1"},
		harness.ContainerSpec{Image: harness.GlibcImage, Env: map[string]string{"LD_LIBRARY_PATH": "/opt/mine/lib"}})
	if got := envOf(own, "LD_LIBRARY_PATH"); got != "/opt/mine/lib:/usr/local/nvidia/lib64" {
		t.Errorf("pod spec LD_LIBRARY_PATH=/opt/mine/lib: got %q", got)
	}
	if out, code := own.sh("gpucheck cuda"); code != 0 || !strings.Contains(out, "libcuda.so.1: ok") {
		t.Errorf("a pod spec with its own LD_LIBRARY_PATH does not load the driver:\n%s\n%s", out, own.view())
	}

	// An nvidia/cuda-like image: its env lists the directories already.
	cuda := w.mustRun("cudaimage", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{Image: harness.GlibcImage, Env: map[string]string{
		"PATH": cudaImagePath, "LD_LIBRARY_PATH": cudaImageLibraryPath,
		"NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0",
	}})
	for k, want := range map[string]string{"PATH": cudaImagePath, "LD_LIBRARY_PATH": cudaImageLibraryPath,
		"NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"} {
		if got := envOf(cuda, k); got != want {
			t.Errorf("nvidia/cuda-like image: %s=%q, want it untouched (%q)", k, got, want)
		}
	}
	if out, code := cuda.sh("command -v nvidia-smi && nvidia-smi >/dev/null && gpucheck cuda-dev cuda nvml"); code != 0 || !strings.HasPrefix(out, dir+"/nvidia-smi\n") {
		t.Errorf("nvidia/cuda-like image: want nvidia-smi from %s\n%s\n%s", dir, out, cuda.view())
	}

	cc := w.mustRun("computeonly", map[string]string{"gpus.nri-gpu.dev/pod": "1,capabilities=compute"}, harness.ContainerSpec{Image: harness.GlibcImage})
	if out, _ := cc.sh("ls " + binDir + " | grep nvidia"); !strings.Contains(out, "nvidia-cuda-mps-control") || strings.Contains(out, "nvidia-smi") {
		t.Errorf("compute-only request: %s holds %q, want the MPS binaries and no nvidia-smi", binDir, out)
	}

	// The fallback is said once per connection, on CRI-O only.
	warn := "driver binaries are mounted at /usr/bin instead of " + dir
	want := 0
	if onCRIO() {
		want = 1
	}
	if got := strings.Count(w.plugin.log.String(), warn); got != want {
		t.Errorf("%d warnings %q on %s, want %d:\n%s", got, warn, runtimeName(), want, w.plugin.log.String())
	}
}

// TestToolkitLayout checks layout: toolkit: each binary at /usr/bin (what
// images that run /usr/bin/nvidia-smi need), PATH left as the image set
// it, no /usr/local/nvidia/bin; the libraries as in the default layout.
func TestToolkitLayout(t *testing.T) {
	w := newWorld(t, simnode.LayoutRHEL, "layout: toolkit\n")
	c := w.mustRun("toolkit", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{Image: harness.GlibcImage})
	if out, code := c.sh("/usr/bin/nvidia-smi"); code != 0 || !strings.Contains(out, "NVIDIA-SMI "+w.node.DriverVersion) {
		t.Errorf("/usr/bin/nvidia-smi: exit %d\n%s\n%s", code, out, c.view())
	}
	if path := envOf(c, "PATH"); path != "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" {
		t.Errorf("PATH=%q: want the image's own", path)
	}
	if out, code := c.sh("ls /usr/local/nvidia/bin"); code == 0 {
		t.Errorf("layout toolkit: /usr/local/nvidia/bin exists:\n%s", out)
	}
	if out, code := c.sh("gpucheck cuda-dev cuda nvml"); code != 0 {
		t.Errorf("gpucheck:\n%s\n%s", out, c.view())
	}
}

// TestCreatedDeviceNodeDenied checks what docs/security.md says of a
// driver with ModifyDeviceFiles=1, where nvidia-smi run as root may create
// device nodes in a container for GPUs it was not given: a root container
// given GPU 0 can make a node with GPU 1's numbers, but the cgroup's device
// rules deny opening it (EPERM), while its own GPU's numbers open as far
// as the simulated node allows (ENXIO: no real device behind them). CRI-O's
// default capabilities leave out CAP_MKNOD (containerd's include it): there
// the container asks for it, as a pod's securityContext can.
func TestCreatedDeviceNodeDenied(t *testing.T) {
	w := newWorld(t, simnode.LayoutRHEL, "")
	g0, g1 := w.node.GPUs[0], w.node.GPUs[1]
	var spec harness.ContainerSpec
	if onCRIO() {
		spec.AddCaps = []string{"MKNOD"}
	}
	c := w.mustRun("mknod", map[string]string{"gpus.nri-gpu.dev/pod": "device=0"}, spec)
	if out, code := c.sh(fmt.Sprintf("mknod /tmp/other c 195 %d && echo made", g1.Minor)); code != 0 || !strings.Contains(out, "made") {
		t.Fatalf("mknod of GPU 1's node (195:%d) as root failed, so the check below proves nothing: %q", g1.Minor, out)
	}
	if e := openError(c, "/tmp/other"); !strings.Contains(e, eperm) {
		t.Errorf("opening a hand-made node of GPU 1 (195:%d): %q, want %q (the cgroup must deny it)", g1.Minor, e, eperm)
	}
	if out, code := c.sh(fmt.Sprintf("mknod /tmp/own c 195 %d", g0.Minor)); code != 0 {
		t.Fatalf("mknod of GPU 0's node: %q", out)
	}
	if e := openError(c, "/tmp/own"); !strings.Contains(e, enxio) {
		t.Errorf("opening a hand-made node of the given GPU 0 (195:%d): %q, want %q (allowed by the cgroup)", g0.Minor, e, enxio)
	}
}
