package suite

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// The sharing phase of the kustomize install (docs/sharing.md): the
// device plugin of every node advertises its GPU 0 alone
// (devicePlugin.devices), as 4 replicas, first time-sliced, then with MPS
// under nri-gpu mps's DaemonSet (deploy/kubernetes/mps).

// sharingNS is the namespace of the sharing phase's pods.
const sharingNS = "share"

// mpsRoot is devicePlugin.mpsRoot's default, as the nodes see it.
const mpsRoot = "/run/nri-gpu/mps"

// sharingConfig is the test overlay's ConfigMap with the device plugin
// advertising GPU 0 as 4 replicas of strategy ("timeSlicing" or "mps").
func sharingConfig(t *testing.T, strategy string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(harness.KustomizeOverlay(repoRoot()), "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const at = "      devRoot: /run/nvidia/driver/dev\n"
	if !bytes.Contains(data, []byte(at)) {
		t.Fatalf("the overlay's config.yaml has no line %q", at)
	}
	add := at + `      devices: ["0"]
      sharing:
        ` + strategy + `:
          resources:
          - {name: nvidia.com/gpu, replicas: 4}
`
	return strings.Replace(string(data), at, add, 1)
}

// mpsDaemonSet is deploy/kubernetes/mps/daemonset.yaml as the test
// cluster needs it: the release image the nodes have, the simulated
// node's kernel side and driver under /run/nvidia/driver (as the overlay's
// hostpaths.yaml does for nri-gpu run), and the simulated NVML's state
// directory writable (where it keeps the compute modes NVML sets).
func mpsDaemonSet(k kc) string {
	data, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "kubernetes", "mps", "daemonset.yaml"))
	if err != nil {
		k.t.Fatal(err)
	}
	s := string(data)
	for _, r := range [][2]string{
		{"image: ghcr.io/nri-gpu/nri-gpu:0.1.0", "image: " + releaseImage(k, "").Name},
		{"path: /proc\n", "path: /run/nvidia/driver/proc\n"},
		{"path: /dev\n", "path: /run/nvidia/driver/dev\n"},
		{"path: /sys\n", "path: /run/nvidia/driver/sys\n"},
		{"          path: /\n", "          path: /run/nvidia/driver\n"},
		{"        - name: mps-root\n          mountPath:", "        - name: sim-nvml\n          mountPath: /driver-root/run/nri-gpu-sim\n        - name: mps-root\n          mountPath:"},
		{"      - name: mps-root\n        hostPath:", "      - name: sim-nvml\n        hostPath:\n          path: /run/nvidia/driver/run/nri-gpu-sim\n          type: Directory\n      - name: mps-root\n        hostPath:"},
	} {
		if !strings.Contains(s, r[0]) {
			k.t.Fatalf("deploy/kubernetes/mps/daemonset.yaml has no %q", r[0])
		}
		s = strings.Replace(s, r[0], r[1], 1)
	}
	if why := fullCapabilities(); why != "" {
		// CRI-O asks the kernel for every capability for a privileged
		// container, and runc fails where the host's bounding set lacks
		// one; the simulated node needs root alone (its NVML sets compute
		// modes as root, its GPUs are files).
		k.t.Logf("nri-gpu mps's pod runs unprivileged here (root): %s", why)
		s = strings.Replace(s, "privileged: true", "privileged: false", 1)
	}
	return s
}

// fullCapabilities says which capabilities the host's bounding set lacks
// ("" for none).
func fullCapabilities() string {
	status, err1 := os.ReadFile("/proc/self/status")
	last, err2 := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err1 != nil || err2 != nil {
		return fmt.Sprint("cannot read the bounding set: ", err1, err2)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(last)))
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			bnd, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if want := uint64(1)<<(n+1) - 1; err != nil || bnd&want != want {
				return fmt.Sprintf("CapBnd %s lacks capabilities of 0..%d (mask %x)", strings.TrimSpace(v), n, want&^bnd)
			}
			return ""
		}
	}
	return "no CapBnd in /proc/self/status"
}

