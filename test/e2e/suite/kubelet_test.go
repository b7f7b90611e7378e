package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// kubeletOptIn is the env var that turns the kubelet phase on.
const kubeletOptIn = "NRI_GPU_E2E_KUBELET"

// startKubelet builds the kubelet on first use (a few minutes) and starts
// it against rt's CRI endpoint; it stops when the test ends, printing its
// log tail if the test failed.
func startKubelet(t *testing.T, rt harness.Runtime) *harness.Kubelet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	bin, err := harness.InstallKubelet(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("InstallKubelet: %s", time.Since(start).Round(time.Millisecond))
	ep, ok := rt.(harness.CRIEndpointer)
	if !ok {
		t.Fatalf("%s has no CRI endpoint for a kubelet (harness.CRIEndpointer)", rt.Name())
	}
	k, err := harness.StartKubelet(ctx, harness.KubeletOptions{Binary: bin, Runtime: ep})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- tail of %s ---\n%s", k.LogPath, k.LogTail(12000))
		}
		if err := k.Stop(); err != nil {
			t.Errorf("stopping kubelet: %v", err)
		}
	})
	return k
}

// gpuPod is a static pod manifest: host network, one glibc-image container
// sleeping, with limits nvidia.com/gpu: gpus and env.
func gpuPod(name string, gpus int, env map[string]string) []byte {
	return podManifest(name, nil, map[string]int{"nvidia.com/gpu": gpus}, env)
}

// podManifest is a static pod manifest: host network, pod annotations ann,
// one glibc-image container named main sleeping, with limits (resource ->
// count, none when 0) and env.
func podManifest(name string, ann map[string]string, limits map[string]int, env map[string]string) []byte {
	var envs []any
	for k, v := range env {
		envs = append(envs, map[string]string{"name": k, "value": v})
	}
	lim := map[string]any{}
	for r, n := range limits {
		if n > 0 {
			lim[r] = fmt.Sprint(n)
		}
	}
	pod := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": name, "namespace": "default", "annotations": ann},
		"spec": map[string]any{
			"hostNetwork": true,
			// sleep as PID 1 ignores SIGTERM: do not wait 30 s for it.
			"terminationGracePeriodSeconds": 1,
			"containers": []any{map[string]any{
				"name":            "main",
				"image":           harness.GlibcImage,
				"imagePullPolicy": "Never",
				"command":         []string{"sleep", "3600"},
				"env":             envs,
				"resources":       map[string]any{"limits": lim},
			}},
		},
	}
	b, _ := json.Marshal(pod)
	return b
}

