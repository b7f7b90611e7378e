package suite

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// The DRA phase's memory shares (docs/dra.md, "Memory shares"): the test
// overlay publishes each node's GPU 2 shareable by memory
// (dra.memoryShares; here gpu-a's third H100), and claims that request part of a GPU's memory
// (capacity.requests['gpu.nvidia.com/memory'], with GpuConfig MPS) share
// one GPU, each container an MPS client held to its claim's share.

// The shares' size and what a client of one gets on gpu-a's H100 of
// 81559 MiB: 20480 MiB, 26 % of the threads (20480/81559, rounded up).
const (
	shareMemory  = "20Gi"
	shareLimit   = "0=20480M"
	shareThreads = "26"
	// shareTooBig does not fit beside two shares of 20Gi (39 GiB left).
	shareTooBig = "50Gi"
)

// shareClaim is a ResourceClaim of memory of the nri-gpu GPU uuid, with
// GpuConfig sharing strategy MPS.
func shareClaim(name, uuid, memory string) string {
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: %[3]s
        selectors:
        - cel: {expression: "device.attributes['gpu.nvidia.com'].uuid == '%[4]s'"}
        capacity:
          requests: {gpu.nvidia.com/memory: %[5]s}
    config:
    - requests: [gpu]
      opaque:
        driver: %[3]s
        parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig, sharing: {strategy: MPS}}
