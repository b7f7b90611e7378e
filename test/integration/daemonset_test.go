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
	hostSource := map[string]string{"/": n.Root, "/proc": n.HostPath("/proc"), "/dev": n.HostPath("/dev"), "/var/run/nri": dir,
		"/var/lib/nri-gpu": n.HostPath("/var/lib/nri-gpu")}
	if err := os.MkdirAll(n.HostPath("/var/lib/nri-gpu"), 0o755); err != nil { // type: DirectoryOrCreate
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
	devicePlugin := func(name string) (*api.ContainerAdjustment, error) {
		ctr := &api.Container{Id: "ctr-" + name, PodSandboxId: "pod-" + name, Name: name, Env: []string{"PATH=/usr/bin:/bin"}, Linux: &api.LinuxContainer{}}
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
