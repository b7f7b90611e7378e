package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// kubeletOptIn is the env var that turns the kubelet phase on.
const kubeletOptIn = "NRI_GPU_E2E_KUBELET"

// startKubelet builds the kubelet on first use (a few minutes) and starts
// it against c; it stops when the test ends, printing its log tail if the
// test failed.
func startKubelet(t *testing.T, c *harness.Containerd) *harness.Kubelet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	bin, err := harness.InstallKubelet(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("InstallKubelet: %s", time.Since(start).Round(time.Millisecond))
	k, err := harness.StartKubelet(ctx, harness.KubeletOptions{Binary: bin, Containerd: c})
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

// hostGPUNodes creates the simulated GPUs' device nodes at their host
// paths (/dev/nvidia<minor>, char 195:<minor>) where missing, and removes
// them when the test ends. nri-gpu's Allocate answers DeviceSpecs whose
// HostPath is the node's path (/dev/nvidia<minor>, as on a real node), and
// containerd stats that path on the host to build the container's device
// list; the simulated node's nodes live under its own root, so without
// these containerd fails the container ("lstat /dev/nvidia1: no such file
// or directory").
func hostGPUNodes(t *testing.T, n *node) {
	t.Helper()
	for _, g := range n.GPUs {
		p := fmt.Sprintf("/dev/nvidia%d", g.Minor)
		if _, err := os.Lstat(p); err == nil {
			t.Logf("%s exists on the host: left as it is", p)
			continue
		}
		if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(195<<8|g.Minor)); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
}

// gpuPod is a static pod manifest: host network, one busybox container
// sleeping, with limits nvidia.com/gpu: gpus and env.
func gpuPod(name string, gpus int, env map[string]string) []byte {
	var envs []any
	for k, v := range env {
		envs = append(envs, map[string]string{"name": k, "value": v})
	}
	pod := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": name, "namespace": "default"},
		"spec": map[string]any{
			"hostNetwork": true,
			"containers": []any{map[string]any{
				"name":            "main",
				"image":           harness.BusyboxImage,
				"imagePullPolicy": "Never",
				"command":         []string{"sleep", "3600"},
				"env":             envs,
				"resources":       map[string]any{"limits": map[string]any{"nvidia.com/gpu": fmt.Sprint(gpus)}},
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
// two GPUs the kubelet assigned, and a pod asking for more GPUs than are
// free is refused by the kubelet's admission.
func TestKubelet(t *testing.T) {
	if os.Getenv(kubeletOptIn) != "1" {
		t.Skipf("runs only with %s=1, which make e2e sets for its containerd 2.4.2 run (it builds kubelet %s on first use, about 4 min)", kubeletOptIn, harness.KubeletVersion)
	}
	skipOnCRIO(t, "the kubelet phase runs on containerd 2.4.2")
	c := harness.StartForTest(t, harness.ContainerdOptions{})
	n := newNode(t, simnode.LayoutRHEL, "devicePlugin:\n  enabled: true\n")
	hostGPUNodes(t, n)
	k := startKubelet(t, c)
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: context.Background()}
	w.plugin = startPlugin(t, c, n)

	// The kubelet has the plugin's four GPUs once it registered and sent
	// its first ListAndWatch answer.
	var uuids []string
	for _, g := range n.GPUs {
		uuids = append(uuids, g.UUID)
	}
	sort.Strings(uuids)
	waitFor(t, 30*time.Second, "kubelet checkpoint lists the four GPUs as nvidia.com/gpu", func() (bool, string) {
		cp, err := harness.ReadDeviceCheckpoint()
		if err != nil {
			return false, err.Error()
		}
		got := slices.Clone(cp.Registered["nvidia.com/gpu"])
		sort.Strings(got)
		return slices.Equal(got, uuids), fmt.Sprintf("registered %v, want %v", cp.Registered, uuids)
	})

	// A pod with two GPUs runs, with exactly the kubelet's two.
	gpu2, assigned2 := runKubeletPod(t, w, k, "gpu2", 2, nil)
	t.Run("two GPUs in the container", func(t *testing.T) {
		checkKubeletGPUs(t, gpu2, assigned2)
	})

	// Two GPUs are left; a pod asking for three is refused at admission
	// and never reaches the runtime.
	t.Run("more GPUs than free: UnexpectedAdmissionError", func(t *testing.T) {
		if err := k.AddStaticPod("gpu3", gpuPod("gpu3", 3, nil)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "pod gpu3 rejected", func() (bool, string) {
			p, err := k.Pod(w.ctx, "gpu3")
			if err != nil {
				return false, err.Error()
			}
			b, _ := json.Marshal(p.Status)
			return p.Status.Phase == "Failed" && p.Status.Reason == "UnexpectedAdmissionError", string(b)
		})
		cs, err := w.cri.Runtime.ListContainers(w.ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
			LabelSelector: map[string]string{"io.kubernetes.pod.name": "gpu3-" + k.Opts.NodeName}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(cs.Containers) != 0 {
			t.Errorf("pod gpu3 has %d containers in containerd, want none", len(cs.Containers))
		}
	})

	// A CUDA image carries NVIDIA_VISIBLE_DEVICES=all in its config; with
	// one GPU from the kubelet it must see that one, never one of gpu2's.
	t.Run("NVIDIA_VISIBLE_DEVICES=all with one kubelet GPU", func(t *testing.T) {
		cuda, assigned := runKubeletPod(t, w, k, "cuda1", 1, map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"})
		for _, u := range assigned {
			if slices.Contains(assigned2, u) {
				t.Errorf("kubelet gave pod cuda1 %s, held by gpu2", u)
			}
		}
		checkKubeletGPUs(t, cuda, assigned)
	})
}

// runKubeletPod starts static pod name with gpus GPUs and env, waits until
// it runs, and returns its container and the GPUs the kubelet's checkpoint
// assigns it (sorted).
func runKubeletPod(t *testing.T, w *world, k *harness.Kubelet, name string, gpus int, env map[string]string) (*ctr, []string) {
	t.Helper()
	if err := k.AddStaticPod(name, gpuPod(name, gpus, env)); err != nil {
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
		if e.PodUID == pod.Metadata.UID && e.ContainerName == "main" && e.ResourceName == "nvidia.com/gpu" {
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
