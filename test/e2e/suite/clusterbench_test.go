package suite

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/bench"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// clusterBenchOptIn is the env var that runs TestClusterPodStart: the
// number of rounds (make bench-cluster: 50).
const clusterBenchOptIn = "NRI_GPU_E2E_CLUSTER_BENCH"

// Pod start paths of TestClusterPodStart.
const (
	pathPlainA = "no GPU (gpu-a)"
	pathNRIGPU = "nvidia.com/gpu: 1 through nri-gpu (gpu-a)"
	pathPlainB = "no GPU (nv-a)"
	pathNVIDIA = "nvidia.com/gpu: 1 through NVIDIA's device plugin (envvar) + nvidia-container-runtime (nv-a)"
	pathClaimA = "claim of 1 GPU through nri-gpu's DRA driver (gpu-a)"
	pathClaimB = "claim of 1 GPU through NVIDIA's DRA driver v0.5.0 (nv-a)"
)

// nvidiaDriver is the driver name (and DeviceClass) of NVIDIA's DRA
// driver for GPUs, which runs on nv-a (startNVIDIADRA).
const nvidiaDriver = "gpu.nvidia.com"

// nvidiaClaimSpec is the path, as nv-a sees it, of the CDI spec
// NVIDIA's DRA driver writes for the claim uid (cdi.go:
// CreateClaimSpecFile, in the kubelet's CDI directory).
func nvidiaClaimSpec(uid string) string {
	return filepath.Join(harness.NodeCDIDir, "k8s."+nvidiaDriver+"-claim_"+uid+".yaml")
}

// nvidiaNode is the bench's second node: containerd with
// nvidia-container-runtime (CDI mode, the toolkit's spec of the node's
// simulated GPUs with its hooks) as runtime handler "nvidia", and no
// nri-gpu (not labelled nvidia.com/gpu.present).
func nvidiaNode(t *testing.T) harness.NodeOptions {
	return harness.NodeOptions{
		Name: "nv-a", Runtime: harness.RuntimeContainerd24, GPUs: &simnode.Options{NumGPUs: 4, Layout: simnode.LayoutRHEL},
		Prepare: func(n *harness.Node, o *harness.NodeOptions) error {
			rt, err := prepareToolkit(n, o)
			if err != nil {
				return err
			}
			tools, err := harness.InstallTools(context.Background(), "", "")
			if err != nil {
				return err
			}
			nd := n.NS.Dir
			o.RuntimeExtraConfig = fmt.Sprintf(`
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"
runtime_path = %q

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
BinaryName = %q
Root = %q
SystemdCgroup = false
`, tools.Shim, rt, filepath.Join(nd, "runc-nvidia"))
			return nil
		},
	}
}

