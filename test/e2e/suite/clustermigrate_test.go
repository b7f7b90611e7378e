package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/bench"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// migrateStep is one command of docs/migrate.md's steps and what the
// migration test does for it (migration.run).
type migrateStep struct{ key, cmd string }

// migrateSteps are docs/migrate.md's steps ("## The steps"), in the
// order the page gives them and the test runs them.
// TestMigrateDocCommands checks that the page shows these and no other.
var migrateSteps = []migrateStep{
	// Once for the cluster.
	{"nvdp-specs", `helm upgrade nvdp nvdp/nvidia-device-plugin -n nvidia-device-plugin --reuse-values --set compatWithCPUManager=true --set deviceListStrategy=envvar --set deviceIDStrategy=uuid --set-string 'podAnnotations.nvidia\.cdi\.k8s\.io/pod=management.nvidia.com/gpu=all'`},
	{"dcgm-annotation", `helm upgrade dcgm-exporter gpu-helm-charts/dcgm-exporter -n gpu-monitoring --reuse-values --set-string 'podAnnotations.nvidia\.cdi\.k8s\.io/pod=management.nvidia.com/gpu=all'`},
	{"install", `helm install nri-gpu deploy/helm/nri-gpu -n nri-gpu --create-namespace --set config.devicePlugin.enabled=false --set 'config.policy.managementNamespaces={nvidia-device-plugin,gpu-monitoring}' --set-string 'nodeSelector.nri-gpu\.dev/migrated=true' --set config.driverRoot=/run/nvidia/driver --set driverRootHostPath=/run/nvidia/driver --set libraryCacheHostPath=/run/nvidia/driver/var/lib/nri-gpu`},
	// On each node.
	{"cordon", "kubectl cordon <node>"},
	{"handler-runc", "sudo nvidia-ctk runtime configure --runtime=containerd --nvidia-runtime-path=$(command -v runc)"},
	{"restart", "sudo systemctl restart containerd"},
	{"label", "kubectl label node <node> nri-gpu.dev/migrated=true"},
	{"ready", "kubectl -n nri-gpu wait pod -l app.kubernetes.io/name=nri-gpu --field-selector spec.nodeName=<node> --for=create --for=condition=Ready --timeout=3m"},
	{"uncordon", "kubectl uncordon <node>"},
	// When no pod on the node names the runtime class.
	{"rm-drop-in", "sudo rm /etc/containerd/conf.d/99-nvidia.toml"},
	{"restart", "sudo systemctl restart containerd"},
	{"delete-runtimeclass", "kubectl delete runtimeclass nvidia"},
	// Later: nri-gpu's device plugin instead of NVIDIA's.
	{"nvdp-uninstall", "helm uninstall nvdp -n nvidia-device-plugin"},
	{"device-plugin", "helm upgrade nri-gpu deploy/helm/nri-gpu -n nri-gpu --reuse-values --set config.devicePlugin.enabled=true"},
}

// The paths the toolkit's steps name on a node, and what stands for
// them on the test's node (migration).
const (
	docContainerdDropIn = "/etc/containerd/conf.d/99-nvidia.toml" // nvidia-ctk's default drop-in
	docRunc             = "$(command -v runc)"
)

