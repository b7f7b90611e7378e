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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

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
)

// nvidiaNode is the bench's second node: containerd with
// nvidia-container-runtime (CDI mode, the toolkit's spec of the node's
// simulated GPUs with its hooks) as runtime handler "nvidia", and no
// nri-gpu (not labelled nvidia.com/gpu.present).
func nvidiaNode(t *testing.T) harness.NodeOptions {
	return harness.NodeOptions{
		Name: "nv-a", Runtime: harness.RuntimeContainerd24, GPUs: &simnode.Options{NumGPUs: 4, Layout: simnode.LayoutRHEL},
		Prepare: func(n *harness.Node, o *harness.NodeOptions) error {
			ctx := context.Background()
			dir := filepath.Join(harness.DefaultCacheDir(), "nvidia-container-toolkit-"+bench.ToolkitVersion)
			tk := "github.com/NVIDIA/nvidia-container-toolkit/cmd/"
			hook, err := harness.GoInstall(ctx, dir, tk+"nvidia-cdi-hook@"+bench.ToolkitVersion, "nvidia-cdi-hook", nil, nil)
			if err != nil {
				return err
			}
			rt, err := harness.GoInstall(ctx, dir, tk+"nvidia-container-runtime@"+bench.ToolkitVersion, "nvidia-container-runtime", nil, nil)
			if err != nil {
				return err
			}
			tools, err := harness.InstallTools(ctx, "", "")
			if err != nil {
				return err
			}
			nd := n.NS.Dir
			specDir := filepath.Join(nd, "cdi-nvidia")
			if err := os.MkdirAll(specDir, 0o755); err != nil {
				return err
			}
			if err := bench.WriteToolkitSpec(specDir, "nvidia.json", n.GPU, hook); err != nil {
				return err
			}
			cfg := filepath.Join(nd, "nvidia-container-runtime.toml")
			if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`[nvidia-container-runtime]
log-level = "info"
mode = "cdi"
runtimes = [%q]

[nvidia-container-runtime.modes.cdi]
spec-dirs = [%q]
default-kind = %q
`, tools.Runc, specDir, bench.ToolkitKind)), 0o644); err != nil {
				return err
			}
			o.RuntimeExtraConfig = fmt.Sprintf(`
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"
runtime_path = %q

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
BinaryName = %q
Root = %q
SystemdCgroup = false
`, tools.Shim, rt, filepath.Join(nd, "runc-nvidia"))
			o.RuntimeEnv = []string{"NVIDIA_CTK_CONFIG_FILE_PATH=" + cfg}
			return nil
		},
	}
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
// nvidia.com/gpu and runtime class rc when set.
func benchPod(name, node string, gpus int, rc string) string {
	extra := ""
	if rc != "" {
		extra = "  runtimeClassName: " + rc + "\n"
	}
	res := ""
	if gpus > 0 {
		res = fmt.Sprintf("    resources: {limits: {nvidia.com/gpu: %d}}\n", gpus)
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

// TestClusterPodStart measures pod start as the cluster sees it (the API
// server's ADDED to Running, from one watch) in paired rounds, each path
// once per round in a shuffled order: a GPU-less pod and a 1-GPU pod
// through nri-gpu on gpu-a, a GPU-less pod and a 1-GPU pod through
// NVIDIA's device plugin (a stand-in answering as its envvar strategy)
// plus nvidia-container-runtime as a runtime class on nv-a (same runtime
// and kubelet, no nri-gpu). It prints each path's median and the paired
// ratios with their 95% intervals (docs/benchmarks.md).
func TestClusterPodStart(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv(clusterBenchOptIn))
	if rounds <= 0 {
		t.Skipf("runs only with %s=<rounds> (make bench-cluster: 50)", clusterBenchOptIn)
	}
	version := harness.KubernetesVersion
	if v := strings.Fields(os.Getenv(clusterOptIn)); len(v) > 0 {
		version = v[0]
	}
	nodes := []harness.NodeOptions{harness.GPUNodes()[0], nvidiaNode(t)}
	c := startTestCluster(t, version, nodes)
	k := kc{t: t, c: c, ctx: context.Background()}
	k.doc("label", map[string]string{"node": "gpu-a"})
	k.doc("apply", nil)
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
	k.run("create", "namespace", "bench")
	w := startPodWatch(t, c, "bench")

	paths := []struct {
		name, node, rc string
		gpus           int
	}{{pathPlainA, "gpu-a", "", 0}, {pathNRIGPU, "gpu-a", "", 1}, {pathPlainB, "nv-a", "", 0}, {pathNVIDIA, "nv-a", "nvidia", 1}}
	res := &bench.Result{Samples: map[string][]bench.Sample{}}
	for r := -1; r < rounds; r++ { // round -1 warms up and checks
		order := rand.Perm(len(paths))
		for _, i := range order {
			p := paths[i]
			name := fmt.Sprintf("p%d-r%d", i, r+1)
			k.apply(benchPod(name, p.node, p.gpus, p.rc))
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
			if r < 0 && p.gpus > 0 {
				v := viewGPUPod(k, *pod)
				if p.rc == "" {
					checkSeesExactly(k, v, 1)
				} else if len(v.devices) != 1 || v.cudaDevices != "1" {
					t.Errorf("%s: the NVIDIA path gave device nodes %v, libcuda devices=%q; want one GPU", p.name, v.devices, v.cudaDevices)
				}
			}
			k.run("delete", "pod", "-n", "bench", name, "--grace-period=0", "--wait=true")
			if r >= 0 {
				res.Samples[p.name] = append(res.Samples[p.name], bench.Sample{Create: d})
			}
		}
	}
	for _, p := range paths {
		s := res.Stat(p.name, bench.Create)
		t.Logf("%-95s p50 %7.1f ms (p10 %.1f, p90 %.1f)", p.name, s.P50, s.P10, s.P90)
	}
	for _, q := range [][2]string{{pathNRIGPU, pathPlainA}, {pathNVIDIA, pathPlainB}, {pathNVIDIA, pathNRIGPU}} {
		m, lo, hi := res.Ratio(q[0], q[1], bench.Create)
		t.Logf("%s / %s: %.3f (95%% interval %.3f-%.3f), %d rounds", q[0], q[1], m, lo, hi, rounds)
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