`, name, draNS, draDriver, uuid, memory)
}

// testDRAMemoryShares: on a control plane of 1.36 or later (consumable
// capacity beta and on), gpu-a's GPU 2 is published with
// allowMultipleAllocations and a memory request policy defaulting to the
// whole GPU, its other GPUs whole; two claims of 20Gi of GPU 2 both run, on that GPU,
// booked shared by both claims, each container an MPS client of the
// GPU's daemon with exactly its share's CUDA_MPS_* (a pod spec asking for
// the whole memory gets the same), and a claim of 50Gi of the same GPU
// stays Pending. Before 1.36 (the gate alpha and off) the API server
// drops the fields: the GPUs are published whole, nri-gpu's log says why,
// and the test is skipped.
func testDRAMemoryShares(k kc, version string) {
	t := k.t
	start := time.Now()
	a := k.c.Node("gpu-a")
	if minorVersion(version) < 36 {
		k.wait(time.Minute, "nri-gpu's log: no consumable capacity", func() (bool, string, error) {
			logs := nriGPULogs(k, a.Name)
			return strings.Contains(logs, "the API server has no consumable capacity (feature gate DRAConsumableCapacity"), lastLines(logs, 5), nil
		})
		for _, d := range publishedDevices(k, a.Name) {
			if d.AllowMultipleAllocations != nil {
				t.Errorf("Kubernetes %s: device %s published with allowMultipleAllocations", version, d.Name)
			}
		}
		t.Skipf("Kubernetes %s: DRAConsumableCapacity is alpha and off before 1.36; the GPUs of dra.memoryShares are published whole (checked)", version)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := k.c.Kubectl(k.ctx, "get", "pods,resourceclaims", "-n", draNS, "-o", "wide")
			t.Logf("--- namespace %s ---\n%s\n--- nri-gpu on gpu-a ---\n%s", draNS, out, lastLines(nriGPULogs(k, a.Name), 40))
		}
		_, _ = k.c.Kubectl(k.ctx, "delete", "pod,resourceclaim", "-n", draNS, "mem-1", "mem-2", "mem-big", "--ignore-not-found", "--wait=true", "--timeout=1m")
		_, _ = k.c.Kubectl(k.ctx, "delete", "daemonset", "-n", "nri-gpu", "nri-gpu-mps", "--ignore-not-found", "--wait=true", "--timeout=1m")
		_, _ = k.c.Kubectl(k.ctx, "label", "node", a.Name, "nri-gpu.dev/mps-")
		t.Logf("DRA memory shares: %s", time.Since(start).Round(time.Second))
	})

	// GPU 2 published shareable, the default consuming the whole GPU;
	// the others whole.
	g := shareableGPU(k, a)
	for _, d := range publishedDevices(k, a.Name) {
		mem := d.Capacity["gpu.nvidia.com/memory"]
		shareable := d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
		if d.Name != fmt.Sprintf("gpu-%d", g.Minor) {
			if shareable || mem.RequestPolicy != nil {
				t.Errorf("gpu-a: device %s, not in dra.memoryShares.devices, is published shareable", d.Name)
			}
			continue
		}
		if !shareable || mem.RequestPolicy == nil || mem.RequestPolicy.Default == nil || mem.RequestPolicy.Default.Cmp(mem.Value) != 0 || mem.RequestPolicy.ValidRange == nil {
			t.Errorf("gpu-a: device %s: allowMultipleAllocations %v, memory %+v: want shareable, default the whole %s", d.Name, d.AllowMultipleAllocations, mem, mem.Value.String())
		}
	}
	uuid := g.UUID
	// The phase's last whole-GPU pods (the extended resource's, after) may
	// hold it: their claims go with them.
	k.run("delete", "pod", "-n", draNS, "after", "ext", "--ignore-not-found", "--wait=true", "--timeout=2m")
	k.wait(time.Minute, "GPU "+uuid+" free", func() (bool, string, error) {
		held := allocatedDevices(k, a.Name)
		return !held[fmt.Sprintf("gpu-%d", g.Minor)], fmt.Sprint("allocated: ", held), nil
	})
	k.run("label", "node", a.Name, "nri-gpu.dev/mps=true", "--overwrite")
	k.apply(mpsDaemonSet(k))
	raise := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=81559M"}
	k.apply(strings.Join([]string{
		shareClaim("mem-1", uuid, shareMemory), mpsClaimPod("mem-1", a.Name, "mem-1"),
		shareClaim("mem-2", uuid, shareMemory), mpsClaimPod("mem-2", a.Name, "mem-2", raise...),
	}, "---\n"))
	want := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + shareThreads, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + shareLimit, "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}
	for _, p := range []string{"mem-1", "mem-2"} {
		v := viewClaimPod(k, p)
		if !slices.Equal(v.assigned, []string{uuid}) {
			t.Errorf("pod %s: its claim's GPUs %v, want %s", p, v.assigned, uuid)
		}
		var c resourceapi.ResourceClaim
		if err := k.c.GetJSON(k.ctx, &c, "resourceclaim", "-n", draNS, p); err != nil {
			t.Fatal(err)
		}
		r := c.Status.Allocation.Devices.Results
		if len(r) != 1 {
			t.Fatalf("claim %s: %d devices allocated, want 1", p, len(r))
		}
		if consumed := r[0].ConsumedCapacity["gpu.nvidia.com/memory"]; r[0].ShareID == nil || consumed.Value() != 20<<30 {
			t.Errorf("claim %s: allocation %+v, want a share of %s", p, r, shareMemory)
		}
		m, out := viewMPSPodIn(k, draNS, p)
		if !slices.Equal(m.env, want) || !strings.Contains(m.pipeEntries, "control") {
			t.Errorf("pod %s: CUDA_MPS_* %q, want %q; pipe directory %q:\n%s", p, m.env, want, m.pipeEntries, out)
		} else {
			t.Logf("pod %s: %v; the GPU's daemon: %s%% of the threads by default", p, m.env, m.threads)
		}
	}
	modes := tableModes(k, a.Name)[uuid]
	slices.Sort(modes)
	if w := []string{"claim dra/mem-1=shared", "claim dra/mem-2=shared"}; !slices.Equal(modes, w) {
		t.Errorf("gpu-a: nri-gpu's table for %s: %v, want %v", uuid, modes, w)
	}

	// 50Gi does not fit beside them: the scheduler leaves it Pending.
	k.apply(shareClaim("mem-big", uuid, shareTooBig) + "---\n" + mpsClaimPod("mem-big", a.Name, "mem-big"))
	checkUnschedulable(k, "mem-big", "cannot allocate all claims")
}

// publishedDevices are the devices of node's ResourceSlices of nri-gpu's
// driver.
func publishedDevices(k kc, node string) []resourceapi.Device {
	k.t.Helper()
	var l resourceapi.ResourceSliceList
	if err := k.c.GetJSON(k.ctx, &l, "resourceslices"); err != nil {
		k.t.Fatal(err)
	}
	var out []resourceapi.Device
	for _, s := range l.Items {
		if s.Spec.Driver == draDriver && s.Spec.NodeName != nil && *s.Spec.NodeName == node {
			out = append(out, s.Spec.Devices...)
		}
	}
	return out
}

// shareableGPU is n's GPU 2, which the test overlay shares by memory.
func shareableGPU(k kc, n *harness.Node) simnode.GPU {
	k.t.Helper()
	for _, g := range draGPUs(n) {
		if g.Index == 2 {
			return g
		}
	}
	k.t.Fatalf("node %s has no usable GPU 2", n.Name)
	return simnode.GPU{}
}

// allocatedDevices are the devices of node's pool that ResourceClaims
// are allocated now.
func allocatedDevices(k kc, node string) map[string]bool {
	k.t.Helper()
	var l resourceapi.ResourceClaimList
	if err := k.c.GetJSON(k.ctx, &l, "resourceclaims", "-A"); err != nil {
		k.t.Fatal(err)
	}
	used := map[string]bool{}
	for _, c := range l.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == draDriver && r.Pool == node {
				used[r.Device] = true
			}
		}
	}
	return used
}

// tableModes is node's nri-gpu table: GPU UUID -> "<holder>=<mode>".
func tableModes(k kc, node string) map[string][]string {
	k.t.Helper()
	pods, err := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu")
	if err != nil {
		k.t.Fatal(err)
	}
	pod := ""
	for _, p := range pods {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			pod = p.Name
		}
	}
	argv := append(installCommand("table", map[string]string{"pod": pod}, "", "", ""), "-o", "json")
	raw, err := k.c.Kubectl(k.ctx, argv[1:]...)
	var st struct {
		GPUs []struct {
			UUID    string              `json:"uuid"`
			Holders []alloc.HolderState `json:"holders"`
		} `json:"gpus"`
	}
	if err != nil || json.Unmarshal([]byte(raw), &st) != nil {
		k.t.Fatalf("node %s: nri-gpu status: %v\n%s", node, err, raw)
	}
	out := map[string][]string{}
	for _, g := range st.GPUs {
		for _, h := range g.Holders {
			out[g.UUID] = append(out[g.UUID], h.String()+"="+h.Mode)
		}
	}
	return out
}

// nriGPULogs is the log of nri-gpu's pod on node.
func nriGPULogs(k kc, node string) string {
	pods, _ := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu")
	for _, p := range pods {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			out, _ := k.c.Kubectl(k.ctx, "logs", "-n", "nri-gpu", p.Name)
			return out
		}
	}
	return ""
}