// waitFor polls cond every 200 ms until it returns true or timeout passes;
// the last message cond gave is the failure.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, timeout, msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKubelet runs nri-gpu's device plugin under a real standalone kubelet
// (no API server; static pods) on the suite's private containerd and
// simulated node: a pod with limits nvidia.com/gpu: 2 runs with exactly the
// two GPUs the kubelet assigned, a pod asking for more GPUs than are free
// is refused by the kubelet's admission, the assignments survive restarts
// of nri-gpu, the kubelet and containerd, and a GPU that vanishes from the
// node goes Unhealthy at the kubelet until it is back.
func TestKubelet(t *testing.T) {
	if os.Getenv(kubeletOptIn) != "1" {
		t.Skipf("runs only with %s=1, which make e2e sets for its containerd 2.4.2 run (it builds kubelet %s on first use, about 4 min)", kubeletOptIn, harness.KubeletVersion)
	}
	c := startRuntime(t, harness.RuntimeOptions{})
	// devicePlugin.devRoot: Allocate names the simulated node's device
	// nodes on the host, which containerd reads to build the container's
	// device list (/dev/nvidia<minor> inside), so the host's /dev is not
	// touched.
	n := newNode(t, simnode.LayoutRHEL, "")
	n.appendConfig(t, fmt.Sprintf("devicePlugin:\n  enabled: true\n  devRoot: %s\n", filepath.Join(n.Root, "dev")))
	k := startKubelet(t, c)
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: context.Background()}
	socket := filepath.Join(t.TempDir(), "status.sock")
	// --watch-interval 1s: a GPU whose /proc entry goes (procfs sends no
	// file events) is seen within a second, not the default 30.
	pluginArgs := []string{"--status-socket", socket, "--watch-interval", "1s"}
	w.plugin = startPlugin(t, c, n, pluginArgs...)

	// The kubelet has the plugin's four GPUs once it registered and sent
	// its first ListAndWatch answer.
	var uuids []string
	for _, g := range n.GPUs {
		uuids = append(uuids, g.UUID)
	}
	sort.Strings(uuids)
	waitHealthy(t, "the four GPUs", uuids)

	// A pod with two GPUs runs, with exactly the kubelet's two.
	gpu2, assigned2 := runKubeletPod(t, w, k, "gpu2", 2, nil)
	t.Run("two GPUs in the container", func(t *testing.T) {
		checkKubeletGPUs(t, gpu2, assigned2)
		// The glibc image loads the driver's libcuda.so.1 from nri-gpu's
		// mounts, and the simulated libcuda counts the container's
		// /dev/nvidia<N>: exactly the two.
		out, code := gpu2.sh("gpucheck cuda nvml")
		if code != 0 || !strings.Contains(out, "libcuda.so.1: ok") || !strings.Contains(out, "devices=2") || !strings.Contains(out, "libnvidia-ml.so.1: ok") {
			t.Errorf("gpucheck cuda nvml: exit %d:\n%s\n%s", code, out, gpu2.view())
		}
		// The kubelet's capacity for nvidia.com/gpu is its healthy
		// devices: the checkpoint's RegisteredDevices (no API server here
		// to show the node's allocatable).
		cp, err := harness.ReadDeviceCheckpoint()
		if err != nil {
			t.Fatal(err)
		}
		if got := sorted(cp.Registered["nvidia.com/gpu"]); !slices.Equal(got, uuids) {
			t.Errorf("kubelet's healthy nvidia.com/gpu: %v, want the node's four %v", got, uuids)
		}
		checkTableIsCheckpoint(t, w, k, socket)
	})

	// Two GPUs are left; a pod asking for three is refused at admission
	// and never reaches the runtime.
	t.Run("more GPUs than free: UnexpectedAdmissionError", func(t *testing.T) {
		rejected(t, w, k, "gpu3", 3)
	})

	// A CUDA image carries NVIDIA_VISIBLE_DEVICES=all in its config; with
	// one GPU from the kubelet it must see that one, never one of gpu2's.
	var cuda *ctr
	var assignedCuda []string
	t.Run("NVIDIA_VISIBLE_DEVICES=all with one kubelet GPU", func(t *testing.T) {
		cuda, assignedCuda = runKubeletPod(t, w, k, "cuda1", 1, map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"})
		for _, u := range assignedCuda {
			if slices.Contains(assigned2, u) {
				t.Errorf("kubelet gave pod cuda1 %s, held by gpu2", u)
			}
		}
		checkKubeletGPUs(t, cuda, assignedCuda)
	})
	if cuda == nil {
		t.FailNow()
	}

	outer := t
	t.Run("restarts of nri-gpu, the kubelet and containerd keep the GPUs", func(t *testing.T) {
		running := []*ctr{gpu2, cuda}
		before := map[string]runningState{}
		for _, c := range running {
			before[c.id] = stateOf(t, c)
		}
		check := func(t *testing.T, after string) {
			t.Helper()
			for _, c := range running {
				if got := stateOf(t, c); got != before[c.id] {
					t.Errorf("after %s: %s is %+v, was %+v", after, c.name, got, before[c.id])
				}
			}
			checkKubeletGPUs(t, gpu2, assigned2)
			checkKubeletGPUs(t, cuda, assignedCuda)
			checkTableIsCheckpoint(t, w, k, socket)
		}

		w.plugin.stop()
		w.plugin = startPlugin(outer, c, n, pluginArgs...) // lives on after this subtest
		waitLog(t, w.plugin, "registered with the kubelet", 1)
		waitHealthy(t, "the four GPUs after an nri-gpu restart", uuids)
		check(t, "an nri-gpu restart")

		registered := strings.Count(w.plugin.log.String(), "registered with the kubelet")
		if err := k.Restart(w.ctx); err != nil {
			t.Fatal(err)
		}
		// The restarted kubelet empties the socket directory and makes
		// its socket anew; nri-gpu serves and registers again.
		waitLog(t, w.plugin, "registered with the kubelet", registered+1)
		waitHealthy(t, "the four GPUs after a kubelet restart", uuids)
		check(t, "a kubelet restart")

		synced := strings.Count(w.plugin.log.String(), "synchronized with the runtime")
		if err := c.Restart(w.ctx); err != nil {
			t.Fatal(err)
		}
		waitLog(t, w.plugin, "synchronized with the runtime", synced+1)
		check(t, "a containerd restart")

		// One GPU is free: a new pod gets it, none of the held ones.
		after, assigned := runKubeletPod(t, w, k, "after", 1, nil)
		held := append(slices.Clone(assigned2), assignedCuda...)
		if slices.Contains(held, assigned[0]) {
			t.Errorf("after the restarts the kubelet gave pod after %s, held by %v", assigned[0], held)
		}
		checkKubeletGPUs(t, after, assigned)
		checkTableIsCheckpoint(t, w, k, socket)
		rejected(t, w, k, "full", 1)
		// Free it again for the health check.
		if err := k.RemoveStaticPod("after"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, "pod after's container stopped", func() (bool, string) {
			ci, err := w.cri.Inspect(w.ctx, after.id)
			if err != nil {
				return true, "" // removed
			}
			return ci.Status.State == runtimeapi.ContainerState_CONTAINER_EXITED, ci.Status.State.String()
		})
	})

	t.Run("a GPU that vanishes goes Unhealthy and comes back", func(t *testing.T) {
		held := append(slices.Clone(assigned2), assignedCuda...)
		var gone simnode.GPU
		for _, g := range n.GPUs {
			if !slices.Contains(held, g.UUID) {
				gone = g
			}
		}
		if gone.UUID == "" {
			t.Fatalf("no free GPU: all of %v held", held)
		}
		// A second ListAndWatch stream, beside the kubelet's, sees what
		// the plugin sends.
		health := watchHealth(t, filepath.Join(harness.DevicePluginDir, "nri-gpu-nvidia.com-gpu.sock"))
		health.wait(t, gone.UUID, pluginapi.Healthy)
		restore := vanish(t, n, gone)
		health.wait(t, gone.UUID, pluginapi.Unhealthy)
		healthy := slices.DeleteFunc(slices.Clone(uuids), func(u string) bool { return u == gone.UUID })
		waitHealthy(t, "GPU "+gone.UUID+" gone from the healthy ones", healthy)
		waitLog(t, w.plugin, "GPU unhealthy", 1)
		// Its only free GPU is unhealthy: the kubelet has none to give.
		rejected(t, w, k, "sick", 1)
		restore()
		health.wait(t, gone.UUID, pluginapi.Healthy)
		waitHealthy(t, "GPU "+gone.UUID+" healthy again", uuids)
		waitLog(t, w.plugin, "GPU healthy again", 1)
		back, assigned := runKubeletPod(t, w, k, "back", 1, nil)
		if !slices.Equal(assigned, []string{gone.UUID}) {
			t.Errorf("pod back got %v, want the restored %s", assigned, gone.UUID)
		}
		checkKubeletGPUs(t, back, assigned)
		checkTableIsCheckpoint(t, w, k, socket)
	})
}

