package suite

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// The DRA phase's names: nri-gpu's driver and DeviceClass, the test
// overlay, and the namespace of its pods.
const (
	draDriver = "gpu.nri-gpu.dev"
	draNS     = "dra"
)

// draOverlay is test/e2e/cluster/dra: deploy/kubernetes-dra with the
// test's host paths, DRA on GPUs 0 to 2 of each node and nri-gpu's device
// plugin on GPU 3.
func draOverlay() string { return filepath.Join(repoRoot(), "test", "e2e", "cluster", "dra") }

// draGPUs are the GPUs of n that the test overlay publishes through DRA:
// the usable ones of index 0 to 2.
func draGPUs(n *harness.Node) []simnode.GPU {
	var out []simnode.GPU
	for _, g := range n.GPU.GPUs {
		if !g.Excluded && g.Index <= 2 {
			out = append(out, g)
		}
	}
	return out
}

// testDRA installs nri-gpu as the nodes' DRA driver (kubectl apply -k of
// the test overlay of deploy/kubernetes-dra) with the device plugin on
// other GPUs, and checks on the real scheduler, kubelets and runtimes
// (gpu-a on containerd 2.4, gpu-b on CRI-O): the ResourceSlices are the
// simulated nodes' GPUs; claims selecting by memory and by product name
// get GPUs of the right node, and the container sees exactly them with
// the driver files, whatever the image's NVIDIA_VISIBLE_DEVICES=all; a
// 2-GPU claim; an unsatisfiable claim leaves its pod Pending; a claim
// shared by two pods is booked once; the device plugin's GPU goes to a
// nvidia.com/gpu pod beside the claims on gpu-a; the claims' environment
// entries in a pod spec grant nothing; restarts of nri-gpu, then of each
// node's runtime and kubelet, keep the claims' containers and bookings; a
// claim that went frees its GPU for a new pod.
func testDRA(k kc, version string) {
	t := k.t
	start := time.Now()
	k.run("apply", "-k", draOverlay())
	k.t.Cleanup(func() {
		if t.Failed() {
			pods, _ := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu")
			for _, p := range pods {
				out, _ := k.c.Kubectl(k.ctx, "logs", "-n", "nri-gpu", "--tail=80", p.Name)
				t.Logf("--- node %s: nri-gpu's log (%s) ---\n%s", p.Spec.NodeName, p.Name, out)
			}
			out, _ := k.c.Kubectl(k.ctx, "get", "pods,resourceclaims", "-n", draNS, "-o", "wide")
			t.Logf("--- namespace %s ---\n%s", draNS, out)
		}
		_, _ = k.c.Kubectl(k.ctx, "delete", "namespace", draNS, "--ignore-not-found", "--wait=true", "--timeout=2m")
		_, _ = k.c.Kubectl(k.ctx, "delete", "-k", draOverlay(), "--ignore-not-found", "--wait=true", "--timeout=2m")
		t.Logf("DRA phase: %s", time.Since(start).Round(time.Second))
	})
	if err := k.c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", int32(len(k.c.Nodes)), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	k.run("create", "namespace", draNS)
	checkSlices(k)

	// gpu-a: 3 DRA GPUs of 81559 MiB (H100); gpu-b: 2 of 40960 MiB (A100).
	big := `device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('64Gi')) >= 0`
	a100 := `device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A100')`
	k.apply(claimPod("big", 1, big) + "---\n" + claimPod("a100", 1, a100) + "---\n" + claimPod("two", 2, ""))
	views := map[string]claimView{}
	for _, c := range []struct {
		pod, node string
		gpus      int
	}{{"big", "gpu-a", 1}, {"a100", "gpu-b", 1}, {"two", "gpu-a", 2}} {
		v := viewClaimPod(k, c.pod)
		if v.pod.Spec.NodeName != c.node {
			t.Errorf("pod %s on %s, want %s (its claim's selector)", c.pod, v.pod.Spec.NodeName, c.node)
		}
		checkSeesExactly(k, v.gpuPodView, c.gpus)
		views[c.pod] = v
	}

	// No node has 4 DRA GPUs: Pending by the scheduler.
	k.apply(claimPod("four", 4, ""))
	checkUnschedulable(k, "four", "claim")
	k.run("delete", "pod", "-n", draNS, "four", "--wait=false")

	// A claim shared by two pods: gpu-b's last GPU, booked once.
	k.apply(sharedClaim("shared") + "---\n" + sharedPod("share-1", "shared") + "---\n" + sharedPod("share-2", "shared"))
	s1, s2 := viewClaimPod(k, "share-1"), viewClaimPod(k, "share-2")
	checkSeesExactly(k, s1.gpuPodView, 1)
	checkSeesExactly(k, s2.gpuPodView, 1)
	if !slices.Equal(s1.assigned, s2.assigned) || s1.pod.Spec.NodeName != s2.pod.Spec.NodeName {
		t.Errorf("the shared claim: %s on %s sees %v, %s on %s sees %v", s1.pod.Name, s1.pod.Spec.NodeName, s1.assigned, s2.pod.Name, s2.pod.Spec.NodeName, s2.assigned)
	}
	views["share-1"], views["share-2"] = s1, s2

	// The device plugin's GPU 3 on gpu-a, beside the claims.
	k.apply(gpuDeployment("plugin", draNS, 1, 1))
	dp := viewGPUPod(k, runningPods(k, draNS, "app=plugin", 1)[0])
	checkSeesExactly(k, dp, 1)
	if a := k.c.Node("gpu-a"); dp.pod.Spec.NodeName != "gpu-a" || len(dp.assigned) != 1 || dp.assigned[0] != a.GPU.GPUs[3].UUID {
		t.Errorf("the device plugin's pod: on %s, assigned %v, want gpu-a's GPU 3", dp.pod.Spec.NodeName, dp.assigned)
	}
	table := checkClaimTable(k, views, dp)
	t.Run("adminAccess", func(t *testing.T) { testAdminAccess(kc{t: t, c: k.c, ctx: k.ctx}, table) })

	checkForgedClaimEnv(k, views["two"])
	checkDeviceMetadataAll(k, views, dp)

	// A restart of nri-gpu with the claims prepared: their containers
	// stay, the bookings are the same (the driver's checkpoint, the
	// runtime's containers).
	before := containerIDs(k, []gpuPodView{views["big"].gpuPodView, views["a100"].gpuPodView, views["two"].gpuPodView, s1.gpuPodView, dp})
	k.doc("restart", nil)
	k.doc("status", nil)
	if err := k.c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", int32(len(k.c.Nodes)), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if after := containerIDs(k, []gpuPodView{views["big"].gpuPodView, views["a100"].gpuPodView, views["two"].gpuPodView, s1.gpuPodView, dp}); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("containers changed over nri-gpu's restart:\nbefore %v\nafter  %v", before, after)
	}
	sameTable(k, "the same bookings after nri-gpu's restart", table)
	// Then each node's runtime (NRI's Synchronize again) and kubelet.
	for _, n := range k.c.Nodes {
		if err := n.Runtime.Restart(k.ctx); err != nil {
			t.Fatalf("node %s: restarting %s: %v", n.Name, n.Runtime.Name(), err)
		}
		if err := n.Kubelet.Restart(k.ctx); err != nil {
			t.Fatalf("node %s: restarting the kubelet: %v", n.Name, err)
		}
		if err := k.c.WaitNodeReady(k.ctx, n.Name, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// containerd keeps gpu-a's containers; CRI-O's restart here makes
	// gpu-b's pods anew (their sandboxes: new IPs, a restart each), and
	// the new containers must get their claims' GPUs again.
	onA := []gpuPodView{views["big"].gpuPodView, views["two"].gpuPodView, dp}
	if after := containerIDs(k, onA); !sameIDs(before, after) {
		t.Errorf("gpu-a's containers changed over containerd's and the kubelet's restarts:\nbefore %v\nafter  %v", before, after)
	}
	sameTable(k, "the same bookings after the runtimes' and kubelets' restarts", table)
	for _, c := range []struct {
		pod  string
		gpus int
	}{{"big", 1}, {"two", 2}, {"a100", 1}, {"share-1", 1}, {"share-2", 1}} {
		waitExec(k, c.pod)
		v := viewClaimPod(k, c.pod)
		checkSeesExactly(k, v.gpuPodView, c.gpus)
		checkDeviceMetadata(k, v)
		if !slices.Equal(v.assigned, views[c.pod].assigned) {
			t.Errorf("pod %s after the restarts: %v, was %v", c.pod, v.assigned, views[c.pod].assigned)
		}
	}

	// The claim of big goes with its pod: its GPU takes a new claim.
	k.run("delete", "pod", "-n", draNS, "big", "--wait=true", "--timeout=2m")
	k.apply(claimPod("after", 1, big))
	v := viewClaimPod(k, "after")
	checkSeesExactly(k, v.gpuPodView, 1)
	if !slices.Equal(v.assigned, views["big"].assigned) {
		t.Errorf("after: %v, want the GPU the deleted claim had, %v", v.assigned, views["big"].assigned)
	}

	k.run("delete", "pod", "-n", draNS, "two", "--wait=true", "--timeout=2m")
	t.Run("extended resource", func(t *testing.T) { testExtendedResource(kc{t: t, c: k.c, ctx: k.ctx}, version) })
	t.Run("sharing", func(t *testing.T) { testDRASharing(kc{t: t, c: k.c, ctx: k.ctx}) })
	t.Run("memory shares", func(t *testing.T) { testDRAMemoryShares(kc{t: t, c: k.c, ctx: k.ctx}, version) })
	testDRAMore(k, version)
}

// testExtendedResource: a DeviceClass of nri-gpu's GPUs with an
// extendedResourceName serves a pod's resources.limits of that name
// through DRA (the scheduler's claim for the pod, KEP-5004), with the
// container seeing exactly the one GPU. The name is not nvidia.com/gpu
// here, which nri-gpu's device plugin serves on gpu-a in this install (a
// node whose device plugin serves the name is served by it, not DRA).
func testExtendedResource(k kc, version string) {
	t := k.t
	if minorVersion(version) < 36 {
		t.Skipf("Kubernetes %s: DRAExtendedResource is alpha before 1.36 (off by default; the cluster enables no alpha feature)", version)
	}
	const res = "gpu.nri-gpu.dev/gpu"
	k.apply(fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu-ext.nri-gpu.dev}
spec:
  extendedResourceName: %s
  selectors:
  - cel: {expression: "device.driver == '%s' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}
---
`, res, draDriver) + limitsPod("ext", draNS, harness.GlibcCUDAImage, res, 1))
	defer k.run("delete", "deviceclass", "gpu-ext.nri-gpu.dev", "--wait=false")
	var dc resourceapi.DeviceClass
	if err := k.c.GetJSON(k.ctx, &dc, "deviceclass", "gpu-ext.nri-gpu.dev"); err != nil {
		t.Fatal(err)
	}
	if dc.Spec.ExtendedResourceName == nil {
		t.Fatalf("Kubernetes %s dropped the DeviceClass's extendedResourceName (DRAExtendedResource off)", version)
	}
	v := viewClaimPod(k, "ext")
	if len(v.claims) != 1 || v.pod.Spec.NodeName != "gpu-a" {
		t.Errorf("pod ext: on %s with claims %v, want gpu-a (its only free DRA GPUs) and the scheduler's claim", v.pod.Spec.NodeName, v.names)
	}
	checkSeesExactly(k, v.gpuPodView, 1)
}

// testAdminAccess: an adminAccess claim (in a namespace labelled
// resource.kubernetes.io/admin-access) on an A100 of gpu-b, whose GPUs
// other claims hold, runs there and sees the GPU with its driver files,
// and nri-gpu's tables do not change: it holds nothing.
func testAdminAccess(k kc, table map[string]map[string][]string) {
	t := k.t
	const ns = "dra-admin"
	k.apply(fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
  labels: {resource.kubernetes.io/admin-access: "true"}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: probe, namespace: %[1]s}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: %[2]s
          adminAccess: true
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A100')"}
---
apiVersion: v1
kind: Pod
metadata: {name: probe, namespace: %[1]s}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: probe
  containers:
  - name: main
    image: %[3]s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: gpu}]}
`, ns, draDriver, harness.GlibcCUDAImage))
	defer k.run("delete", "namespace", ns, "--wait=false")
	var tmpl resourceapi.ResourceClaimTemplate
	if err := k.c.GetJSON(k.ctx, &tmpl, "resourceclaimtemplate", "-n", ns, "probe"); err != nil {
		t.Fatal(err)
	}
	if r := tmpl.Spec.Spec.Devices.Requests[0].Exactly; r == nil || r.AdminAccess == nil || !*r.AdminAccess {
		t.Skip("the API server dropped adminAccess (DRAAdminAccess off)")
	}
	v := viewClaimPodIn(k, ns, "probe")
	if v.pod.Spec.NodeName != "gpu-b" {
		t.Errorf("probe on %s, want gpu-b", v.pod.Spec.NodeName)
	}
	checkSeesExactly(k, v.gpuPodView, 1)
	if now := claimTable(k); fmt.Sprint(now) != fmt.Sprint(table) {
		t.Errorf("the adminAccess claim changed nri-gpu's tables:\nnow    %v\nbefore %v", now, table)
	}
	k.run("delete", "pod", "-n", ns, "probe", "--wait=true", "--timeout=2m")
}

