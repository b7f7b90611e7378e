package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
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

// gpuPod is a static pod manifest: host network, one busybox container
// sleeping, with limits nvidia.com/gpu: gpus.
func gpuPod(name string, gpus int) []byte {
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
		t.Skipf("opt-in while the kubelet phase is proven: %s=1 runs it (builds kubelet %s on first use, about 4 min)", kubeletOptIn, harness.KubeletVersion)
	}
	c := harness.StartForTest(t, harness.ContainerdOptions{})
	n := newNode(t, simnode.LayoutRHEL, "devicePlugin:\n  enabled: true\n")
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

	// A pod with two GPUs runs.
	if err := k.AddStaticPod("gpu2", gpuPod("gpu2", 2)); err != nil {
		t.Fatal(err)
	}
	var pod *harness.KubeletPod
	waitFor(t, 60*time.Second, "pod gpu2 running", func() (bool, string) {
		p, err := k.Pod(w.ctx, "gpu2")
		if err != nil {
			return false, err.Error()
		}
		pod = p
		b, _ := json.Marshal(p.Status)
		return p.Status.Phase == "Running" && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready, string(b)
	})
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	main := &ctr{w: w, id: id, name: "main"}

	// The kubelet's assignment, from its checkpoint.
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
	if len(assigned) != 2 {
		t.Fatalf("kubelet checkpoint: pod gpu2 (uid %s) has GPUs %v, want 2; entries %+v", pod.Metadata.UID, assigned, cp.Entries)
	}
	var want []string
	byUUID := map[string]int{}
	for _, g := range n.GPUs {
		byUUID[g.UUID] = g.Minor
	}
	for _, u := range assigned {
		m, ok := byUUID[u]
		if !ok {
			t.Fatalf("kubelet assigned %q, not a GPU of the node %v", u, uuids)
		}
		want = append(want, fmt.Sprintf("/dev/nvidia%d", m))
	}
	sort.Strings(want)

	t.Run("two GPUs in the container", func(t *testing.T) {
		if got := gpuNodes(main); !slices.Equal(got, want) {
			t.Errorf("GPU nodes %q, want exactly %q (the kubelet's %v)\n%s", got, want, assigned, main.view())
		}
		got := strings.Split(envOf(main, "NVIDIA_VISIBLE_DEVICES"), ",")
		sort.Strings(got)
		if !slices.Equal(got, assigned) {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want the kubelet's %v", got, assigned)
		}
		ci, err := w.cri.Inspect(w.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var specGPUs []string
		if ci.Spec.Linux != nil {
			for _, d := range ci.Spec.Linux.Devices {
				if d.Major == 195 && d.Minor < 255 {
					specGPUs = append(specGPUs, fmt.Sprintf("%s (%d:%d)", d.Path, d.Major, d.Minor))
				}
			}
		}
		if len(specGPUs) != 2 {
			t.Errorf("OCI spec GPU devices %v, want 2 (the kubelet's %v)", specGPUs, assigned)
		}
		t.Logf("container annotations: %v", ci.Status.Annotations)
		t.Logf("OCI spec GPU devices: %v", specGPUs)
	})

	// Two GPUs are left; a pod asking for three is refused at admission
	// and never reaches the runtime.
	t.Run("more GPUs than free: UnexpectedAdmissionError", func(t *testing.T) {
		if err := k.AddStaticPod("gpu3", gpuPod("gpu3", 3)); err != nil {
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
		// The first pod keeps its GPUs.
		cp, err := harness.ReadDeviceCheckpoint()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range cp.Entries {
			if e.PodUID != pod.Metadata.UID {
				t.Errorf("checkpoint entry for another pod: %+v", e)
			}
		}
	})
}
