package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
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

// TestDaemonSetLayout runs nri-gpu as deploy/kubernetes's DaemonSet runs
// it: in a root of its own (chroot, private mount namespace) holding
// exactly the DaemonSet's volume mounts, read-only where it says so, with
// the host paths mapped to a simulated node (/ -> the node, /proc and
// /dev -> the node's, /var/run/nri -> the test runtime's socket
// directory, /var/lib/nri-gpu -> the node's), the ConfigMap's
// configuration at its mount path, and the container's arguments (the
// metrics port aside). The plugin must connect, report ready and inject
// from the node, with its library directories prepared in the only
// writable host directory, as copies (the driver root is read-only).
func TestDaemonSetLayout(t *testing.T) {
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
	defer r.stop()

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
		"/sys": n.HostPath("/sys")}
	if err := os.MkdirAll(n.HostPath("/var/lib/nri-gpu"), 0o755); err != nil { // type: DirectoryOrCreate
		t.Fatal(err)
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
	// The shipped policy refuses waitSynced's probe (the environment);
	// the device plugin's answer is the probe here.
	devicePlugin := func(name string, env ...string) (*api.ContainerAdjustment, error) {
		ctr := &api.Container{Id: "ctr-" + name, PodSandboxId: "pod-" + name, Name: name, Env: append([]string{"PATH=/usr/bin:/bin"}, env...), Linux: &api.LinuxContainer{}}
		for _, g := range n.GPUs {
			ctr.Mounts = append(ctr.Mounts, &api.Mount{Source: "/dev/null", Destination: "/var/run/nvidia-container-devices/" + g.UUID})
			ctr.Linux.Devices = append(ctr.Linux.Devices, &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", g.Minor), Type: "c", Major: 195, Minor: int64(g.Minor)})
		}
		rpl, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{
			Pod: &api.PodSandbox{Id: "pod-" + name, Name: "pod-" + name, Namespace: "default", Uid: "uid-" + name}, Container: ctr})
		return rpl.GetAdjust(), err
	}
	select {
	case <-r.synced:
	case <-time.After(20 * time.Second):
		t.Fatal("the plugin did not connect and synchronize")
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if adj, err := devicePlugin("probe"); err == nil && len(adj.GetLinux().GetDevices()) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the plugin synchronized but does not answer")
		}
	}
	if code, body := httpGet(t, url+"/readyz"); code != 200 {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	// devCharLinks: the pod made the GPUs' /dev/char links in the host's
	// /dev/char, writable on top of the read-only /dev.
	for _, g := range n.GPUs {
		link := fmt.Sprintf("/dev/char/195:%d", g.Minor)
		if target, err := os.Readlink(n.HostPath(link)); err != nil || target != fmt.Sprintf("../nvidia%d", g.Minor) {
			t.Errorf("host %s -> %q (%v), want ../nvidia%d", link, target, err, g.Minor)
		}
	}
	// Their record is in the host's /var/lib/nri-gpu, beside the library
	// cache, where a replaced pod finds it (not in the pod's emptyDir).
	if data, err := os.ReadFile(n.HostPath("/var/lib/nri-gpu/devchar-links.json")); err != nil || !strings.Contains(string(data), `"195:`) {
		t.Errorf("no record of the /dev/char links in the host's /var/lib/nri-gpu: %v %s", err, data)
	}

	// The shipped policy is closed: an annotation is refused, the
	// image's NVIDIA_VISIBLE_DEVICES=all is voided.
	if _, err := r.create(map[string]string{"gpus.nri-gpu.dev/pod": "all"}, "ann"); err == nil ||
		!strings.Contains(err.Error(), `not allowed in namespace "default" (policy.annotationNamespaces: [] (none: policy.default is deny))`) {
		t.Errorf("annotation under the shipped policy: %v", err)
	}
	if adj, err := r.create(nil, "env", "NVIDIA_VISIBLE_DEVICES=all"); err != nil || len(adj.GetLinux().GetDevices()) != 0 ||
		!slices.ContainsFunc(adj.GetEnv(), func(e *api.KeyValue) bool { return e.Key == "NVIDIA_VISIBLE_DEVICES" && e.Value == "void" }) {
		t.Errorf("env under the shipped policy: %v, %v", adj, err)
	}
	// The device plugin's answer (volume-mounts list, PASS_DEVICE_SPECS):
	// the GPUs' nodes are there; nri-gpu adds the control nodes and the
	// driver files.
	adj, err := devicePlugin("ds")
	if err != nil || len(adj.GetLinux().GetDevices()) != 3 || len(adj.GetMounts()) == 0 {
		t.Fatalf("CreateContainer: %v, %v", adj, err)
	}
	// Mount sources are host paths (driverRoot /), and exist on the
	// "host" (the node).
	for _, m := range adj.GetMounts() {
		if _, err := os.Stat(n.HostPath(m.Source)); err != nil {
			t.Errorf("mount source %s is not a host path of the node: %v", m.Source, err)
		}
	}
	// The device plugin (on in the shipped ConfigMap) serves its socket
	// in the kubelet's directory, through the read-write mount.
	sock := filepath.Join(kubeletDir, "nri-gpu-nvidia.com-gpu.sock")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if fi, err := os.Lstat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the device plugin's socket %s did not appear:\n%s", sock, p.log.String())
		}
	}
	// A container as the kubelet makes it from nri-gpu's Allocate: the
	// GPU's node and the kubelet's annotation. The shipped policy serves
	// it (the kubelet's assignment), with the driver files.
	g := n.GPUs[1]
	kctr := &api.Container{Id: "ctr-k", PodSandboxId: "pod-k", Name: "k", Env: []string{"PATH=/usr/bin:/bin"},
		Annotations: map[string]string{"gpus.nri-gpu.dev/kubelet": g.UUID},
		Linux:       &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: fmt.Sprintf("/dev/nvidia%d", g.Minor), Type: "c", Major: 195, Minor: int64(g.Minor)}}}}
	rpl, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{
		Pod: &api.PodSandbox{Id: "pod-k", Name: "pod-k", Namespace: "tenant-a", Uid: "uid-k"}, Container: kctr})
	kadj := rpl.GetAdjust()
	if err != nil || len(kadj.GetMounts()) == 0 || !slices.ContainsFunc(kadj.GetEnv(), func(e *api.KeyValue) bool { return e.Key == "NVIDIA_VISIBLE_DEVICES" && e.Value == g.UUID }) {
		t.Errorf("the kubelet's assignment under the shipped policy: %v, %v", kadj, err)
	}
	// Only the device plugins' allocations get GPUs under the shipped
	// configuration: the kubelet's annotation without the GPU's node (a
	// pod's forgery) gets nothing; NVIDIA's device plugin's envvar output
	// with its device specs gets the driver for that GPU, without them
	// it is voided.
	nvidia := func(name string, ann map[string]string, nodes bool) *api.ContainerAdjustment {
		t.Helper()
		g := n.GPUs[0]
		ctr := &api.Container{Id: "ctr-" + name, PodSandboxId: "pod-" + name, Name: name, Annotations: ann,
			Env: []string{"PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=" + g.UUID}, Linux: &api.LinuxContainer{}}
		if nodes {
			ctr.Linux.Devices = []*api.LinuxDevice{{Path: fmt.Sprintf("/dev/nvidia%d", g.Minor), Type: "c", Major: 195, Minor: int64(g.Minor)}}
		}
		rpl, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{
			Pod: &api.PodSandbox{Id: "pod-" + name, Name: "pod-" + name, Namespace: "tenant-b", Uid: "uid-" + name}, Container: ctr})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return rpl.GetAdjust()
	}
	voided := func(a *api.ContainerAdjustment) bool {
		return len(a.GetMounts()) == 0 && len(a.GetLinux().GetDevices()) == 0 &&
			slices.ContainsFunc(a.GetEnv(), func(e *api.KeyValue) bool { return e.Key == "NVIDIA_VISIBLE_DEVICES" && e.Value == "void" })
	}
	if a := nvidia("forged", map[string]string{"gpus.nri-gpu.dev/kubelet": n.GPUs[0].UUID}, false); !voided(a) {
		t.Errorf("a forged kubelet annotation under the shipped policy: %v", a)
	}
	if a := nvidia("envvar", nil, false); !voided(a) {
		t.Errorf("NVIDIA's envvar output without device specs under the shipped policy: %v", a)
	}
	if a := nvidia("envvar-specs", nil, true); len(a.GetMounts()) == 0 || len(a.GetLinux().GetDevices()) == 0 {
		t.Errorf("NVIDIA's envvar output with device specs under the shipped policy: %v", a)
	}
	if !strings.Contains(p.log.String(), "serving status on /run/nri-gpu/status.sock") {
		t.Errorf("no status socket in the DaemonSet layout:\n%s", p.log.String())
	}
	if !strings.Contains(p.log.String(), "library directories ready in /var/lib/nri-gpu") {
		t.Errorf("no library directories in the DaemonSet layout:\n%s", p.log.String())
	}
	if !strings.Contains(p.log.String(), "the cache holds its own copy of each") {
		t.Errorf("library directories not copied from the read-only driver root:\n%s", p.log.String())
	}
	libDir := ""
	for _, m := range adj.GetMounts() {
		if m.Destination == "/usr/local/nvidia/lib64" {
			libDir = n.HostPath(m.Source)
		}
	}
	cuda, err := os.ReadFile(filepath.Join(libDir, "libcuda.so.1"))
	if err != nil || len(cuda) == 0 || !strings.HasPrefix(libDir, n.HostPath("/var/lib/nri-gpu")+"/") {
		t.Errorf("library directory %q (host view) has no libcuda.so.1: %v", libDir, err)
	}

	// A graphics container gets its GPUs' DRM nodes, found through the
	// host's /sys (/host/sys), and the profile prepared in the cache.
	adj, err = devicePlugin("gfx", "NVIDIA_DRIVER_CAPABILITIES=graphics")
	if err != nil {
		t.Fatal(err)
	}
	var dri []string
	for _, d := range adj.GetLinux().GetDevices() {
		if strings.HasPrefix(d.Path, "/dev/dri/") {
			dri = append(dri, d.Path)
		}
	}
	if len(dri) != 2*len(n.GPUs) {
		t.Errorf("graphics container DRM nodes %q, want %d", dri, 2*len(n.GPUs))
	}
	profile := ""
	for _, m := range adj.GetMounts() {
		if m.Destination == "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf" {
			profile = n.HostPath(m.Source)
		}
	}
	if data, err := os.ReadFile(profile); err != nil || !strings.Contains(string(data), "EGLVisibleDGPUDevices") {
		t.Errorf("application profile %q: %q, %v", profile, data, err)
	}
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