// minorVersion is the minor of a Kubernetes version ("v1.37.2" -> 37).
func minorVersion(v string) int {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return 0
	}
	minor, _ := strconv.Atoi(parts[1])
	return minor
}

// sameIDs reports whether every container of after has the ID and
// restart count it had in before.
func sameIDs(before, after map[string]string) bool {
	for k, v := range after {
		if before[k] != v {
			return false
		}
	}
	return len(after) > 0
}

// waitExec waits until the container main of the claim pod name runs
// commands (after a restart of its node's runtime).
func waitExec(k kc, name string) {
	k.t.Helper()
	k.wait(2*time.Minute, "pod "+name+": exec", func() (bool, string, error) {
		out, err := k.c.Exec(k.ctx, draNS, name, "main", "true")
		return err == nil, fmt.Sprint(err, out), nil
	})
}

// claimView is a claim pod's view (gpuPodView, assigned being the GPUs
// of its claims' allocation) and its claims' UIDs.
type claimView struct {
	gpuPodView
	claims, names []string
}

// podClaims are the names of p's ResourceClaims: those it names, and
// those made for it from templates (its status).
func podClaims(p *corev1.Pod) []string {
	var out []string
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			out = append(out, *rc.ResourceClaimName)
		}
	}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			out = append(out, *st.ResourceClaimName)
		}
	}
	if x := p.Status.ExtendedResourceClaimStatus; x != nil {
		out = append(out, x.ResourceClaimName)
	}
	return out
}