// docMigrateCommands are the kubectl, helm and sudo lines of the shell
// blocks in docs/migrate.md's "## The steps" section, continuation lines
// joined, comments removed.
func docMigrateCommands(t *testing.T) []string {
	data, err := os.ReadFile(filepath.Join(repoRoot(), "docs", "migrate.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## The steps\n")
	if !ok {
		t.Fatal("docs/migrate.md: no ## The steps section")
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var out []string
	inBlock, cont := false, ""
	for _, l := range strings.Split(section, "\n") {
		if strings.HasPrefix(l, "```") {
			inBlock = !inBlock
			continue
		}
		if !inBlock {
			continue
		}
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		l = strings.TrimSpace(l)
		if rest, ok := strings.CutSuffix(l, `\`); ok {
			cont += strings.TrimSpace(rest) + " "
			continue
		}
		l, cont = cont+l, ""
		if strings.HasPrefix(l, "kubectl ") || strings.HasPrefix(l, "helm ") || strings.HasPrefix(l, "sudo ") {
			out = append(out, l)
		}
	}
	return out
}

// TestMigrateDocCommands checks that docs/migrate.md's steps are the
// migration test's (migrateSteps), in the same order.
func TestMigrateDocCommands(t *testing.T) {
	doc := docMigrateCommands(t)
	var want []string
	for _, s := range migrateSteps {
		want = append(want, s.cmd)
	}
	if !slices.Equal(doc, want) {
		t.Errorf("docs/migrate.md's steps are not the migration test's (migrateSteps).\nthe page:\n  %s\nthe test:\n  %s",
			strings.Join(doc, "\n  "), strings.Join(want, "\n  "))
	}
	if a := docAnnotation(t, migrateSteps[0].cmd); a != docAnnotation(t, migrateSteps[1].cmd) {
		t.Errorf("the device plugin's and DCGM exporter's pod annotations differ: %q", a)
	}
}

// docAnnotation is the pod annotation a step's --set-string
// podAnnotations.<key>=<value> sets, as key=value (the key unescaped).
func docAnnotation(t *testing.T, cmd string) string {
	for _, w := range shellWords(cmd) {
		if rest, ok := strings.CutPrefix(w, "podAnnotations."); ok {
			return strings.ReplaceAll(rest, `\.`, ".")
		}
	}
	t.Fatalf("%s: no podAnnotations value", cmd)
	return ""
}

// migrateNode is the migration test's node: containerd 2.4 with the
// NVIDIA container toolkit laid out (prepareToolkit) and 4 simulated H100s
// under /run/nvidia/driver, as with the GPU Operator's driver container.
const migrateNode = "tk-a"

// migration is the migration test's state: its cluster, node, the
// toolkit's binaries and the stand-in of NVIDIA's device plugin.
type migration struct {
	k         kc
	node      *harness.Node
	ctd       *harness.Containerd
	dropIn    string // the node's nvidia-ctk drop-in (docContainerdDropIn)
	nvidiaCtk string
	runc      string
	plugin    *standInNVIDIAPlugin
	done      int // how many of migrateSteps ran
}

// testMigrate is TestCluster/migrate: a one-node cluster at version set
// up the NVIDIA toolkit's way, moved to nri-gpu with docs/migrate.md's
// steps (migrateSteps) while GPU pods run (docs/migrate.md, "What the test
// runs"). One piece: its stages are the page's, in the page's order, on one
// cluster, and each checks what the stages before it left running.
func testMigrate(t *testing.T, version string) {
	var nvidiaRuntime string
	c := startTestCluster(t, version, []harness.NodeOptions{{
		Name: migrateNode, Runtime: harness.RuntimeContainerd24, GPUs: &simnode.Options{NumGPUs: 4, Layout: simnode.LayoutRHEL},
		Prepare: func(n *harness.Node, o *harness.NodeOptions) (err error) {
			nvidiaRuntime, err = prepareToolkit(n, o)
			return err
		},
	}})
	k := kc{t: t, c: c, ctx: context.Background()}
	// The chart is installed with the suite's helm-values.yaml, whose
	// ServiceMonitor and PrometheusRule need prometheus-operator's CRDs.
	installMonitoringCRDs(k)
	m := newMigration(k, c.Node(migrateNode))

	// The toolkit's way: nvidia-ctk registers nvidia-container-runtime as
	// handler "nvidia" and the default runtime; GPU feature discovery's
	// label; NVIDIA's device plugin as it ships (envvar, no device specs);
	// DCGM exporter asking for every GPU; two GPU pods, one naming the
	// runtime class, one through the default runtime.
	m.nvidiaCtkRun("runtime", "configure", "--runtime=containerd", "--nvidia-runtime-path="+nvidiaRuntime, "--set-as-default")
	m.restart()
	k.apply("apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: nvidia}\nhandler: nvidia\n")
	k.run("label", "node", migrateNode, "nvidia.com/gpu.present=true")
	m.plugin = &standInNVIDIAPlugin{resource: "nvidia.com/gpu", strategy: "envvar", gpus: m.node.GPU.GPUs, devRoot: m.node.GPU.Root}
	m.plugin.noDeviceSpecs.Store(true)
	startStandInAt(t, m.plugin, m.node.HostPath(harness.DevicePluginDir))
	m.waitAllocatable(4)
	for _, ns := range []string{"ml", "gpu-monitoring"} {
		k.run("create", "namespace", ns)
	}
	k.apply(dcgmStandIn + "---\n" + migratePod("tk-class", 1, "nvidia") + "---\n" + migratePod("tk-default", 2, ""))
	old := []gpuPodView{m.view("tk-class"), m.view("tk-default")}
	for _, v := range old {
		m.checkToolkitPod(v)
	}
	m.checkDCGM("toolkit")
	before := containerIDs(k, old)
	undisturbed := func(views []gpuPodView) {
		t.Helper()
		if after := containerIDs(k, views); fmt.Sprint(after) != fmt.Sprint(containerIDsOf(before, views)) {
			t.Errorf("the toolkit's pods changed:\nbefore %v\nafter  %v", before, after)
		}
		for _, v := range views {
			now := m.view(v.pod.Name)
			m.checkToolkitPod(now)
			if !slices.Equal(now.assigned, v.assigned) {
				t.Errorf("pod %s: assigned %v, was %v", v.pod.Name, now.assigned, v.assigned)
			}
		}
	}

	// Once for the cluster: the pods the toolkit serves do not notice.
	m.runSteps("nvdp-specs", "dcgm-annotation", "install")
	m.checkDCGM("toolkit") // the annotated pod, replaced, still the toolkit's: nri-gpu runs nowhere yet
	var ds appsv1.DaemonSet
	if err := c.GetJSON(k.ctx, &ds, "daemonset", "-n", "nri-gpu", "nri-gpu"); err != nil || ds.Status.DesiredNumberScheduled != 0 {
		t.Errorf("nri-gpu's DaemonSet before a node is labelled: %v, %d pods wanted, want 0", err, ds.Status.DesiredNumberScheduled)
	}
	undisturbed(old)

	// On the node: runc, nri-gpu; the toolkit's pods run on.
	m.runSteps("cordon", "handler-runc", "restart", "label", "ready", "uncordon")
	undisturbed(old)
	k.apply(migratePod("nri-class", 1, "nvidia"))
	checkSeesExactly(k, m.nriGPUPod("nri-class"), 1)
	k.run("delete", "pod", "-n", "gpu-monitoring", "-l", "app=dcgm-exporter", "--wait=true")
	m.checkDCGM("nri-gpu")

	// The runtime class goes once no pod names it: the toolkit's pod of
	// the default runtime runs on.
	k.run("delete", "pod", "-n", "ml", "tk-class", "nri-class", "--wait=true")
	m.runSteps("rm-drop-in", "restart", "delete-runtimeclass")
	if _, err := os.Stat(m.dropIn); !os.IsNotExist(err) {
		t.Errorf("%s: %v, want it gone", m.dropIn, err)
	}
	undisturbed(old[1:])
	if err := c.Apply(k.ctx, migratePod("names-the-class", 1, "nvidia")); err == nil || !strings.Contains(err.Error(), "nvidia") {
		t.Errorf("a pod naming runtimeClassName nvidia after the class is gone: %v, want refused", err)
	}
	k.apply(migratePod("nri-default", 1, ""))
	fresh := m.nriGPUPod("nri-default")
	checkSeesExactly(k, fresh, 1)
	m.checkDCGM("nri-gpu")

	// nri-gpu's device plugin instead of NVIDIA's: the kubelet's
	// checkpoint holds; the last free GPU goes to the new pod.
	m.runSteps("nvdp-uninstall", "device-plugin")
	if err := c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", 1, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	m.waitAllocatable(4)
	undisturbed(old[1:])
	checkSeesExactly(k, m.view("nri-default"), 1)
	k.apply(migratePod("nri-plugin", 1, ""))
	last := m.nriGPUPod("nri-plugin")
	checkSeesExactly(k, last, 1)
	checkPlacement(k, []gpuPodView{old[1], fresh, last})
	m.checkDCGM("nri-gpu")
	if m.done != len(migrateSteps) {
		t.Errorf("ran %d of docs/migrate.md's %d steps", m.done, len(migrateSteps))
	}
}

func newMigration(k kc, n *harness.Node) *migration {
	ctd, ok := n.Runtime.(*harness.Containerd)
	if !ok {
		k.t.Fatalf("node %s runs %s, want containerd", n.Name, n.Runtime.Name())
	}
	dir := filepath.Join(harness.DefaultCacheDir(), "nvidia-container-toolkit-"+bench.ToolkitVersion)
	ctk, err := harness.GoInstall(k.ctx, dir, "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk@"+bench.ToolkitVersion, "nvidia-ctk", nil, nil)
	if err != nil {
		k.t.Fatal(err)
	}
	tools, err := harness.InstallTools(k.ctx, "", "")
	if err != nil {
		k.t.Fatal(err)
	}
	return &migration{k: k, node: n, ctd: ctd, dropIn: filepath.Join(ctd.Dir, "conf.d", "99-nvidia.toml"), nvidiaCtk: ctk, runc: tools.Runc}
}

// runSteps runs the migrateSteps of keys, each the next of the list: the
// test goes through the page in its order, and the last stage checks that
// it ran every step.
func (m *migration) runSteps(keys ...string) {
	m.k.t.Helper()
	for _, key := range keys {
		m.run(key)
	}
}

// run runs the next of migrateSteps, which must be key's.
func (m *migration) run(key string) {
	t := m.k.t
	t.Helper()
	if m.done >= len(migrateSteps) {
		t.Fatalf("step %q: every step of docs/migrate.md was run already", key)
	}
	s := migrateSteps[m.done]
	m.done++
	if s.key != key {
		t.Fatalf("the test runs step %q where docs/migrate.md has %q (%s)", key, s.key, s.cmd)
	}
	t.Logf("docs/migrate.md: %s", s.cmd)
	cmd := strings.ReplaceAll(strings.ReplaceAll(s.cmd, "<node>", m.node.Name), docRunc, m.runc)
	words := shellWords(cmd)
	switch key {
	case "nvdp-specs":
		// The stand-in of NVIDIA's device plugin, as the upgrade leaves the
		// real one: PASS_DEVICE_SPECS=true, envvar, UUIDs (it has no other).
		for _, want := range []string{"compatWithCPUManager=true", "deviceListStrategy=envvar", "deviceIDStrategy=uuid"} {
			if !slices.Contains(words, want) {
				t.Fatalf("%s: no %s: the stand-in's change would not be the page's", s.cmd, want)
			}
		}
		m.plugin.noDeviceSpecs.Store(false)
	case "dcgm-annotation":
		name, value, _ := strings.Cut(docAnnotation(t, s.cmd), "=")
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{"annotations": map[string]string{name: value}}}}})
		if err != nil {
			t.Fatal(err)
		}
		m.k.run("-n", "gpu-monitoring", "patch", "daemonset", "dcgm-exporter", "--type", "merge", "-p", string(patch))
		m.k.run("-n", "gpu-monitoring", "rollout", "status", "daemonset/dcgm-exporter", "--timeout=2m")
	case "install", "device-plugin":
		for i, w := range words {
			if w == "deploy/helm/nri-gpu" {
				words[i] = chartDir()
			}
		}
		if key == "install" {
			// The simulated node's kernel side and device root.
			words = append(words, "-f", harness.HelmValues(repoRoot()))
		}
		m.k.helm(words[1:]...)
	case "nvdp-uninstall":
		m.plugin.server.Stop() // closing the listener removes its socket
		if _, err := os.Stat(m.plugin.socket); !os.IsNotExist(err) {
			t.Fatalf("the stand-in's socket %s after it stopped: %v", m.plugin.socket, err)
		}
	case "handler-runc":
		m.nvidiaCtkRun(words[2:]...)
	case "restart":
		m.restart()
	case "rm-drop-in":
		if words[2] != docContainerdDropIn {
			t.Fatalf("%s: removes %s, not nvidia-ctk's drop-in %s", s.cmd, words[2], docContainerdDropIn)
		}
		if err := os.Remove(m.dropIn); err != nil {
			t.Fatal(err)
		}
	default:
		if words[0] != "kubectl" {
			t.Fatalf("step %q: %s: not a kubectl command", key, s.cmd)
		}
		m.k.run(words[1:]...)
	}
}

// nvidiaCtkRun runs nvidia-ctk with args on the node's containerd
// configuration: its config.toml and its drop-in in place of
// /etc/containerd/config.toml and docContainerdDropIn.
func (m *migration) nvidiaCtkRun(args ...string) {
	t := m.k.t
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(m.dropIn), 0o755); err != nil {
		t.Fatal(err)
	}
	args = append(args, "--config="+m.ctd.ConfigPath, "--drop-in-config="+m.dropIn)
	out, err := exec.Command(m.nvidiaCtk, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nvidia-ctk %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	drop, _ := os.ReadFile(m.dropIn)
	t.Logf("nvidia-ctk %s:\n%s--- %s ---\n%s", strings.Join(args, " "), out, m.dropIn, drop)
}

// restart restarts the node's containerd (its containers keep running)
// and waits for the node to be Ready again.
func (m *migration) restart() {
	t := m.k.t
	t.Helper()
	if err := m.node.Runtime.Restart(m.k.ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.k.c.WaitNodeReady(m.k.ctx, m.node.Name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// waitAllocatable waits for the node's allocatable nvidia.com/gpu to be n.
func (m *migration) waitAllocatable(n int) {
	m.k.t.Helper()
	m.k.wait(time.Minute, fmt.Sprintf("%s allocatable nvidia.com/gpu = %d", m.node.Name, n), func() (bool, string, error) {
		node, err := m.k.c.GetNode(m.k.ctx, m.node.Name)
		if err != nil {
			return false, err.Error(), nil
		}
		q := node.Status.Allocatable["nvidia.com/gpu"]
		return q.String() == fmt.Sprint(n), q.String(), nil
	})
}

// view waits for pod name of namespace ml to run and returns what its
// container sees.
func (m *migration) view(name string) gpuPodView {
	m.k.t.Helper()
	p, err := m.k.c.WaitPodRunning(m.k.ctx, "ml", name, 2*time.Minute)
	if err != nil {
		m.k.t.Fatal(err)
	}
	return viewGPUPod(m.k, *p)
}

// injectorOf says who gave pod's container its driver libraries:
// "nri-gpu" (its directory /usr/local/nvidia/lib64), "toolkit" (the
// toolkit's spec mounts them at the host's /usr/lib64 paths), "both" or
// "none".
func (m *migration) injectorOf(ns, pod string) string {
	out, _ := m.k.c.Exec(m.k.ctx, ns, pod, "main", "sh", "-c", "ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib64/libcuda.so.* 2>/dev/null; true")
	nri := strings.Contains(out, "/usr/local/nvidia/lib64/libcuda.so.1")
	tk := strings.Contains(out, "/usr/lib64/libcuda.so.")
	switch {
	case nri && tk:
		return "both"
	case nri:
		return "nri-gpu"
	case tk:
		return "toolkit"
	}
	return "none"
}

// checkToolkitPod checks a pod the toolkit started: exactly the device
// nodes of the GPUs the kubelet assigned, libcuda counting them, the
// driver from the toolkit alone.
func (m *migration) checkToolkitPod(v gpuPodView) {
	t := m.k.t
	t.Helper()
	var want []string
	for _, u := range v.assigned {
		for _, g := range m.node.GPU.GPUs {
			if g.UUID == u {
				want = append(want, fmt.Sprintf("/dev/nvidia%d", g.Minor))
			}
		}
	}
	slices.Sort(want)
	by := m.injectorOf(v.pod.Namespace, v.pod.Name)
	if len(want) == 0 || !slices.Equal(v.devices, want) || v.cudaDevices != fmt.Sprint(len(want)) || by != "toolkit" {
		t.Errorf("pod %s (the toolkit's): kubelet assigned %v; device nodes %v (want %v), libcuda devices=%q, driver from %s (want the toolkit)",
			v.pod.Name, v.assigned, v.devices, want, v.cudaDevices, by)
	}
}

// nriGPUPod waits for pod name of ml to run and checks that its driver
// came from nri-gpu alone; it returns what the container sees.
func (m *migration) nriGPUPod(name string) gpuPodView {
	m.k.t.Helper()
	v := m.view(name)
	if by := m.injectorOf("ml", name); by != "nri-gpu" {
		m.k.t.Errorf("pod %s: driver from %s, want nri-gpu alone", name, by)
	}
	return v
}

var nvmlDevicesRE = regexp.MustCompile(`libnvidia-ml\.so\.1: ok driver=\S+ devices=(\d+)`)

// checkDCGM checks the DCGM exporter stand-in's pod: NVML loads and counts
// every GPU of the node, the driver given by want: "toolkit" (the image's
// NVIDIA_VISIBLE_DEVICES=all) or "nri-gpu" (a management request:
// NVIDIA_VISIBLE_DEVICES=void).
func (m *migration) checkDCGM(want string) {
	t := m.k.t
	t.Helper()
	p := runningPods(m.k, "gpu-monitoring", "app=dcgm-exporter", 1)[0]
	out, err := m.k.c.Exec(m.k.ctx, p.Namespace, p.Name, "main", "sh", "-c", `echo "NVD=$NVIDIA_VISIBLE_DEVICES"; gpucheck nvml`)
	g := nvmlDevicesRE.FindStringSubmatch(out)
	by := m.injectorOf(p.Namespace, p.Name)
	nvd := "all" // the image's, which the toolkit's runtime leaves
	if want == "nri-gpu" {
		nvd = "void"
	}
	if err != nil || g == nil || g[1] != fmt.Sprint(len(m.node.GPU.GPUs)) || by != want || !strings.Contains(out, "NVD="+nvd+"\n") {
		t.Errorf("DCGM exporter's pod %s: driver from %s (want %s), %v:\n%s(want NVML counting %d GPUs, NVIDIA_VISIBLE_DEVICES=%s)", p.Name, by, want, err, out, len(m.node.GPU.GPUs), nvd)
	}
}

// containerIDsOf is before restricted to the pods of views.
func containerIDsOf(before map[string]string, views []gpuPodView) map[string]string {
	out := map[string]string{}
	for k, v := range before {
		for _, w := range views {
			if strings.HasPrefix(k, w.pod.Name+"/") {
				out[k] = v
			}
		}
	}
	return out
}

// dcgmStandIn stands in for DCGM exporter's DaemonSet (its chart's: no
// runtime class, the default runtime's): a pod that asks for every GPU
// the way its image does (NVIDIA_VISIBLE_DEVICES=all in the image's
// config) and loads NVML.
var dcgmStandIn = fmt.Sprintf(`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: dcgm-exporter, namespace: gpu-monitoring}
spec:
  selector: {matchLabels: {app: dcgm-exporter}}
  template:
    metadata: {labels: {app: dcgm-exporter}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: main
        image: %s
        imagePullPolicy: Never
        command: [sleep, "3600"]
`, harness.GlibcCUDAImage)

// migratePod is a pod of namespace ml on the migration's node asking for
// gpus nvidia.com/gpu, of runtime class rc when set.
func migratePod(name string, gpus int, rc string) string {
	extra := ""
	if rc != "" {
		extra = "  runtimeClassName: " + rc + "\n"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: ml}
spec:
  nodeSelector: {kubernetes.io/hostname: %s}
  terminationGracePeriodSeconds: 0
%s  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {limits: {nvidia.com/gpu: %d}}
`, name, migrateNode, extra, harness.GlibcImage, gpus)
}