// sorted returns a sorted copy of s.
func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// waitHealthy waits until the kubelet's checkpoint lists exactly want
// (sorted) as nvidia.com/gpu's healthy devices (RegisteredDevices holds the
// healthy ones; the kubelet rewrites it at each ListAndWatch answer).
func waitHealthy(t *testing.T, what string, want []string) {
	t.Helper()
	waitFor(t, 30*time.Second, "kubelet checkpoint: "+what, func() (bool, string) {
		cp, err := harness.ReadDeviceCheckpoint()
		if err != nil {
			return false, err.Error()
		}
		got := sorted(cp.Registered["nvidia.com/gpu"])
		return slices.Equal(got, want), fmt.Sprintf("registered %v, want %v", cp.Registered, want)
	})
}

// waitLog waits until nri-gpu's log has at least n lines containing s.
func waitLog(t *testing.T, p *plugin, s string, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("nri-gpu log: %d× %q", n, s), func() (bool, string) {
		got := strings.Count(p.log.String(), s)
		return got >= n, fmt.Sprintf("%d times", got)
	})
}

// rejected adds static pod name asking for gpus GPUs and checks that the
// kubelet's admission refuses it and that it never reaches containerd.
func rejected(t *testing.T, w *world, k *harness.Kubelet, name string, gpus int) {
	t.Helper()
	if err := k.AddStaticPod(name, gpuPod(name, gpus, nil)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "pod "+name+" rejected", func() (bool, string) {
		p, err := k.Pod(w.ctx, name)
		if err != nil {
			return false, err.Error()
		}
		b, _ := json.Marshal(p.Status)
		return p.Status.Phase == "Failed" && p.Status.Reason == "UnexpectedAdmissionError", string(b)
	})
	cs, err := w.cri.Runtime.ListContainers(w.ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.name": name + "-" + k.Opts.NodeName}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Containers) != 0 {
		t.Errorf("pod %s has %d containers in containerd, want none", name, len(cs.Containers))
	}
}