// claimPod is a ResourceClaimTemplate asking for count GPUs of
// gpu.nri-gpu.dev (with the CEL selector, if any) and a pod of it, whose
// container main, from the image with NVIDIA_VISIBLE_DEVICES=all, sleeps.
func claimPod(name string, count int, selector string) string {
	sel := ""
	if selector != "" {
		sel = fmt.Sprintf("\n          selectors:\n          - cel:\n              expression: %q", selector)
	}
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: %[3]s
          allocationMode: ExactCount
          count: %[4]d%[5]s
---
apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: %[1]s
  containers:
  - name: main
    image: %[6]s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: gpu}]}
`, name, draNS, draDriver, count, sel, harness.GlibcCUDAImage)
}

// sharedClaim is a ResourceClaim of one GPU that pods name.
func sharedClaim(name string) string {
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: %s, namespace: %s}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: %s}
`, name, draNS, draDriver)
}

// sharedPod is a pod of the ResourceClaim claim.
func sharedPod(name, claim string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: gpu
    resourceClaimName: %s
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: gpu}]}
`, name, draNS, claim, harness.GlibcCUDAImage)
}

// viewClaimPod waits for the claim pod name to run and returns what its
// container sees, its claims' devices (their UUIDs, by the device names
// of the allocation on its node, gpu-<minor>), and checks that each
// claim's CDI spec on the node has only device nodes and the claim's
// environment entries: no hook, no mount.
func viewClaimPod(k kc, name string) claimView {
	k.t.Helper()
	return viewClaimPodIn(k, draNS, name)
}

// viewClaimPodIn is viewClaimPod of a pod in namespace ns.
func viewClaimPodIn(k kc, ns, name string) claimView {
	k.t.Helper()
	p, err := k.c.WaitPodRunning(k.ctx, ns, name, 2*time.Minute)
	if err != nil {
		k.t.Fatal(err)
	}
	v := claimView{gpuPodView: viewGPUPod(k, *p)}
	v.assigned = nil
	n := k.c.Node(p.Spec.NodeName)
	for _, name := range podClaims(p) {
		var c resourceapi.ResourceClaim
		if err := k.c.GetJSON(k.ctx, &c, "resourceclaim", "-n", ns, name); err != nil {
			k.t.Fatal(err)
		}
		v.names = append(v.names, c.Name)
		if c.Status.Allocation == nil {
			k.t.Fatalf("pod %s runs with claim %s not allocated", name, c.Name)
		}
		v.claims = append(v.claims, string(c.UID))
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != draDriver || r.Pool != n.Name {
				k.t.Errorf("claim %s: device %s/%s/%s, want driver %s, pool %s", c.Name, r.Driver, r.Pool, r.Device, draDriver, n.Name)
				continue
			}
			for _, g := range n.GPU.GPUs {
				if r.Device == fmt.Sprintf("gpu-%d", g.Minor) {
					v.assigned = append(v.assigned, g.UUID)
				}
			}
		}
		checkClaimSpec(k, n, string(c.UID))
	}
	sort.Strings(v.assigned)
	return v
}

// checkClaimSpec checks the CDI spec nri-gpu wrote on n for the claim
// uid: device nodes and NRI_GPU_DRA_ entries only.
func checkClaimSpec(k kc, n *harness.Node, uid string) {
	k.t.Helper()
	p := n.HostPath(filepath.Join(harness.NodeCDIDir, "k8s."+draDriver+"-claim_"+uid+".json"))
	data, err := os.ReadFile(p)
	if err != nil {
		k.t.Errorf("node %s: the claim's CDI spec: %v", n.Name, err)
		return
	}
	var spec struct {
		ContainerEdits map[string]json.RawMessage `json:"containerEdits"`
		Devices        []struct {
			ContainerEdits map[string]json.RawMessage `json:"containerEdits"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		k.t.Fatal(err)
	}
	for _, d := range spec.Devices {
		for key := range d.ContainerEdits {
			if key != "deviceNodes" && key != "env" {
				k.t.Errorf("node %s: claim %s's CDI spec has %s: %s", n.Name, uid, key, data)
			}
		}
	}
	if len(spec.ContainerEdits) != 0 || len(spec.Devices) == 0 || !strings.Contains(string(data), "NRI_GPU_DRA_") {
		k.t.Errorf("node %s: claim %s's CDI spec: %s", n.Name, uid, data)
	}
}

