package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// podSpec is the part of the DaemonSet the emulation reads.
type podSpec struct {
	Spec struct {
		Template struct {
			Spec struct {
				Containers []struct {
					Args         []string `json:"args"`
					VolumeMounts []struct {
						Name      string `json:"name"`
						MountPath string `json:"mountPath"`
						ReadOnly  bool   `json:"readOnly"`
					} `json:"volumeMounts"`
				} `json:"containers"`
				Volumes []struct {
					Name     string `json:"name"`
					HostPath *struct {
						Path string `json:"path"`
					} `json:"hostPath"`
					ConfigMap *struct {
						Name string `json:"name"`
					} `json:"configMap"`
					EmptyDir *struct{} `json:"emptyDir"`
				} `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

// dsLayout is nri-gpu running as the DaemonSet runs it (startDaemonSet):
// its simulated node, the runtime side it serves, its process and the
// stand-in kubelet's device plugin directory.
type dsLayout struct {
	n          *simnode.Node
	r          *runtimeSide
	p          *pluginProc
	kubeletDir string
}

// create sends ctr through NRI, of its pod in namespace ns with the
// annotations ann.
func (l *dsLayout) create(ns string, ann map[string]string, ctr *api.Container) (*api.ContainerAdjustment, error) {
	rpl, err := l.r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{
		Pod: &api.PodSandbox{Id: ctr.PodSandboxId, Name: ctr.PodSandboxId, Namespace: ns, Uid: "uid-" + ctr.Name, Annotations: ann}, Container: ctr})
	return rpl.GetAdjust(), err
}

// container is container name of pod pod-<name>, with PATH and env.
func container(name string, env ...string) *api.Container {
	return &api.Container{Id: "ctr-" + name, PodSandboxId: "pod-" + name, Name: name, Env: append([]string{"PATH=/usr/bin:/bin"}, env...), Linux: &api.LinuxContainer{}}
}

// withNodes adds the device nodes of gpus to ctr, as the runtime does for
// a device plugin's DeviceSpecs.
func withNodes(ctr *api.Container, gpus ...simnode.GPU) *api.Container {
	for _, g := range gpus {
		ctr.Linux.Devices = append(ctr.Linux.Devices, &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", g.Minor), Type: "c", Major: 195, Minor: int64(g.Minor)})
	}
	return ctr
}

// devicePlugin is container name as NVIDIA's device plugin's answer
// (volume-mounts list, PASS_DEVICE_SPECS) makes it: every GPU's list
// entry and node.
func (l *dsLayout) devicePlugin(name string, env ...string) *api.Container {
	ctr := withNodes(container(name, env...), l.n.GPUs...)
	for _, g := range l.n.GPUs {
		ctr.Mounts = append(ctr.Mounts, &api.Mount{Source: "/dev/null", Destination: "/var/run/nvidia-container-devices/" + g.UUID})
	}
	return ctr
}

// startDaemonSet runs nri-gpu as deploy/kubernetes's DaemonSet runs it:
// in a root of its own (chroot, private mount namespace) holding exactly
// the DaemonSet's volume mounts, read-only where it says so, with the host
// paths mapped to a simulated node of 2 GPUs (/ -> the node, /proc and
// /dev -> the node's, /var/run/nri -> the test runtime's socket directory,
// /var/lib/nri-gpu -> the node's), the ConfigMap's configuration at its
// mount path, and the container's arguments (the metrics port aside). It
// returns once the plugin connected, answers and reports ready.
func startDaemonSet(t *testing.T) *dsLayout {
	t.Helper()
	needRoot(t)
	for _, tool := range []string{"unshare", "mount", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..")
	var ds podSpec
	var cm struct {
		Data map[string]string `json:"data"`
	}
	for path, into := range map[string]any{"deploy/kubernetes/daemonset.yaml": &ds, "deploy/kubernetes/configmap.yaml": &cm} {
		data, err := os.ReadFile(filepath.Join(repo, path))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, into); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	pod := ds.Spec.Template.Spec
	ctr := pod.Containers[0]

	dir := shortTempDir(t)
	n, err := simnode.Generate(filepath.Join(dir, "node"), simnode.Options{NumGPUs: 2, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	r := startRuntime(t, dir)
	t.Cleanup(r.stop)

	// The image's binary (CGO_ENABLED=0, as deploy/Dockerfile builds
	// it): the root holds nothing else but the C library that the image's
	// base (distroless base-nossl) has and that it needs to load NVML.
	bin := filepath.Join(dir, "nri-gpu-nocgo")
	build := exec.Command("go", "build", "-o", bin, "./cmd/nri-gpu")
	build.Dir, build.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 build: %v\n%s", err, out)
	}

	root := filepath.Join(dir, "root")
	// The kubelet's device plugin directory: a stand-in (the kubelet
	// makes it; type Directory), where nri-gpu's device plugin serves.
	kubeletDir := filepath.Join(dir, "device-plugins")
	if err := os.Mkdir(kubeletDir, 0o755); err != nil {
		t.Fatal(err)
	}
	hostSource := map[string]string{"/": n.Root, "/proc": n.HostPath("/proc"), "/dev": n.HostPath("/dev"), "/var/run/nri": dir,
		"/var/lib/nri-gpu": n.HostPath("/var/lib/nri-gpu"), "/var/lib/kubelet/device-plugins": kubeletDir, "/dev/char": n.HostPath("/dev/char"),
		"/sys": n.HostPath("/sys"), "/run/nri-gpu/mps": n.HostPath("/run/nri-gpu/mps")}
	for _, d := range []string{"/var/lib/nri-gpu", "/run/nri-gpu/mps"} {
		if err := os.MkdirAll(n.HostPath(d), 0o755); err != nil { // type: DirectoryOrCreate
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(n.HostPath("/dev/char"), 0o755); err != nil { // type: Directory, as udev makes it
		t.Fatal(err)
	}
	var script []string
	// readOnlyRootFilesystem: the root is a read-only bind of itself, with
	// the volumes mounted on it (their mount points made beforehand).
	script = append(script, "set -e", "mount --make-rprivate /",
		fmt.Sprintf("mount --bind %q %q", root, root), fmt.Sprintf("mount -o remount,bind,ro %q", root))
	volumes := map[string]int{}
	for i, v := range pod.Volumes {
		volumes[v.Name] = i
	}
	for _, m := range ctr.VolumeMounts {
		v := pod.Volumes[volumes[m.Name]]
		target := filepath.Join(root, m.MountPath)
		switch {
		case v.ConfigMap != nil:
			for k, val := range cm.Data {
				os.MkdirAll(target, 0o755)
				os.WriteFile(filepath.Join(target, k), []byte(val), 0o644)
			}
		case v.EmptyDir != nil:
			os.MkdirAll(target, 0o755)
			script = append(script, fmt.Sprintf("mount -t tmpfs tmpfs %q", target))
		case v.HostPath != nil:
			src, ok := hostSource[v.HostPath.Path]
			if !ok {
				t.Fatalf("host path %s has no stand-in", v.HostPath.Path)
			}
			os.MkdirAll(target, 0o755)
			// A mount point inside an earlier volume (the MPS root
			// inside /run/nri-gpu's emptyDir) is made there, as the
			// runtime makes it.
			script = append(script, fmt.Sprintf("[ -d %q ] || mkdir -p %q", target, target))
			script = append(script, fmt.Sprintf("mount --rbind %q %q", src, target))
			if m.ReadOnly {
				script = append(script, fmt.Sprintf("mount -o remount,bind,ro %q", target))
			}
		}
	}
	os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755)
	os.MkdirAll(filepath.Join(root, "proc"), 0o755)
	data, _ := os.ReadFile(bin)
	os.WriteFile(filepath.Join(root, "usr/bin/nri-gpu"), data, 0o755)
	copyCLibrary(t, bin, root)
	script = append(script, fmt.Sprintf("mount -t proc proc %q", filepath.Join(root, "proc")))

	args := []string{}
	for _, a := range ctr.Args {
		if strings.HasPrefix(a, "--metrics-addr=") {
			a = "--metrics-addr=127.0.0.1:0"
		}
		args = append(args, fmt.Sprintf("%q", a))
	}
	// The runtime side listens on dir/nri.sock; the pod's socket path is
	// /var/run/nri/nri.sock, which the /var/run/nri mount maps to dir.
	script = append(script, fmt.Sprintf("exec chroot %q /usr/bin/nri-gpu %s", root, strings.Join(args, " ")))
	p := startCommand(t, "unshare", "-m", "sh", "-c", strings.Join(script, "\n"))
	url := metricsURL(t, p)
	l := &dsLayout{n: n, r: r, p: p, kubeletDir: kubeletDir}
	// The shipped policy refuses waitSynced's probe (the environment);
	// the device plugin's answer is the probe here.
	select {
	case <-r.synced:
	case <-time.After(20 * time.Second):
		t.Fatal("the plugin did not connect and synchronize")
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if adj, err := l.create("default", nil, l.devicePlugin("probe")); err == nil && len(adj.GetLinux().GetDevices()) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the plugin synchronized but does not answer")
		}
	}
	if code, body := httpGet(t, url+"/readyz"); code != 200 {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	return l
}

// TestDaemonSetLayout: nri-gpu run as the DaemonSet runs it
// (startDaemonSet) connects, reports ready and injects from the node, with
// its library directories prepared in the only writable host directory,
// as copies (the driver root is read-only). Under the shipped
// configuration (a closed policy, the device plugin on), each container
// gets exactly its answer.
func TestDaemonSetLayout(t *testing.T) {
	l := startDaemonSet(t)
	n := l.n
	g0, g1 := n.GPUs[0], n.GPUs[1]
	voided := &answer{Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}}
	// served is the answer of a container given gpus by the runtime
	// (their nodes there) under the shipped layout: the control nodes,
	// the prepared library and binary directories, the environment.
	served := func(gpus ...simnode.GPU) *answer {
		var ids []string
		for _, g := range gpus {
			ids = append(ids, g.UUID)
		}
		return &answer{Devices: []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"},
			Mounts: []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/bin"},
			Env:    map[string]string{"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64", "NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ","), "PATH": "/usr/bin:/bin:/usr/local/nvidia/bin"}}
	}
	graphics := &answer{Devices: []string{"/dev/nvidiactl", "/dev/dri/card1", "/dev/dri/renderD129", "/dev/dri/card2", "/dev/dri/renderD130"},
		Mounts: []string{"/etc/OpenCL/vendors/nvidia.icd", "/etc/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
			"/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json", "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
			"/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json", "/usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json",
			"/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/nvidia/nvoptix.bin", "/usr/local/nvidia/lib64",
			"/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf", "/dev/dri/by-path"},
		Env: map[string]string{"GBM_BACKENDS_PATH": "/usr/local/nvidia/lib64/gbm", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64", "NVIDIA_VISIBLE_DEVICES": g0.UUID + "," + g1.UUID}}
	got := map[string]*api.ContainerAdjustment{}
	for _, tc := range []struct {
		name string
		ns   string
		ann  map[string]string // the pod's annotations
		ctr  *api.Container
		want *answer
		err  string // a part of the error; "" for none
	}{
		{"an annotation is refused", "default", map[string]string{"gpus.nri-gpu.dev/pod": "all"}, container("ann"), nil,
			`not allowed in namespace "default" (policy.annotationNamespaces: [] (none: policy.default is deny))`},
		{"the image's NVIDIA_VISIBLE_DEVICES=all is voided", "default", nil, container("env", "NVIDIA_VISIBLE_DEVICES=all"), voided, ""},
		// The GPUs' nodes are there; nri-gpu adds the control nodes and
		// the driver files.
		{"the device plugin's answer", "default", nil, l.devicePlugin("ds"), served(g0, g1), ""},
		// The GPU's node and the kubelet's annotation, as the kubelet
		// makes the container from nri-gpu's Allocate: the kubelet's
		// assignment, with the driver files.
		{"the kubelet's assignment", "tenant-a", nil, withNodes(&api.Container{Id: "ctr-k", PodSandboxId: "pod-k", Name: "k", Env: []string{"PATH=/usr/bin:/bin"},
			Annotations: map[string]string{"gpus.nri-gpu.dev/kubelet.nvidia.com_gpu": g1.UUID}, Linux: &api.LinuxContainer{}}, g1), served(g1), ""},
		{"the kubelet's assignment of a container made before one annotation per resource", "tenant-a", nil,
			withNodes(&api.Container{Id: "ctr-k0", PodSandboxId: "pod-k0", Name: "k0", Env: []string{"PATH=/usr/bin:/bin"},
				Annotations: map[string]string{"gpus.nri-gpu.dev/kubelet": g1.UUID}, Linux: &api.LinuxContainer{}}, g1), served(g1), ""},
		// Only the device plugins' allocations get GPUs: the kubelet's
		// annotation without the GPU's node (a pod's forgery) gets
		// nothing; NVIDIA's device plugin's envvar output with its
		// device specs gets the driver for that GPU, without them it is
		// voided.
		{"a forged kubelet annotation is voided", "tenant-b", nil, func() *api.Container {
			c := container("forged", "NVIDIA_VISIBLE_DEVICES="+g0.UUID)
			c.Annotations = map[string]string{"gpus.nri-gpu.dev/kubelet": g0.UUID}
			return c
		}(), voided, ""},
		{"NVIDIA's envvar output without device specs is voided", "tenant-b", nil, container("envvar", "NVIDIA_VISIBLE_DEVICES="+g0.UUID), voided, ""},
		{"NVIDIA's envvar output with device specs", "tenant-b", nil, withNodes(container("envvar-specs", "NVIDIA_VISIBLE_DEVICES="+g0.UUID), g0), served(g0), ""},
		// A graphics container gets its GPUs' DRM nodes, found through
		// the host's /sys (/host/sys), and the profile prepared in the
		// cache.
		{"graphics", "default", nil, l.devicePlugin("gfx", "NVIDIA_DRIVER_CAPABILITIES=graphics"), graphics, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adj, err := l.create(tc.ns, tc.ann, tc.ctr)
			got[tc.name] = adj
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("error %v, want one with %q", err, tc.err)
			}
			if d := cmp.Diff(tc.want, answerOf(adj), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("answer (-want +got):\n%s", d)
			}
		})
	}
	// Their record is in the host's /var/lib/nri-gpu, beside the library
	// cache, where a replaced pod finds it (not in the pod's emptyDir).
	if data, err := os.ReadFile(n.HostPath("/var/lib/nri-gpu/devchar-links.json")); err != nil || !strings.Contains(string(data), `"195:`) {
		t.Errorf("no record of the /dev/char links in the host's /var/lib/nri-gpu: %v %s", err, data)
	}

	t.Run("devCharLinks", func(t *testing.T) {
		// The pod made the GPUs' /dev/char links in the host's
		// /dev/char, writable on top of the read-only /dev.
		for _, g := range n.GPUs {
			link := fmt.Sprintf("/dev/char/195:%d", g.Minor)
			if target, err := os.Readlink(n.HostPath(link)); err != nil || target != fmt.Sprintf("../nvidia%d", g.Minor) {
				t.Errorf("host %s -> %q (%v), want ../nvidia%d", link, target, err, g.Minor)
			}
		}
	})
	t.Run("mount sources are the node's", func(t *testing.T) {
		// Mount sources are host paths (driverRoot /), and exist on the
		// "host" (the node).
		for _, m := range got["the device plugin's answer"].GetMounts() {
			if _, err := os.Stat(n.HostPath(m.Source)); err != nil {
				t.Errorf("mount source %s is not a host path of the node: %v", m.Source, err)
			}
		}
	})
	t.Run("library directories copied into /var/lib/nri-gpu", func(t *testing.T) {
		libDir := ""
		for _, m := range got["the device plugin's answer"].GetMounts() {
			if m.Destination == "/usr/local/nvidia/lib64" {
				libDir = n.HostPath(m.Source)
			}
		}
		cuda, err := os.ReadFile(filepath.Join(libDir, "libcuda.so.1"))
		if err != nil || len(cuda) == 0 || !strings.HasPrefix(libDir, n.HostPath("/var/lib/nri-gpu")+"/") {
			t.Errorf("library directory %q (host view) has no libcuda.so.1: %v", libDir, err)
		}
	})
	t.Run("graphics profile", func(t *testing.T) {
		profile := ""
		for _, m := range got["graphics"].GetMounts() {
			if m.Destination == "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf" {
				profile = n.HostPath(m.Source)
			}
		}
		if data, err := os.ReadFile(profile); err != nil || !strings.Contains(string(data), "EGLVisibleDGPUDevices") {
			t.Errorf("application profile %q: %q, %v", profile, data, err)
		}
	})
	t.Run("device plugin socket", func(t *testing.T) {
		// The device plugin (on in the shipped ConfigMap) serves its
		// socket in the kubelet's directory, through the read-write
		// mount.
		sock := filepath.Join(l.kubeletDir, "nri-gpu-nvidia.com-gpu.sock")
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if fi, err := os.Lstat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the device plugin's socket %s did not appear:\n%s", sock, l.p.log.String())
			}
		}
	})
	t.Run("log", func(t *testing.T) {
		for _, want := range []string{
			"serving status on /run/nri-gpu/status.sock",    // the status socket
			"library directories ready in /var/lib/nri-gpu", // the library directories
			"the cache holds its own copy of each",          // copied from the read-only driver root
		} {
			if !strings.Contains(l.p.log.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, l.p.log.String())
			}
		}
	})
}

// copyCLibrary copies into root, at their host paths, the dynamic loader
// and the C libraries bin needs (as ldd lists them): what the image's
// distroless base provides.
func copyCLibrary(t *testing.T, bin, root string) {
	t.Helper()
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("ldd %s: %v\n%s", bin, err, out)
	}
	for _, f := range strings.Fields(string(out)) {
		if !strings.HasPrefix(f, "/") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}