// restartNRIGPU replaces nri-gpu's pods (the device plugin's keys are
// read at start) and waits until every node has a new one running whose
// log says logs ("" for none), whose device plugin the kubelet has
// registered GPU 0's four replicas of (healthy: the kubelet's checkpoint
// lists only those), and that advertises them.
func restartNRIGPU(k kc, logs string) {
	k.t.Helper()
	old := map[string]bool{}
	for _, n := range k.c.Nodes {
		old[daemonPod(k, n.Name)] = true
	}
	k.run("delete", "pod", "-n", "nri-gpu", "-l", "app.kubernetes.io/name=nri-gpu", "--wait=false")
	for _, n := range k.c.Nodes {
		var pod string
		k.wait(2*time.Minute, "a new nri-gpu pod Ready on "+n.Name, func() (bool, string, error) {
			pods, err := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu")
			if err != nil {
				return false, err.Error(), nil
			}
			for i := range pods {
				p := &pods[i]
				if p.Spec.NodeName == n.Name && !old[p.Name] && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && harness.PodReady(p) {
					pod = p.Name
					return true, "", nil
				}
			}
			return false, fmt.Sprint(len(pods), " pods"), nil
		})
		if logs != "" {
			k.wait(time.Minute, pod+"'s log says "+logs, func() (bool, string, error) {
				out, err := k.c.Kubectl(k.ctx, "logs", "-n", "nri-gpu", pod)
				return err == nil && strings.Contains(out, logs), lastLines(out, 3), nil
			})
		}
		waitReplicasHealthy(k, n)
		waitAllocatable(k, n.Name, "4")
	}
}

// waitReplicasHealthy waits until the kubelet of node n has GPU 0's four
// replicas healthy (its checkpoint lists the healthy devices of each
// resource).
func waitReplicasHealthy(k kc, n *harness.Node) {
	k.t.Helper()
	var want []string
	for i := range 4 {
		want = append(want, fmt.Sprintf("%s::%d", n.GPU.GPUs[0].UUID, i))
	}
	k.wait(time.Minute, n.Name+": the kubelet has GPU 0's replicas healthy", func() (bool, string, error) {
		cp, err := harness.ReadDeviceCheckpointAt(n.HostPath(harness.KubeletCheckpoint))
		if err != nil {
			return false, err.Error(), nil
		}
		got := slices.Clone(cp.Registered["nvidia.com/gpu"])
		slices.Sort(got)
		return slices.Equal(got, want), fmt.Sprint(got), nil
	})
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// waitAllocatable waits until node advertises want nvidia.com/gpu.
func waitAllocatable(k kc, node, want string) {
	k.t.Helper()
	k.wait(2*time.Minute, "node "+node+" allocatable nvidia.com/gpu = "+want, func() (bool, string, error) {
		n, err := k.c.GetNode(k.ctx, node)
		if err != nil {
			return false, err.Error(), nil
		}
		got := n.Status.Allocatable["nvidia.com/gpu"]
		return got.String() == want, "allocatable " + got.String(), nil
	})
}

// envYAML is a container's env block (after its command line) of env
// (KEY=VALUE), "" for none.
func envYAML(env []string) string {
	if len(env) == 0 {
		return ""
	}
	var e strings.Builder
	e.WriteString("\n    env:")
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&e, "\n    - {name: %s, value: %q}", k, v)
	}
	return e.String()
}

// sharePod is a pod on node with limits nvidia.com/gpu: 1 running
// command, its container main with env (KEY=VALUE).
func sharePod(name, node, command string, env ...string) string {
	envBlock := envYAML(env)
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {app: %s}}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: %s}
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sh, -c, %q]%s
    resources: {limits: {nvidia.com/gpu: 1}}