// checkSlices waits until each node's ResourceSlices of nri-gpu's driver
// are its DRA GPUs: gpu-<minor>, with the UUID, product name, type, PCI
// bus id and memory the simulated node has.
func checkSlices(k kc) {
	k.t.Helper()
	k.wait(time.Minute, "the ResourceSlices are the nodes' GPUs", func() (bool, string, error) {
		var list resourceapi.ResourceSliceList
		if err := k.c.GetJSON(k.ctx, &list, "resourceslices"); err != nil {
			return false, err.Error(), nil
		}
		var problems []string
		for _, n := range k.c.Nodes {
			got := map[string]resourceapi.Device{}
			for _, s := range list.Items {
				if s.Spec.Driver == draDriver && s.Spec.NodeName != nil && *s.Spec.NodeName == n.Name {
					for _, d := range s.Spec.Devices {
						got[d.Name] = d
					}
				}
			}
			want := draGPUs(n)
			if len(got) != len(want) {
				problems = append(problems, fmt.Sprintf("node %s: %d devices, want %d", n.Name, len(got), len(want)))
				continue
			}
			for _, g := range want {
				if p := sliceDeviceProblem(n, g, got[fmt.Sprintf("gpu-%d", g.Minor)]); p != "" {
					problems = append(problems, p)
				}
			}
		}
		return len(problems) == 0, strings.Join(problems, "; "), nil
	})
}