// prepareToolkit lays out the NVIDIA container toolkit on node n, as its
// packages and nvidia-ctk cdi generate do, before n's runtime starts:
// nvidia-container-runtime and nvidia-cdi-hook (bench.ToolkitVersion,
// built from the Go module proxy), the toolkit's CDI spec of n's simulated
// GPUs with the hooks, and the runtime's configuration (CDI mode, runc
// below it), which o's runtime hands it in NVIDIA_CTK_CONFIG_FILE_PATH. It
// returns nvidia-container-runtime's path; no runtime handler names it yet.
func prepareToolkit(n *harness.Node, o *harness.NodeOptions) (string, error) {
	ctx := context.Background()
	dir := filepath.Join(harness.DefaultCacheDir(), "nvidia-container-toolkit-"+bench.ToolkitVersion)
	tk := "github.com/NVIDIA/nvidia-container-toolkit/cmd/"
	hook, err := harness.GoInstall(ctx, dir, tk+"nvidia-cdi-hook@"+bench.ToolkitVersion, "nvidia-cdi-hook", nil, nil)
	if err != nil {
		return "", err
	}
	rt, err := harness.GoInstall(ctx, dir, tk+"nvidia-container-runtime@"+bench.ToolkitVersion, "nvidia-container-runtime", nil, nil)
	if err != nil {
		return "", err
	}
	tools, err := harness.InstallTools(ctx, "", "")
	if err != nil {
		return "", err
	}
	specDir := filepath.Join(n.NS.Dir, "cdi-nvidia")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		return "", err
	}
	if err := bench.WriteToolkitSpec(specDir, "nvidia.json", n.GPU, hook); err != nil {
		return "", err
	}
	cfg := filepath.Join(n.NS.Dir, "nvidia-container-runtime.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`[nvidia-container-runtime]
log-level = "info"
mode = "cdi"
runtimes = [%q]

[nvidia-container-runtime.modes.cdi]
spec-dirs = [%q]
default-kind = %q
`, tools.Runc, specDir, bench.ToolkitKind)), 0o644); err != nil {
		return "", err
	}
	o.RuntimeEnv = []string{"NVIDIA_CTK_CONFIG_FILE_PATH=" + cfg}
	return rt, nil
}

// podWatch records, from one kubectl get --watch of a namespace, when
// each pod was first seen (created: the API server's ADDED) and first seen
// Running with its container started.
type podWatch struct {
	mu      sync.Mutex
	added   map[string]time.Time
	running map[string]time.Time
	cmd     *exec.Cmd
}

func startPodWatch(t *testing.T, c *harness.Cluster, ns string) *podWatch {
	w := &podWatch{added: map[string]time.Time{}, running: map[string]time.Time{}}
	w.cmd = c.Net.NS.Command(context.Background(), c.Tools.Kubectl, "--kubeconfig", c.Kubeconfig, "get", "pods", "-n", ns,
		"--watch", "--output-watch-events", "-o", "json")
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		dec := json.NewDecoder(bufio.NewReader(out))
		for {
			var ev struct {
				Type   string     `json:"type"`
				Object corev1.Pod `json:"object"`
			}
			if err := dec.Decode(&ev); err != nil {
				return
			}
			now := time.Now()
			p := ev.Object
			w.mu.Lock()
			if _, ok := w.added[p.Name]; !ok && ev.Type == "ADDED" {
				w.added[p.Name] = now
			}
			if _, ok := w.running[p.Name]; !ok && p.Status.Phase == corev1.PodRunning {
				w.running[p.Name] = now
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = w.cmd.Process.Kill(); _ = w.cmd.Wait() })
	return w
}

// startTime is name's creation-to-Running time, once seen.
func (w *podWatch) startTime(name string) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	a, ok1 := w.added[name]
	r, ok2 := w.running[name]
	return r.Sub(a), ok1 && ok2
}

// benchPod is the manifest of a bench pod on node, with gpus GPUs of
// nvidia.com/gpu, runtime class rc when set, and a claim from the
// ResourceClaimTemplate tmpl when set.
func benchPod(name, node string, gpus int, rc, tmpl string) string {
	extra := ""
	if rc != "" {
		extra = "  runtimeClassName: " + rc + "\n"
	}
	res := ""
	if gpus > 0 {
		res = fmt.Sprintf("    resources: {limits: {nvidia.com/gpu: %d}}\n", gpus)
	}
	if tmpl != "" {
		extra += "  resourceClaims:\n  - {name: gpu, resourceClaimTemplateName: " + tmpl + "}\n"
		res = "    resources: {claims: [{name: gpu}]}\n"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: bench}
spec:
  nodeSelector: {kubernetes.io/hostname: %s}
  terminationGracePeriodSeconds: 0
%s  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]
%s`, name, node, extra, harness.GlibcImage, res)
}