`, name, sharingNS, name, node, harness.GlibcImage, command, envBlock)
}

// testSharing is the sharing phase, on the kustomize install: replicas
// time-sliced, then MPS. It leaves nri-gpu installed, serving replicas.
func testSharing(k kc) {
	start := time.Now()
	k.run("create", "namespace", sharingNS)
	k.t.Run("time-slicing", func(t *testing.T) { testTimeSlicing(kc{t: t, c: k.c, ctx: k.ctx}) })
	k.t.Run("mps", func(t *testing.T) { testMPS(kc{t: t, c: k.c, ctx: k.ctx}) })
	k.run("delete", "namespace", sharingNS, "--wait=true", "--timeout=2m")
	for _, n := range k.c.Nodes {
		_, _ = k.c.Kubectl(k.ctx, "label", "node", n.Name, "nri-gpu.dev/mps-")
	}
	k.t.Logf("sharing phase: %s", time.Since(start).Round(time.Second))
}

// testTimeSlicing: with replicas: 4 of each node's GPU 0, five pods with
// nvidia.com/gpu: 1 on gpu-a (containerd): four run, each given another
// replica of GPU 0 and seeing GPU 0 alone, nri-gpu's table books them
// shared on GPU 0; the fifth is Pending with the scheduler's reason. A pod
// on gpu-b (CRI-O) gets a replica of its GPU 0 the same way.
func testTimeSlicing(k kc) {
	t := k.t
	k.apply(sharingConfig(t, "timeSlicing"))
	restartNRIGPU(k, "")
	var all []string
	for i := range 5 {
		all = append(all, sharePod(fmt.Sprintf("ts-%d", i), "gpu-a", "sleep 3600"))
	}
	k.apply(strings.Join(append(all, sharePod("ts-b", "gpu-b", "sleep 3600")), "---\n"))
	var running []corev1.Pod
	k.wait(2*time.Minute, "4 of 5 ts pods on gpu-a Running, one Pending", func() (bool, string, error) {
		pods, err := k.c.ListPods(k.ctx, sharingNS, "")
		if err != nil {
			return false, err.Error(), nil
		}
		running = running[:0]
		pending := 0
		var msgs []string
		for _, p := range pods {
			if !strings.HasPrefix(p.Name, "ts-") || p.Name == "ts-b" {
				continue
			}
			msgs = append(msgs, p.Name+": "+harness.PodSummary(&p))
			switch {
			case p.Status.Phase == corev1.PodRunning:
				running = append(running, p)
			case p.Status.Phase == corev1.PodPending && p.Spec.NodeName == "":
				pending++
			}
		}
		return len(running) == 4 && pending == 1, strings.Join(msgs, "; "), nil
	})
	checkFifthPending(k)
	a := k.c.Node("gpu-a")
	replicas := map[string]string{}
	for _, p := range running {
		v := viewGPUPod(k, p)
		checkReplica(k, v, a.GPU.GPUs[0].UUID, a.GPU.GPUs[0].Minor)
		for _, id := range v.assigned {
			if o, ok := replicas[id]; ok {
				t.Errorf("replica %s given to %s and %s", id, o, p.Name)
			}
			replicas[id] = p.Name
		}
	}
	t.Logf("gpu-a: replicas given: %v", replicas)
	checkReplicaTable(k, "gpu-a", a.GPU.GPUs[0].UUID, 4)
	b := k.c.Node("gpu-b")
	pb, err := k.c.WaitPodRunning(k.ctx, sharingNS, "ts-b", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	checkReplica(k, viewGPUPod(k, *pb), b.GPU.GPUs[0].UUID, b.GPU.GPUs[0].Minor)
	k.run("delete", "pods", "-n", sharingNS, "--all", "--wait=true", "--timeout=1m")
}

// checkFifthPending checks that the Pending ts pod waits for
// nvidia.com/gpu, as the scheduler says.
func checkFifthPending(k kc) {
	k.t.Helper()
	k.wait(time.Minute, "the fifth pod: FailedScheduling with Insufficient nvidia.com/gpu", func() (bool, string, error) {
		evs, err := k.c.Events(k.ctx, sharingNS, "reason=FailedScheduling")
		if err != nil {
			return false, err.Error(), nil
		}
		var msgs []string
		for _, e := range evs {
			msgs = append(msgs, e.InvolvedObject.Name+": "+e.Message)
			if strings.HasPrefix(e.InvolvedObject.Name, "ts-") && strings.Contains(e.Message, "Insufficient nvidia.com/gpu") {
				return true, "", nil
			}
		}
		return false, strings.Join(msgs, "; "), nil
	})
}

// checkReplica checks that a pod was given one replica of the GPU uuid
// (the kubelet's checkpoint: uuid::<n>) and sees that GPU alone:
// NVIDIA_VISIBLE_DEVICES, its device node, libcuda counting one device.
func checkReplica(k kc, v gpuPodView, uuid string, minor int) {
	k.t.Helper()
	if len(v.assigned) != 1 || !strings.HasPrefix(v.assigned[0], uuid+"::") || !slices.Equal(v.visible, []string{uuid}) ||
		!slices.Equal(v.devices, []string{fmt.Sprintf("/dev/nvidia%d", minor)}) || v.cudaDevices != "1" {
		k.t.Errorf("pod %s: kubelet assigned %v (want one replica %s::<n>); sees NVIDIA_VISIBLE_DEVICES %v, device nodes %v, libcuda devices=%q",
			v.pod.Name, v.assigned, uuid, v.visible, v.devices, v.cudaDevices)
	}
}

// checkReplicaTable checks nri-gpu's table on node (nri-gpu status -o
// json): GPU uuid shared as replicas by want holders, each shared.
func checkReplicaTable(k kc, node, uuid string, want int) {
	k.t.Helper()
	argv := append(installCommand("table", map[string]string{"pod": daemonPod(k, node)}, "", "", ""), "-o", "json")
	out, err := k.c.Kubectl(k.ctx, argv[1:]...)
	var st struct {
		GPUs []struct {
			UUID       string `json:"uuid"`
			Mode       string `json:"mode"`
			Replicated string `json:"replicated"`
			Holders    []struct {
				Pod  string `json:"pod"`
				Mode string `json:"mode"`
			} `json:"holders"`
		} `json:"gpus"`
	}
	if err != nil || json.Unmarshal([]byte(out), &st) != nil {
		k.t.Fatalf("node %s: nri-gpu status: %v\n%s", node, err, out)
	}
	for _, g := range st.GPUs {
		if g.UUID != uuid {
			continue
		}
		ok := g.Mode == "shared" && strings.Contains(g.Replicated, "4 ") && len(g.Holders) == want
		for _, h := range g.Holders {
			ok = ok && h.Mode == "shared"
		}
		if !ok {
			k.t.Errorf("node %s: GPU %s in nri-gpu's table: %+v; want shared as replicas by %d holders", node, uuid, g, want)
		} else {
			k.t.Logf("node %s: GPU %s %s, %s, %d holders", node, uuid, g.Mode, g.Replicated, len(g.Holders))
		}
		return
	}
	k.t.Errorf("node %s: no GPU %s in nri-gpu's table:\n%s", node, uuid, out)
}

// mpsView is what an MPS client container sees: its CUDA_MPS_* (sorted),
// the daemon's answers through its pipe, its /dev/shm mount.
type mpsView struct {
	env              []string
	threads, memory  string
	shm, pipeEntries string
}

// viewMPSPod asks pod's container what it sees of MPS.
func viewMPSPod(k kc, pod string) (mpsView, string) {
	k.t.Helper()
	return viewMPSPodIn(k, sharingNS, pod)
}

// viewMPSPodIn is viewMPSPod of a pod in namespace ns.
func viewMPSPodIn(k kc, ns, pod string) (mpsView, string) {
	k.t.Helper()
	out, err := k.c.Exec(k.ctx, ns, pod, "main", "sh", "-c", `env | grep '^CUDA_MPS_' | sort