// sliceDeviceProblem says how the published device d differs from n's
// GPU g ("" when it does not).
func sliceDeviceProblem(n *harness.Node, g simnode.GPU, d resourceapi.Device) string {
	str := func(name string) string {
		if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.StringValue != nil {
			return *a.StringValue
		}
		return ""
	}
	memMiB := int64(81559)
	if n.Name == "gpu-b" {
		memMiB = harness.GPUBMemoryMiB
	}
	mem, ok := d.Capacity["gpu.nvidia.com/memory"]
	switch {
	case d.Name == "":
		return fmt.Sprintf("node %s: no device gpu-%d", n.Name, g.Minor)
	case str("gpu.nvidia.com/uuid") != g.UUID || str("gpu.nvidia.com/productName") != g.Model || str("gpu.nvidia.com/type") != "gpu" ||
		!strings.EqualFold(str("resource.kubernetes.io/pciBusID"), g.BusID):
		return fmt.Sprintf("node %s: device %s: attributes %v, want uuid %s, productName %s, type gpu, pciBusID %s", n.Name, d.Name, d.Attributes, g.UUID, g.Model, g.BusID)
	case !ok || mem.Value.Value() != memMiB<<20:
		return fmt.Sprintf("node %s: device %s: memory %v, want %d MiB", n.Name, d.Name, d.Capacity, memMiB)
	}
	return ""
}