// benchClaimTemplate is a ResourceClaimTemplate of the bench namespace
// asking for one device of the DeviceClass class.
func benchClaimTemplate(name, class string) string {
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: %s, namespace: bench}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: %s}
`, name, class)
}

// TestClusterPodStart measures pod start as the cluster sees it (the API
// server's ADDED to Running, from one watch) in paired rounds, each path
// once per round in a shuffled order: on gpu-a, with nri-gpu installed as
// the DRA driver beside its device plugin (test/e2e/cluster/dra: DRA on
// GPUs 0 to 2, the device plugin on GPU 3), a GPU-less pod, a 1-GPU pod
// of nvidia.com/gpu and a pod with a 1-GPU claim (gpu.nri-gpu.dev, from a
// ResourceClaimTemplate); on nv-a (same runtime and kubelet, no nri-gpu),
// a GPU-less pod, a 1-GPU pod through NVIDIA's device plugin (a stand-in
// answering as its envvar strategy) plus nvidia-container-runtime as a
// runtime class, and a pod with a 1-GPU claim of gpu.nvidia.com served by
// NVIDIA's own DRA driver (gpu-kubelet-plugin, startNVIDIADRA: a
// per-claim CDI spec with the toolkit's driver mounts and nvidia-cdi-hook
// hooks, which containerd applies through runc), with the CPU weight of
// nri-gpu's container. It prints each path's median, the paired ratios
// with their 95% intervals, and each driver's prepare as its node's
// kubelet timed it (docs/benchmarks.md).
func TestClusterPodStart(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv(clusterBenchOptIn))
	if rounds <= 0 {
		t.Skipf("runs only with %s=<rounds> (make bench-cluster: 50)", clusterBenchOptIn)
	}
	version := harness.KubernetesVersion
	if v := strings.Fields(os.Getenv(clusterOptIn)); len(v) > 0 {
		version = v[0]
	}
	if _, err := harness.InstallNVIDIADRA(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	nodes := []harness.NodeOptions{harness.GPUNodes()[0], nvidiaNode(t)}
	c := startTestCluster(t, version, nodes)
	k := kc{t: t, c: c, ctx: context.Background()}
	k.doc("label", map[string]string{"node": "gpu-a"})
	k.run("apply", "-k", draOverlay())
	if err := c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", 1, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	k.apply("apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: nvidia}\nhandler: nvidia\n")
	nv := c.Node("nv-a")
	startClusterStandIn(t, nv)
	k.wait(time.Minute, "nv-a allocatable nvidia.com/gpu = 4", func() (bool, string, error) {
		n, err := c.GetNode(k.ctx, "nv-a")
		if err != nil {
			return false, err.Error(), nil
		}
		q := n.Status.Allocatable["nvidia.com/gpu"]
		return q.String() == "4", q.String(), nil
	})
	startNVIDIADRA(t, c, nv, nvidiaDRAOptions{cgroup: nriGPUContainerCgroup(k)})
	k.wait(time.Minute, "the ResourceSlices of gpu-a's 3 DRA GPUs and nv-a's 4", func() (bool, string, error) {
		got, err := sliceDeviceCounts(k)
		return err == nil && got[draDriver+"/gpu-a"] == 3 && got[nvidiaDriver+"/nv-a"] == 4, fmt.Sprint(got, err), nil
	})
	k.run("create", "namespace", "bench")
	k.apply(fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: %[1]s}
spec:
  selectors:
  - cel: {expression: "device.driver == '%[1]s' && device.attributes['%[1]s'].type == 'gpu'"}
`, nvidiaDriver) + "---\n" + benchClaimTemplate("nri-gpu", draDriver) + "---\n" + benchClaimTemplate("nvidia", nvidiaDriver))
	w := startPodWatch(t, c, "bench")

	paths := []struct {
		name, node, rc, tmpl string
		gpus                 int
	}{{pathPlainA, "gpu-a", "", "", 0}, {pathNRIGPU, "gpu-a", "", "", 1}, {pathPlainB, "nv-a", "", "", 0}, {pathNVIDIA, "nv-a", "nvidia", "", 1},
		{pathClaimA, "gpu-a", "", "nri-gpu", 0}, {pathClaimB, "nv-a", "", "nvidia", 0}}
	res := &bench.Result{Samples: map[string][]bench.Sample{}}
	for r := -1; r < rounds; r++ { // round -1 warms up and checks
		order := rand.Perm(len(paths))
		for _, i := range order {
			p := paths[i]
			name := fmt.Sprintf("p%d-r%d", i, r+1)
			k.apply(benchPod(name, p.node, p.gpus, p.rc, p.tmpl))
			pod, err := c.WaitPodRunning(k.ctx, "bench", name, 2*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			var d time.Duration
			k.wait(10*time.Second, name+" seen Running by the watch", func() (bool, string, error) {
				var ok bool
				d, ok = w.startTime(name)
				return ok, "", nil
			})
			var spec string
			switch {
			case r >= 0:
			case p.tmpl == "nri-gpu":
				checkSeesExactly(k, viewClaimPodIn(k, "bench", name).gpuPodView, 1)
			case p.tmpl == "nvidia":
				spec = checkNVIDIAClaimPod(k, *pod)
			case p.gpus > 0:
				v := viewGPUPod(k, *pod)
				if p.rc == "" {
					checkSeesExactly(k, v, 1)
				} else if len(v.devices) != 1 || v.cudaDevices != "1" {
					t.Errorf("%s: the NVIDIA path gave device nodes %v, libcuda devices=%q; want one GPU", p.name, v.devices, v.cudaDevices)
				}
			}
			k.run("delete", "pod", "-n", "bench", name, "--grace-period=0", "--wait=true")
			if spec != "" {
				k.wait(time.Minute, "the claim's CDI spec removed (UnprepareResourceClaims)", func() (bool, string, error) {
					_, err := os.Stat(nv.HostPath(spec))
					return os.IsNotExist(err), fmt.Sprint(err), nil
				})
			}
			if r >= 0 {
				res.Samples[p.name] = append(res.Samples[p.name], bench.Sample{Create: d})
			}
		}
	}
	for _, p := range paths {
		s := res.Stat(p.name, bench.Create)
		// The tail: the slowest round, and how many took twice the median.
		var top time.Duration
		slow := 0
		for _, x := range res.Samples[p.name] {
			top = max(top, x.Create)
			if float64(x.Create.Milliseconds()) > 2*s.P50 {
				slow++
			}
		}
		t.Logf("%-95s p50 %7.1f ms (p10 %.1f, p90 %.1f, max %d; %d rounds over 2x p50)", p.name, s.P50, s.P10, s.P90, top.Milliseconds(), slow)
	}
	for _, q := range [][2]string{{pathNRIGPU, pathPlainA}, {pathNVIDIA, pathPlainB}, {pathNVIDIA, pathNRIGPU},
		{pathClaimA, pathPlainA}, {pathClaimB, pathPlainB}, {pathClaimB, pathClaimA}} {
		m, lo, hi := res.Ratio(q[0], q[1], bench.Create)
		t.Logf("%s / %s: %.3f (95%% interval %.3f-%.3f), %d rounds", q[0], q[1], m, lo, hi, rounds)
	}
	// The drivers' prepare and unprepare as each node's kubelet timed
	// them (the warm-up round included).
	for _, d := range []struct{ node, driver string }{{"gpu-a", draDriver}, {"nv-a", nvidiaDriver}} {
		stats, err := kubeletDRAMetrics(k, d.node)
		if err != nil {
			t.Errorf("node %s: the kubelet's metrics: %v", d.node, err)
			continue
		}
		for _, op := range []string{"NodePrepareResources", "NodeUnprepareResources"} {
			t.Logf("%s on %s: %s: %s", d.driver, d.node, op, stats[d.driver+" "+op])
		}
	}
}