// runningState is what must not change across restarts: the container's
// init process (host PID) and start time, and that it runs.
type runningState struct {
	Pid       int
	StartedAt int64
	State     runtimeapi.ContainerState
}

func stateOf(t *testing.T, c *ctr) runningState {
	t.Helper()
	ci, err := c.w.cri.Inspect(c.w.ctx, c.id)
	if err != nil {
		t.Fatal(err)
	}
	return runningState{Pid: ci.Pid, StartedAt: ci.Status.StartedAt, State: ci.Status.State}
}

// vanish takes GPU g off the simulated node as a fallen-off-the-bus GPU
// leaves it: its device node and its /proc/driver/nvidia/gpus/<bus> entry
// go (moved aside). The returned func puts them back.
func vanish(t *testing.T, n *node, g simnode.GPU) (restore func()) {
	t.Helper()
	aside := t.TempDir()
	var moved [][2]string
	for _, p := range []string{
		filepath.Join(n.Root, "dev", fmt.Sprintf("nvidia%d", g.Minor)),
		filepath.Join(n.Root, "proc/driver/nvidia/gpus", g.BusID),
	} {
		to := filepath.Join(aside, filepath.Base(p))
		if err := moveAside(p, to); err != nil {
			t.Fatal(err)
		}
		moved = append(moved, [2]string{p, to})
	}
	done := false
	restore = func() {
		if done {
			return
		}
		done = true
		for _, m := range moved {
			if err := moveAside(m[1], m[0]); err != nil {
				t.Errorf("restoring %s: %v", m[0], err)
			}
		}
	}
	t.Cleanup(restore)
	return restore
}

// moveAside renames from to to, copying across file systems with cp -a.
func moveAside(from, to string) error {
	if err := os.Rename(from, to); err == nil {
		return nil
	}
	if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
		return fmt.Errorf("cp -a %s %s: %v: %s", from, to, err, out)
	}
	return os.RemoveAll(from)
}