// checkUnschedulable waits for the scheduler's FailedScheduling of pod
// name (its message containing why) and checks it stays Pending on no
// node.
func checkUnschedulable(k kc, name, why string) {
	k.t.Helper()
	k.wait(time.Minute, name+": FailedScheduling", func() (bool, string, error) {
		evs, err := k.c.Events(k.ctx, draNS, "involvedObject.name="+name)
		if err != nil {
			return false, err.Error(), nil
		}
		var msgs []string
		for _, e := range evs {
			msgs = append(msgs, e.Reason+": "+e.Message)
			if e.Reason == "FailedScheduling" && strings.Contains(e.Message, why) {
				return true, "", nil
			}
		}
		return false, strings.Join(msgs, "; "), nil
	})
	p, err := k.c.GetPod(k.ctx, draNS, name)
	if err != nil {
		k.t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		k.t.Errorf("%s: %s, want Pending on no node", name, harness.PodSummary(p))
	}
}

// claimTable is, per node, nri-gpu's table (nri-gpu status -o json in its
// pod): GPU UUID -> its holders ("claim dra/<name>", "dra/<pod>/<ctr>").
func claimTable(k kc) map[string]map[string][]string {
	k.t.Helper()
	out, err := claimTableNow(k)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

// sameTable waits until nri-gpu's tables are want (after a restart: its
// pods, the runtimes, the kubelets come back).
func sameTable(k kc, what string, want map[string]map[string][]string) {
	k.t.Helper()
	k.wait(2*time.Minute, what, func() (bool, string, error) {
		now, err := claimTableNow(k)
		if err != nil {
			return false, err.Error(), nil
		}
		return fmt.Sprint(now) == fmt.Sprint(want), fmt.Sprintf("now %v, want %v", now, want), nil
	})
}

// claimTableNow is claimTable, or why it cannot be read now (a pod of
// nri-gpu not running, or going).
func claimTableNow(k kc) (map[string]map[string][]string, error) {
	out := map[string]map[string][]string{}
	pods, err := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu")
	if err != nil {
		return nil, err
	}
	for _, n := range k.c.Nodes {
		pod := ""
		for _, p := range pods {
			if p.Spec.NodeName == n.Name && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				pod = p.Name
			}
		}
		if pod == "" {
			return nil, fmt.Errorf("node %s: no running nri-gpu pod", n.Name)
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
			return nil, fmt.Errorf("node %s: nri-gpu status: %v\n%s", n.Name, err, raw)
		}
		out[n.Name] = map[string][]string{}
		for _, g := range st.GPUs {
			for _, h := range g.Holders {
				out[n.Name][g.UUID] = append(out[n.Name][g.UUID], h.String())
			}
		}
	}
	return out, nil
}