// startClusterStandIn serves NVIDIA's device plugin stand-in (envvar
// strategy, nvidia.com/gpu, every GPU of node n) in n's kubelet's device
// plugin directory and registers it.
func startClusterStandIn(t *testing.T, n *harness.Node) {
	t.Helper()
	p := &standInNVIDIAPlugin{resource: "nvidia.com/gpu", strategy: "envvar", gpus: n.GPU.GPUs, devRoot: n.GPU.Root}
	startStandInAt(t, p, n.HostPath(harness.DevicePluginDir))
}

// nriGPUContainerCgroup is the CPU cgroup directory of nri-gpu's
// container on gpu-a (the one whose name holds its container ID), "" when
// none is found.
func nriGPUContainerCgroup(k kc) string {
	pods, err := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu")
	if err != nil || len(pods) != 1 || len(pods[0].Status.ContainerStatuses) != 1 {
		k.t.Fatalf("nri-gpu's pod: %v (%d pods)", err, len(pods))
	}
	_, id, _ := strings.Cut(pods[0].Status.ContainerStatuses[0].ContainerID, "://")
	root := "/sys/fs/cgroup/cpu" // v1; v2 is one tree
	if _, err := os.Stat(root); err != nil {
		root = "/sys/fs/cgroup"
	}
	found := ""
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		switch {
		case err != nil || found != "":
			return filepath.SkipDir
		case !d.IsDir():
			return nil
		case id != "" && strings.Contains(d.Name(), id):
			found = p
			return filepath.SkipDir
		case strings.Count(strings.TrimPrefix(p, root), "/") >= 5:
			return filepath.SkipDir
		}
		return nil
	})
	if found == "" {
		k.t.Logf("no CPU cgroup of nri-gpu's container %s under %s: NVIDIA's DRA driver runs in the test's", id, root)
	}
	return found
}