// statusGPU is one row of `nri-gpu status -o json`.
type statusGPU struct {
	Index   int                 `json:"index"`
	UUID    string              `json:"uuid"`
	Holders []alloc.HolderState `json:"holders"`
	Kubelet []alloc.Holder      `json:"kubelet"`
}

// checkTableIsCheckpoint checks that nri-gpu's allocation table (its
// status over socket) books exactly the kubelet's assignments of the pods
// that run: namespace/pod/container -> GPU UUIDs on both sides, every
// holding marked the kubelet's.
func checkTableIsCheckpoint(t *testing.T, w *world, k *harness.Kubelet, socket string) {
	t.Helper()
	out, err := exec.Command(nriGPU(t), "status", "--status-socket", socket, "-o", "json").CombinedOutput()
	var st struct {
		GPUs []statusGPU `json:"gpus"`
	}
	if err != nil || json.Unmarshal(out, &st) != nil {
		t.Fatalf("nri-gpu status: %v\n%s", err, out)
	}
	table := map[string][]string{}
	for _, g := range st.GPUs {
		for _, h := range g.Holders {
			if !h.Kubelet {
				t.Errorf("GPU %d (%s): holder %s not marked the kubelet's", g.Index, g.UUID, h.Holder)
			}
			key := h.Namespace + "/" + h.Pod + "/" + h.Container
			table[key] = append(table[key], g.UUID)
		}
		if len(g.Kubelet) != len(g.Holders) {
			t.Errorf("GPU %d: kubelet %v, holders %v", g.Index, g.Kubelet, g.Holders)
		}
	}
	pods, err := k.Pods(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	byUID := map[string]string{}
	for _, p := range pods {
		if p.Status.Phase == "Running" {
			byUID[p.Metadata.UID] = p.Metadata.Namespace + "/" + p.Metadata.Name
		}
	}
	cp, err := harness.ReadDeviceCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	kubelet := map[string][]string{}
	for _, e := range cp.Entries {
		if pod, ok := byUID[e.PodUID]; ok && e.ResourceName == "nvidia.com/gpu" {
			key := pod + "/" + e.ContainerName
			kubelet[key] = append(kubelet[key], e.DeviceIDs...)
		}
	}
	for _, m := range []map[string][]string{table, kubelet} {
		for key := range m {
			sort.Strings(m[key])
		}
	}
	if !maps.EqualFunc(table, kubelet, slices.Equal) {
		t.Errorf("nri-gpu's table %v\nthe kubelet's checkpoint %v", table, kubelet)
	} else {
		t.Logf("nri-gpu's table = the kubelet's checkpoint: %v", table)
	}
}

// runKubeletPod starts static pod name with gpus GPUs and env, waits until
// it runs, and returns its container and the GPUs the kubelet's checkpoint
// assigns it (sorted).
func runKubeletPod(t *testing.T, w *world, k *harness.Kubelet, name string, gpus int, env map[string]string) (*ctr, []string) {
	t.Helper()
	return runStaticPod(t, w, k, name, gpuPod(name, gpus, env), "nvidia.com/gpu", gpus)
}

// runStaticPod starts static pod name from manifest (one container, main),
// waits until it runs, and returns its container and the devices of
// resource the kubelet's checkpoint assigns it (sorted), which must be
// gpus many.
func runStaticPod(t *testing.T, w *world, k *harness.Kubelet, name string, manifest []byte, resource string, gpus int) (*ctr, []string) {
	t.Helper()
	if err := k.AddStaticPod(name, manifest); err != nil {
		t.Fatal(err)
	}
	var pod *harness.KubeletPod
	waitFor(t, 60*time.Second, "pod "+name+" running", func() (bool, string) {
		p, err := k.Pod(w.ctx, name)
		if err != nil {
			return false, err.Error()
		}
		pod = p
		b, _ := json.Marshal(p.Status)
		return p.Status.Phase == "Running" && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready, string(b)
	})
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	cp, err := harness.ReadDeviceCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	var assigned []string
	for _, e := range cp.Entries {
		if e.PodUID == pod.Metadata.UID && e.ContainerName == "main" && e.ResourceName == resource {
			assigned = append(assigned, e.DeviceIDs...)
		}
	}
	sort.Strings(assigned)
	if len(assigned) != gpus {
		t.Fatalf("kubelet checkpoint: pod %s (uid %s) has GPUs %v, want %d; entries %+v", name, pod.Metadata.UID, assigned, gpus, cp.Entries)
	}
	return &ctr{w: w, id: id, name: name}, assigned
}

// checkKubeletGPUs checks that c has exactly the GPUs assigned (UUIDs):
// their device nodes in the container and in its OCI spec, and
// NVIDIA_VISIBLE_DEVICES naming them.
func checkKubeletGPUs(t *testing.T, c *ctr, assigned []string) {
	t.Helper()
	byUUID := map[string]int{}
	for _, g := range c.w.node.GPUs {
		byUUID[g.UUID] = g.Minor
	}
	var want []string
	for _, u := range assigned {
		m, ok := byUUID[u]
		if !ok {
			t.Fatalf("kubelet assigned %q, not a GPU of the node", u)
		}
		want = append(want, fmt.Sprintf("/dev/nvidia%d", m))
	}
	sort.Strings(want)
	if got := gpuNodes(c); !slices.Equal(got, want) {
		t.Errorf("GPU nodes %q, want exactly %q (the kubelet's %v)\n%s", got, want, assigned, c.view())
	}
	got := strings.Split(envOf(c, "NVIDIA_VISIBLE_DEVICES"), ",")
	sort.Strings(got)
	if !slices.Equal(got, assigned) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want the kubelet's %v", got, assigned)
	}
	ci, err := c.w.cri.Inspect(c.w.ctx, c.id)
	if err != nil {
		t.Fatal(err)
	}
	var specGPUs []string
	if ci.Spec.Linux != nil {
		for _, d := range ci.Spec.Linux.Devices {
			if d.Major == 195 && d.Minor < 254 {
				specGPUs = append(specGPUs, fmt.Sprintf("%s (%d:%d)", d.Path, d.Major, d.Minor))
			}
		}
	}
	if len(specGPUs) != len(assigned) {
		t.Errorf("OCI spec GPU devices %v, want %d (the kubelet's %v)", specGPUs, len(assigned), assigned)
	}
	t.Logf("%s: annotations %v; OCI spec GPU devices %v", c.name, ci.Status.Annotations, specGPUs)
}

// healthWatch is a ListAndWatch stream of a device plugin: the health of
// each device in the latest list.
type healthWatch struct {
	mu     sync.Mutex
	health map[string]string
	err    error
}

// watchHealth opens a ListAndWatch stream on the device plugin's socket;
// it closes when the test ends.
func watchHealth(t *testing.T, socket string) *healthWatch {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	h := &healthWatch{health: map[string]string{}}
	go func() {
		for {
			resp, err := stream.Recv()
			h.mu.Lock()
			if err != nil {
				h.err = err
				h.mu.Unlock()
				return
			}
			h.health = map[string]string{}
			for _, d := range resp.Devices {
				h.health[d.ID] = d.Health
			}
			h.mu.Unlock()
		}
	}()
	return h
}

// wait waits until the latest list gives device id health.
func (h *healthWatch) wait(t *testing.T, id, health string) {
	t.Helper()
	waitFor(t, 30*time.Second, "ListAndWatch: "+id+" "+health, func() (bool, string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.health[id] == health, fmt.Sprintf("latest list %v (stream error %v)", h.health, h.err)
	})
}