// checkClaimTable checks nri-gpu's tables: each claim pod's GPUs held by
// its claim alone (the shared claim's once, by the claim, not by its
// pods), the device plugin's GPU by its container; and returns them.
func checkClaimTable(k kc, views map[string]claimView, dp gpuPodView) map[string]map[string][]string {
	k.t.Helper()
	table := claimTable(k)
	want := map[string]map[string][]string{}
	for _, n := range k.c.Nodes {
		want[n.Name] = map[string][]string{}
	}
	for _, v := range views {
		for _, u := range v.assigned {
			want[v.pod.Spec.NodeName][u] = []string{"claim " + draNS + "/" + v.names[0]}
		}
	}
	want[dp.pod.Spec.NodeName][dp.assigned[0]] = []string{draNS + "/" + dp.pod.Name + "/main"}
	if fmt.Sprint(table) != fmt.Sprint(want) {
		k.t.Errorf("nri-gpu's tables %v\nwant %v", table, want)
	} else {
		k.t.Logf("nri-gpu's tables: %v", table)
	}
	return table
}

// checkForgedClaimEnv runs, on the node of the claim pod v, a pod without
// a claim whose spec sets the environment entries of v's claim's CDI
// spec (NRI_GPU_DRA_GPU_<minor>=<claim UID>): it gets no GPU, no driver
// file, and NVIDIA_VISIBLE_DEVICES=void (the closed policy), and nri-gpu's
// table is unchanged.
func checkForgedClaimEnv(k kc, v claimView) {
	k.t.Helper()
	n := k.c.Node(v.pod.Spec.NodeName)
	var env []string
	for _, u := range v.assigned {
		for _, g := range n.GPU.GPUs {
			if g.UUID == u {
				env = append(env, fmt.Sprintf("    - {name: NRI_GPU_DRA_GPU_%d, value: %q}", g.Minor, v.claims[0]))
			}
		}
	}
	before := claimTable(k)
	k.apply(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: forged, namespace: %s}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    env:
%s
`, draNS, n.Name, harness.GlibcCUDAImage, strings.Join(env, "\n")))
	if _, err := k.c.WaitPodRunning(k.ctx, draNS, "forged", 2*time.Minute); err != nil {
		k.t.Fatal(err)
	}
	out, _ := k.c.Exec(k.ctx, draNS, "forged", "main", "sh", "-c", `echo "NVD=$NVIDIA_VISIBLE_DEVICES"; env | grep NRI_GPU_DRA_; ls /dev; gpucheck cuda`)
	if !strings.Contains(out, "NVD=void\n") || strings.Contains(out, "\nnvidia") || !strings.Contains(out, "libcuda.so.1: FAIL") || !strings.Contains(out, "NRI_GPU_DRA_") {
		k.t.Errorf("a pod spec with a claim's NRI_GPU_DRA_ entries got something:\n%s", out)
	}
	if after := claimTable(k); fmt.Sprint(after) != fmt.Sprint(before) {
		k.t.Errorf("the forged entries changed nri-gpu's table:\nbefore %v\nafter  %v", before, after)
	}
	k.run("delete", "pod", "-n", draNS, "forged", "--wait=false")
}