// driverCgroup moves pid (NVIDIA's DRA driver) into a sibling of
// nri-gpu's container's CPU cgroup ctr with its CPU weight (the
// DaemonSet's cpu request), so that the two drivers get the same share of
// a loaded machine; it returns the new cgroup, to be removed once pid
// ends.
func driverCgroup(ctr string, pid int) (string, error) {
	dir := filepath.Join(filepath.Dir(ctr), "nri-gpu-e2e-nvidia-dra")
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return "", err
	}
	for _, f := range []string{"cpu.shares", "cpu.weight"} {
		if w, err := os.ReadFile(filepath.Join(ctr, f)); err == nil {
			if err := os.WriteFile(filepath.Join(dir, f), w, 0o644); err != nil {
				return dir, err
			}
		}
	}
	return dir, os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
}

// sliceDeviceCounts counts the ResourceSlices' devices by driver/node.
func sliceDeviceCounts(k kc) (map[string]int, error) {
	var list resourceapi.ResourceSliceList
	if err := k.c.GetJSON(k.ctx, &list, "resourceslices"); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, s := range list.Items {
		if s.Spec.NodeName != nil {
			out[s.Spec.Driver+"/"+*s.Spec.NodeName] += len(s.Spec.Devices)
		}
	}
	return out, nil
}

// checkNVIDIAClaimPod checks the claim pod p of gpu.nvidia.com on nv-a:
// its claim is allocated one GPU of NVIDIA's driver, the node has the
// claim's CDI spec as NVIDIA's driver names it with the toolkit's hooks,
// and the container sees exactly that GPU (its one /dev/nvidia<minor>,
// libcuda counting one device, NVIDIA_VISIBLE_DEVICES=void as the
// toolkit's spec sets). It returns the spec's path on the node.
func checkNVIDIAClaimPod(k kc, p corev1.Pod) string {
	t := k.t
	t.Helper()
	names := podClaims(&p)
	if len(names) != 1 {
		t.Fatalf("pod %s: claims %v, want one", p.Name, names)
	}
	var claim resourceapi.ResourceClaim
	if err := k.c.GetJSON(k.ctx, &claim, "resourceclaim", "-n", p.Namespace, names[0]); err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s: allocation %+v, want one device", claim.Name, claim.Status.Allocation)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	n := k.c.Node(p.Spec.NodeName)
	want := ""
	for _, g := range n.GPU.GPUs {
		if r.Device == fmt.Sprintf("gpu-%d", g.Minor) {
			want = fmt.Sprintf("/dev/nvidia%d", g.Minor)
		}
	}
	if r.Driver != nvidiaDriver || r.Pool != n.Name || want == "" {
		t.Fatalf("claim %s: device %s/%s/%s, want one of %s's GPUs of %s", claim.Name, r.Driver, r.Pool, r.Device, n.Name, nvidiaDriver)
	}
	spec := nvidiaClaimSpec(string(claim.UID))
	data, err := os.ReadFile(n.HostPath(spec))
	if err != nil {
		t.Fatalf("node %s: the claim's CDI spec: %v", n.Name, err)
	}
	for _, s := range []string{"kind: k8s.gpu.nvidia.com/claim", "name: " + string(claim.UID) + "-" + r.Device, "create-symlinks", "update-ldcache", "enable-cuda-compat", "NVIDIA_VISIBLE_DEVICES=void"} {
		if !strings.Contains(string(data), s) {
			t.Errorf("node %s: the claim's CDI spec %s has no %q:\n%s", n.Name, spec, s, data)
		}
	}
	v := viewGPUPod(k, p)
	if !slices.Equal(v.devices, []string{want}) || v.cudaDevices != "1" || !slices.Equal(v.visible, []string{"void"}) {
		t.Errorf("pod %s: claim of %s: the container sees device nodes %v (want [%s]), libcuda devices=%q (want 1), NVIDIA_VISIBLE_DEVICES %v (want void)",
			p.Name, r.Device, v.devices, want, v.cudaDevices, v.visible)
	}
	return spec
}