echo "THREADS=$(echo get_default_active_thread_percentage | nvidia-cuda-mps-control)"
echo "MEMORY=$(echo get_default_device_pinned_mem_limit 0 | nvidia-cuda-mps-control)"
echo "PIPE=$(ls /tmp/nvidia-mps | sort | tr '\n' ' ')"
echo "SHM=$(grep ' /dev/shm ' /proc/mounts | cut -d' ' -f1,3)"`)
	if err != nil {
		k.t.Errorf("pod %s: exec: %v\n%s", pod, err, out)
	}
	var v mpsView
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "CUDA_MPS_"):
			v.env = append(v.env, l)
		case strings.HasPrefix(l, "THREADS="):
			v.threads = strings.TrimPrefix(l, "THREADS=")
		case strings.HasPrefix(l, "MEMORY="):
			v.memory = strings.TrimPrefix(l, "MEMORY=")
		case strings.HasPrefix(l, "PIPE="):
			v.pipeEntries = strings.TrimSpace(strings.TrimPrefix(l, "PIPE="))
		case strings.HasPrefix(l, "SHM="):
			v.shm = strings.TrimPrefix(l, "SHM=")
		}
	}
	return v, out
}

// mpsMemLimit is one replica's memory limit of GPU 0 of node shared 4
// ways: gpu-a's simulated H100 80GB (81559 MiB), gpu-b's A100 40GB.
func mpsMemLimit(node string) string {
	if node == "gpu-b" {
		return fmt.Sprintf("%dM", harness.GPUBMemoryMiB/4)
	}
	return "20389M"
}

// checkMPSClient checks that pod, on node, is a client of its GPU's
// daemon with one replica's limits of the GPU shared 4 ways
// (mpsMemLimit): exactly nri-gpu's CUDA_MPS_*, whatever its spec set, and
// the daemon answering through the pipe with the same limits.
func checkMPSClient(k kc, pod, node string, extra ...string) {
	k.t.Helper()
	v, out := viewMPSPod(k, pod)
	mem := mpsMemLimit(node)
	want := append([]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"}, extra...)
	want = append(want, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0="+mem, "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps")
	if !slices.Equal(v.env, want) || v.threads != "25.0" || v.memory != mem || !strings.Contains(v.pipeEntries, "control") {
		k.t.Errorf("pod %s: CUDA_MPS_* %q (want %q), the daemon's answers %q %q, pipe directory %q:\n%s", pod, v.env, want, v.threads, v.memory, v.pipeEntries, out)
	} else {
		k.t.Logf("pod %s: %v; daemon: %s%% of the threads, %s; /dev/shm %s", pod, v.env, v.threads, v.memory, v.shm)
	}
}

// controlLog is the simulated MPS control daemon's log of GPU uuid on
// node n: its start, environment and every command it was sent.
func controlLog(n *harness.Node, uuid string) string {
	data, _ := os.ReadFile(n.HostPath(filepath.Join(mpsRoot, uuid, "log", "control.log")))
	return string(data)
}

// mpsDaemonPID finds the MPS control daemon of GPU uuid among the host's
// processes (the nodes' processes are the host's): the
// nvidia-cuda-mps-control started with that GPU's pipe directory.
func mpsDaemonPID(uuid string) int {
	want := []byte("CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(mpsRoot, uuid, "pipe") + "\x00")
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmd, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !bytes.HasSuffix(bytes.SplitN(cmd, []byte{0}, 2)[0], []byte("nvidia-cuda-mps-control")) || !bytes.Contains(cmd, []byte("\x00-d")) {
			continue
		}
		env, err := os.ReadFile(filepath.Join(d, "environ"))
		if err == nil && bytes.Contains(append(env, 0), want) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	return 0
}

// testMPS: with MPS on both nodes' GPU 0 (replicas: 4) and nri-gpu mps's
// DaemonSet, client pods on containerd and CRI-O get exactly one
// replica's limits in their environment, reach the daemon through its
// pipe, and the simulated daemon recorded those limits; a pod spec
// setting larger limits gets the same. Each node's daemon killed: nri-gpu
// mps starts it again and the running client reaches the new one. nri-gpu
// mps's pods gone (the daemons with them): on both nodes a container of
// the GPU created meanwhile is refused, naming the daemon, and is served
// once the daemon is back.
func testMPS(k kc) {
	t := k.t
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		pods, _ := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu-mps")
		for i := range pods {
			out, err := k.c.Kubectl(k.ctx, "logs", "-n", "nri-gpu", pods[i].Name, "--tail=40")
			t.Logf("--- %s on %s: %s; log (%v) ---\n%s", pods[i].Name, pods[i].Spec.NodeName, harness.PodSummary(&pods[i]), err, out)
		}
		evs, _ := k.c.Events(k.ctx, "nri-gpu", "")
		for _, e := range evs {
			if e.Type != "Normal" {
				t.Logf("event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
		for _, n := range k.c.Nodes {
			t.Logf("--- %s: control.log of GPU 0 ---\n%s", n.Name, controlLog(n, n.GPU.GPUs[0].UUID))
		}
	})
	k.apply(sharingConfig(t, "mps"))
	for _, n := range k.c.Nodes {
		k.run("label", "node", n.Name, "nri-gpu.dev/mps=true", "--overwrite")
	}
	k.apply(mpsDaemonSet(k))
	restartNRIGPU(k, "MPS control daemon ready")
	a, b := k.c.Node("gpu-a"), k.c.Node("gpu-b")
	ua := a.GPU.GPUs[0].UUID
	raise := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=81559M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/elsewhere", "CUDA_MPS_LOG_DIRECTORY=/tmp"}
	k.apply(strings.Join([]string{
		sharePod("mps-a", "gpu-a", "sleep 3600"),
		sharePod("mps-raise", "gpu-a", "sleep 3600", raise...),
		sharePod("mps-b", "gpu-b", "sleep 3600"),
	}, "---\n"))
	for _, p := range []string{"mps-a", "mps-raise", "mps-b"} {
		if _, err := k.c.WaitPodRunning(k.ctx, sharingNS, p, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		var extra []string
		if p == "mps-raise" {
			extra = []string{"CUDA_MPS_LOG_DIRECTORY="} // its own, set empty: NRI passes no removal on
		}
		node := "gpu-a"
		if p == "mps-b" {
			node = "gpu-b"
		}
		checkMPSClient(k, p, node, extra...)
	}
	for _, n := range []*harness.Node{a, b} {
		log := controlLog(n, n.GPU.GPUs[0].UUID)
		for _, want := range []string{"CUDA_VISIBLE_DEVICES=" + n.GPU.GPUs[0].UUID, "Cmd:set_default_active_thread_percentage 25", "Cmd:set_default_device_pinned_mem_limit 0 " + mpsMemLimit(n.Name), "Cmd:get_default_active_thread_percentage"} {
			if !strings.Contains(log, want) {
				t.Errorf("node %s: the MPS control daemon's log lacks %q:\n%s", n.Name, want, log)
			}
		}
	}
	checkReplicaTable(k, "gpu-a", ua, 2)

	// Each node's daemon killed: nri-gpu mps starts another; the running
	// client's pipe reaches it (containerd and CRI-O).
	clients := map[*harness.Node]string{a: "mps-a", b: "mps-b"}
	for _, n := range []*harness.Node{a, b} {
		killDaemon(k, n, clients[n])
	}
	// Before the next pods: the kubelet admits a pod only with healthy
	// replicas, which they are again once nri-gpu run has seen the new
	// daemon ready.
	waitReplicasHealthy(k, a)
	waitReplicasHealthy(k, b)
	testMPSDown(k, []*harness.Node{a, b}, clients)
}

// killDaemon kills the MPS control daemon of node n's GPU 0 and waits for
// nri-gpu mps to start another and for the running client pod to reach
// the new one through its pipe.
func killDaemon(k kc, n *harness.Node, client string) {
	t := k.t
	uuid := n.GPU.GPUs[0].UUID
	first := mpsDaemonPID(uuid)
	if first == 0 {
		t.Fatalf("node %s: no MPS control daemon of %s among the host's processes", n.Name, uuid)
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	k.wait(time.Minute, n.Name+": a new MPS control daemon of "+uuid, func() (bool, string, error) {
		pid := mpsDaemonPID(uuid)
		return pid != 0 && pid != first, fmt.Sprint("pid ", pid), nil
	})
	t.Logf("%s: daemon %d killed, a new one in %s", n.Name, first, time.Since(killed).Round(10*time.Millisecond))
	k.wait(time.Minute, client+" reaches the new daemon", func() (bool, string, error) {
		v, out := viewMPSPod(k, client)
		return v.threads == "25.0", out, nil
	})
}

// testMPSDown takes nri-gpu mps's pods off nodes (their label removed:
// the DaemonSet's pods go, and the daemons with them): on each node, a
// container created on the GPU meanwhile (a restart of a client whose
// process ended) is refused with the daemon's reason; with the labels
// back, the daemons are started again and the containers are served. The
// other clients (clients[n]) keep running throughout.
func testMPSDown(k kc, nodes []*harness.Node, clients map[*harness.Node]string) {
	t := k.t
	restart := func(n *harness.Node) string { return "mps-restart-" + n.Name }
	var docs []string
	for _, n := range nodes {
		docs = append(docs, sharePod(restart(n), n.Name, "sleep 15"))
	}
	k.apply(strings.Join(docs, "---\n"))
	for _, n := range nodes {
		if _, err := k.c.WaitPodRunning(k.ctx, sharingNS, restart(n), 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	runningID := func(pod string) string {
		p, err := k.c.GetPod(k.ctx, sharingNS, pod)
		if err != nil || len(p.Status.ContainerStatuses) != 1 {
			t.Fatalf("%s: %v", pod, err)
		}
		s := p.Status.ContainerStatuses[0]
		return fmt.Sprintf("%s restarts=%d", s.ContainerID, s.RestartCount)
	}
	was := map[*harness.Node]string{}
	for _, n := range nodes {
		was[n] = runningID(clients[n])
	}
	down := time.Now()
	for _, n := range nodes {
		k.run("label", "node", n.Name, "nri-gpu.dev/mps-")
	}
	for _, n := range nodes {
		var refused string
		k.wait(3*time.Minute, restart(n)+"'s next container refused: the daemon is not ready", func() (bool, string, error) {
			p, err := k.c.GetPod(k.ctx, sharingNS, restart(n))
			if err != nil {
				return false, err.Error(), nil
			}
			for _, s := range p.Status.ContainerStatuses {
				if w := s.State.Waiting; w != nil && w.Reason == "CreateContainerError" && strings.Contains(w.Message, "MPS control daemon is not ready") {
					refused = w.Message
					return true, "", nil
				}
			}
			return false, harness.PodSummary(p), nil
		})
		t.Logf("%s (%s): %s after the daemon went: %s", n.Name, n.Runtime.Name(), time.Since(down).Round(time.Second), refused)
	}
	for _, n := range nodes {
		k.run("label", "node", n.Name, "nri-gpu.dev/mps=true", "--overwrite")
	}
	up := time.Now()
	for _, n := range nodes {
		k.wait(3*time.Minute, restart(n)+" served again", func() (bool, string, error) {
			p, err := k.c.GetPod(k.ctx, sharingNS, restart(n))
			if err != nil {
				return false, err.Error(), nil
			}
			for _, s := range p.Status.ContainerStatuses {
				// Seen refused (Waiting) before: a container that runs or
				// ran since was created after the daemon came back.
				if s.State.Running != nil || s.State.Terminated != nil {
					return true, "", nil
				}
			}
			return false, harness.PodSummary(p), nil
		})
		t.Logf("%s: %s served %s after nri-gpu mps came back", n.Name, restart(n), time.Since(up).Round(time.Second))
	}
	for _, n := range nodes {
		if now := runningID(clients[n]); now != was[n] {
			t.Errorf("%s's container changed while the daemon was away: %s, was %s", clients[n], now, was[n])
		}
		checkMPSClient(k, clients[n], n.Name)
	}
}
