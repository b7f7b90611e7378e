package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// clusterOptIn is the env var that runs the cluster phase: the Kubernetes
// version(s) to run it on, e.g. "v1.37.2" (make e2e passes
// $(CLUSTER_VERSIONS)).
const clusterOptIn = "NRI_GPU_E2E_CLUSTER"

// imageUpgradeTag is the tag helm upgrade moves nri-gpu to: a second
// archive of make image (VERSION=imageUpgradeTag). The install is the
// shipped tag, the chart's appVersion (make image's own archive).
const imageUpgradeTag = "0.1.1-e2e"

// repoRoot is the checkout's root.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// clusterVersions are the Kubernetes versions of $NRI_GPU_E2E_CLUSTER; the
// test skips without it.
func clusterVersions(t *testing.T) []string {
	v := strings.Fields(os.Getenv(clusterOptIn))
	if len(v) == 0 {
		t.Skipf("runs only with %s=<Kubernetes version> (make e2e sets it: %s; it builds the control plane on first use, about 12 min per version on 2 cores)", clusterOptIn, harness.KubernetesVersion)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a cluster with real runtimes, kubelets and namespaces (CI runs as root)")
	}
	return v
}

// startTestCluster starts the cluster phase's cluster at version with
// nri-gpu's release images (make image's archive at the chart's
// appVersion and at imageUpgradeTag) and the CUDA-like image on every
// node, and stops it when
// the test ends (printing the control plane's and nodes' log tails if the
// test failed).
func startTestCluster(t *testing.T, version string, nodes []harness.NodeOptions, opts ...func(*harness.ClusterOptions)) *harness.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	images, err := harness.ClusterImages(ctx, repoRoot(), "", imageUpgradeTag)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	co := harness.ClusterOptions{Version: version, Nodes: nodes, Images: images}
	for _, o := range opts {
		o(&co)
	}
	c, err := harness.StartCluster(ctx, co)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster %s with %d nodes: ready in %s (%s with the binaries' install check)", version, len(nodes),
		c.StartupDuration.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
				t.Logf("--- tail of %s ---\n%s", name, c.LogTail(name, 3000))
			}
			for _, n := range c.Nodes {
				if n != nil && n.Kubelet != nil {
					t.Logf("--- node %s: tail of the kubelet's log ---\n%s", n.Name, n.Kubelet.LogTail(6000))
				}
				if n != nil && n.Runtime != nil {
					t.Logf("--- node %s: tail of %s's log ---\n%s", n.Name, n.Runtime.Name(), n.Runtime.LogTail(4000))
				}
			}
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	return c
}

// kc is kubectl on the test's cluster that fails the test on error.
type kc struct {
	t   *testing.T
	c   *harness.Cluster
	ctx context.Context
}

func (k kc) run(args ...string) string {
	k.t.Helper()
	out, err := k.c.Kubectl(k.ctx, args...)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

func (k kc) apply(manifest string) {
	k.t.Helper()
	if err := k.c.Apply(k.ctx, manifest); err != nil {
		k.t.Fatal(err)
	}
}

func (k kc) helm(args ...string) string {
	k.t.Helper()
	out, err := k.c.Helm(k.ctx, args...)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

// doc runs installCommands[name] (docs/install.md's command) as the
// cluster phase does (installCommand) and returns its output.
func (k kc) doc(name string, fill map[string]string) string {
	k.t.Helper()
	argv := installCommand(name, fill, harness.KustomizeOverlay(repoRoot()), chartDir(), harness.HelmValues(repoRoot()))
	if argv[0] == "helm" {
		return k.helm(argv[1:]...)
	}
	return k.run(argv[1:]...)
}

func (k kc) wait(timeout time.Duration, what string, cond func() (bool, string, error)) {
	k.t.Helper()
	if err := harness.WaitFor(k.ctx, timeout, what, cond); err != nil {
		k.t.Fatal(err)
	}
}

// TestCluster installs nri-gpu on a real two-node cluster per Kubernetes
// version of NRI_GPU_E2E_CLUSTER, once with kubectl apply -k and once with
// the Helm CLI, and checks what users check (docs/install.md); then as
// the nodes' DRA driver (kubectl apply -k of deploy/kubernetes-dra's test
// overlay, docs/dra.md).
func TestCluster(t *testing.T) {
	for _, v := range clusterVersions(t) {
		t.Run(v, func(t *testing.T) {
			c := startTestCluster(t, v, harness.GPUNodes())
			k := kc{t: t, c: c, ctx: context.Background()}
			for _, n := range c.Nodes {
				k.doc("label", map[string]string{"node": n.Name})
			}
			t.Run("kubectl apply -k", func(t *testing.T) { testKustomize(kc{t: t, c: c, ctx: k.ctx}) })
			t.Run("helm", func(t *testing.T) { testHelm(kc{t: t, c: c, ctx: k.ctx}) })
			t.Run("dra", func(t *testing.T) { testDRA(kc{t: t, c: c, ctx: k.ctx}, v) })
		})
	}
	t.Run("migrate", func(t *testing.T) { testMigrate(t, clusterVersions(t)[0]) })
}

// usableGPUs is how many GPUs of n nri-gpu may hand out (not excluded).
func usableGPUs(n *harness.Node) int {
	count := 0
	for _, g := range n.GPU.GPUs {
		if !g.Excluded {
			count++
		}
	}
	return count
}

// checkInstalled checks what a user checks after an install: the
// DaemonSet's pod Running and Ready on every node from the release image
// of version ("" the chart's appVersion), each node's allocatable
// nvidia.com/gpu its usable GPUs, and nri-gpu doctor passing in each pod.
func checkInstalled(k kc, version string) {
	t := k.t
	t.Helper()
	k.doc("status", nil)
	if err := k.c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", int32(len(k.c.Nodes)), 3*time.Minute); err != nil {
		pods, _ := k.c.ListPods(k.ctx, "nri-gpu", "")
		for i := range pods {
			t.Logf("pod %s: %s", pods[i].Name, harness.PodSummary(&pods[i]))
		}
		t.Fatal(err)
	}
	for _, n := range k.c.Nodes {
		want := fmt.Sprint(usableGPUs(n))
		k.wait(time.Minute, "node "+n.Name+" allocatable nvidia.com/gpu = "+want, func() (bool, string, error) {
			node, err := k.c.GetNode(k.ctx, n.Name)
			if err != nil {
				return false, err.Error(), nil
			}
			got := node.Status.Allocatable["nvidia.com/gpu"]
			return got.String() == want, "allocatable " + got.String(), nil
		})
		pod := daemonPod(k, n.Name)
		checkDaemonImage(k, n.Name, pod, releaseImage(k, version))
		argv := installCommand("doctor", map[string]string{"pod": pod}, "", "", "")
		out, err := k.c.Kubectl(k.ctx, argv[1:]...)
		if err != nil {
			t.Errorf("node %s: %s: %v\n%s", n.Name, strings.Join(argv, " "), err, out)
		} else {
			t.Logf("node %s: nri-gpu doctor:\n%s", n.Name, out)
		}
	}
	t.Logf("%s%s", k.doc("pods", nil), k.doc("gpus", nil))
}

// daemonPod is the name of nri-gpu's pod on node.
func daemonPod(k kc, node string) string {
	k.t.Helper()
	pods, err := k.c.ListPods(k.ctx, "nri-gpu", "app.kubernetes.io/name=nri-gpu")
	if err != nil {
		k.t.Fatal(err)
	}
	for _, p := range pods {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			return p.Name
		}
	}
	k.t.Fatalf("no running nri-gpu pod on node %s", node)
	return ""
}

// limitsPod is a pod named name in ns whose container main sleeps with
// resources.limits of n resource, from image.
func limitsPod(name, ns, image, resource string, n int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {limits: {%s: %d}}
`, name, ns, image, resource, n)
}

// gpuDeployment is a Deployment of replicas pods in ns, each one glibc
// container "main" sleeping, with limits nvidia.com/gpu: gpus.
func gpuDeployment(name, ns string, replicas, gpus int) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  replicas: %[3]d
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: %[4]s
        imagePullPolicy: Never
        command: [sleep, "3600"]
        resources: {limits: {nvidia.com/gpu: %[5]d}}
`, name, ns, replicas, harness.GlibcImage, gpus)
}

// gpuPodView is what a GPU pod's container sees and what its node's kubelet
// assigned it.
type gpuPodView struct {
	pod         corev1.Pod
	assigned    []string // the kubelet's checkpoint: GPU UUIDs, sorted
	visible     []string // NVIDIA_VISIBLE_DEVICES, sorted
	devices     []string // /dev/nvidia<N> (GPU nodes only), sorted
	cudaDevices string   // gpucheck cuda: devices=N
}

var cudaDevicesRE = regexp.MustCompile(`libcuda\.so\.1: ok .*devices=(\d+)`)

// viewGPUPod execs into pod's container main and reads its node's
// checkpoint.
func viewGPUPod(k kc, p corev1.Pod) gpuPodView {
	k.t.Helper()
	v := gpuPodView{pod: p}
	out, err := k.c.Exec(k.ctx, p.Namespace, p.Name, "main", "sh", "-c", `echo "NVD=$NVIDIA_VISIBLE_DEVICES"; ls /dev; gpucheck cuda`)
	if err != nil {
		k.t.Errorf("pod %s: exec: %v\n%s", p.Name, err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, "NVD="); ok && rest != "" {
			v.visible = strings.Split(rest, ",")
		}
		if regexp.MustCompile(`^nvidia\d+$`).MatchString(l) {
			v.devices = append(v.devices, "/dev/"+l)
		}
	}
	if m := cudaDevicesRE.FindStringSubmatch(out); m != nil {
		v.cudaDevices = m[1]
	}
	sort.Strings(v.visible)
	sort.Strings(v.devices)
	n := k.c.Node(p.Spec.NodeName)
	cp, err := harness.ReadDeviceCheckpointAt(n.HostPath(harness.KubeletCheckpoint))
	if err != nil {
		k.t.Fatal(err)
	}
	for _, e := range cp.Entries {
		if e.PodUID == string(p.UID) && e.ResourceName == "nvidia.com/gpu" {
			v.assigned = append(v.assigned, e.DeviceIDs...)
		}
	}
	sort.Strings(v.assigned)
	return v
}

// checkSeesExactly checks that a GPU pod's container sees exactly the
// gpus the kubelet assigned it: their UUIDs in NVIDIA_VISIBLE_DEVICES,
// their /dev/nvidia<minor> and no other, libcuda.so.1 loading and counting
// them.
func checkSeesExactly(k kc, v gpuPodView, gpus int) {
	t := k.t
	t.Helper()
	n := k.c.Node(v.pod.Spec.NodeName)
	var wantDevs []string
	for _, u := range v.assigned {
		for _, g := range n.GPU.GPUs {
			if g.UUID == u {
				wantDevs = append(wantDevs, fmt.Sprintf("/dev/nvidia%d", g.Minor))
			}
		}
	}
	sort.Strings(wantDevs)
	if len(v.assigned) != gpus || !slices.Equal(v.visible, v.assigned) || !slices.Equal(v.devices, wantDevs) || v.cudaDevices != fmt.Sprint(gpus) {
		t.Errorf("pod %s on %s: kubelet assigned %v; container sees NVIDIA_VISIBLE_DEVICES %v, device nodes %v (want %v), libcuda devices=%q (want %d)",
			v.pod.Name, n.Name, v.assigned, v.visible, v.devices, wantDevs, v.cudaDevices, gpus)
	}
}

// runningPods waits until the pods matching selector in ns are want and
// all Running, and returns them.
func runningPods(k kc, ns, selector string, want int) []corev1.Pod {
	k.t.Helper()
	var pods []corev1.Pod
	k.wait(3*time.Minute, fmt.Sprintf("%d pods %s Running", want, selector), func() (bool, string, error) {
		all, err := k.c.ListPods(k.ctx, ns, selector)
		if err != nil {
			return false, err.Error(), nil
		}
		pods = pods[:0]
		var msgs []string
		for i := range all {
			if all[i].DeletionTimestamp != nil {
				continue
			}
			pods = append(pods, all[i])
			msgs = append(msgs, all[i].Name+": "+harness.PodSummary(&all[i]))
			if all[i].Status.Phase != corev1.PodRunning {
				return false, strings.Join(msgs, "; "), nil
			}
		}
		return len(pods) == want, fmt.Sprintf("%d of %d: %s", len(pods), want, strings.Join(msgs, "; ")), nil
	})
	return pods
}

// checkPlacement checks that no node holds more GPUs than it has usable
// and no GPU is given to two containers.
func checkPlacement(k kc, views []gpuPodView) {
	k.t.Helper()
	perNode := map[string]int{}
	owner := map[string]string{}
	for _, v := range views {
		perNode[v.pod.Spec.NodeName] += len(v.assigned)
		for _, u := range v.assigned {
			key := v.pod.Spec.NodeName + "/" + u
			if o, ok := owner[key]; ok {
				k.t.Errorf("GPU %s assigned to %s and %s", key, o, v.pod.Name)
			}
			owner[key] = v.pod.Name
		}
	}
	for _, n := range k.c.Nodes {
		if perNode[n.Name] > usableGPUs(n) {
			k.t.Errorf("node %s: %d GPUs assigned, %d usable", n.Name, perNode[n.Name], usableGPUs(n))
		}
	}
	k.t.Logf("GPUs per node: %v", perNode)
}

// checkTableIsCheckpoints checks on every node that nri-gpu's table
// (nri-gpu status -o json in its pod) holds exactly the kubelet's
// assignments of the node's running pods.
func checkTableIsCheckpoints(k kc) {
	t := k.t
	t.Helper()
	for _, n := range k.c.Nodes {
		pod := daemonPod(k, n.Name)
		argv := append(installCommand("table", map[string]string{"pod": pod}, "", "", ""), "-o", "json")
		out, err := k.c.Kubectl(k.ctx, argv[1:]...)
		var st struct {
			GPUs []statusGPU `json:"gpus"`
		}
		if err != nil || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("node %s: nri-gpu status: %v\n%s", n.Name, err, out)
		}
		table := map[string][]string{}
		for _, g := range st.GPUs {
			for _, h := range g.Holders {
				key := h.Namespace + "/" + h.Pod + "/" + h.Container
				table[key] = append(table[key], g.UUID)
			}
		}
		var pods corev1.PodList
		if err := k.c.GetJSON(k.ctx, &pods, "pods", "-A", "--field-selector", "spec.nodeName="+n.Name+",status.phase=Running"); err != nil {
			t.Fatal(err)
		}
		byUID := map[string]string{}
		for _, p := range pods.Items {
			byUID[string(p.UID)] = p.Namespace + "/" + p.Name
		}
		cp, err := harness.ReadDeviceCheckpointAt(n.HostPath(harness.KubeletCheckpoint))
		if err != nil {
			t.Fatal(err)
		}
		kubelet := map[string][]string{}
		for _, e := range cp.Entries {
			if p, ok := byUID[e.PodUID]; ok && e.ResourceName == "nvidia.com/gpu" {
				kubelet[p+"/"+e.ContainerName] = append(kubelet[p+"/"+e.ContainerName], e.DeviceIDs...)
			}
		}
		for _, m := range []map[string][]string{table, kubelet} {
			for key := range m {
				sort.Strings(m[key])
			}
		}
		if fmt.Sprint(table) != fmt.Sprint(kubelet) {
			t.Errorf("node %s: nri-gpu's table %v\nthe kubelet's checkpoint %v", n.Name, table, kubelet)
		} else {
			t.Logf("node %s: nri-gpu's table = the kubelet's checkpoint: %v", n.Name, table)
		}
	}
}

// testGPUWorkloads runs Deployments of 1- and 2-GPU pods in ns, checks
// where the scheduler put them and what each container sees, and that a
// pod asking for more GPUs than any node has stays Pending with the
// scheduler's reason. It returns the GPU pods' views.
func testGPUWorkloads(k kc, ns string) []gpuPodView {
	t := k.t
	t.Helper()
	k.apply(gpuDeployment("gpu1", ns, 2, 1) + "---\n" + gpuDeployment("gpu2", ns, 1, 2))
	var views []gpuPodView
	for _, d := range []struct {
		app  string
		n, g int
	}{{"gpu1", 2, 1}, {"gpu2", 1, 2}} {
		for _, p := range runningPods(k, ns, "app="+d.app, d.n) {
			v := viewGPUPod(k, p)
			checkSeesExactly(k, v, d.g)
			views = append(views, v)
		}
	}
	checkPlacement(k, views)

	k.apply(limitsPod("too-many", ns, harness.GlibcImage, "nvidia.com/gpu", 5))
	k.wait(time.Minute, "too-many: FailedScheduling with Insufficient nvidia.com/gpu", func() (bool, string, error) {
		evs, err := k.c.Events(k.ctx, ns, "involvedObject.name=too-many")
		if err != nil {
			return false, err.Error(), nil
		}
		var msgs []string
		for _, e := range evs {
			msgs = append(msgs, e.Reason+": "+e.Message)
			if e.Reason == "FailedScheduling" && strings.Contains(e.Message, "Insufficient nvidia.com/gpu") {
				return true, "", nil
			}
		}
		return false, strings.Join(msgs, "; "), nil
	})
	time.Sleep(3 * time.Second)
	p, err := k.c.GetPod(k.ctx, ns, "too-many")
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" || len(p.Status.ContainerStatuses) != 0 {
		t.Errorf("too-many: %s, want Pending on no node with no container", harness.PodSummary(p))
	}
	k.run("delete", "pod", "-n", ns, "too-many", "--wait=false")
	return views
}

// testClosedPolicy checks the shipped closed policy in a tenant
// namespace, for pods without a GPU limit: one from an image whose config
// says NVIDIA_VISIBLE_DEVICES=all runs with no GPU, no driver file and
// NVIDIA_VISIBLE_DEVICES=void; one with a gpus.nri-gpu.dev annotation is
// refused (CreateContainerError naming the annotation and the policy key)
// and never starts.
func testClosedPolicy(k kc) {
	t := k.t
	k.run("create", "namespace", "tenant")
	defer k.run("delete", "namespace", "tenant", "--wait=false")
	pod := func(name, ann string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: tenant
  annotations: {%s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]
`, name, ann, harness.GlibcCUDAImage)
	}
	k.apply(pod("cuda-env", "") + "---\n" + pod("annotated", "gpus.nri-gpu.dev/container.main: all"))
	if _, err := k.c.WaitPodRunning(k.ctx, "tenant", "cuda-env", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	out, _ := k.c.Exec(k.ctx, "tenant", "cuda-env", "main", "sh", "-c", `echo "NVD=$NVIDIA_VISIBLE_DEVICES"; ls /dev; gpucheck cuda`)
	if !strings.Contains(out, "NVD=void\n") || regexp.MustCompile(`(?m)^nvidia`).MatchString(out) || !strings.Contains(out, "libcuda.so.1: FAIL") {
		t.Errorf("tenant pod from an image with NVIDIA_VISIBLE_DEVICES=all got something:\n%s", out)
	}
	k.wait(time.Minute, "annotated: CreateContainerError naming the policy", func() (bool, string, error) {
		p, err := k.c.GetPod(k.ctx, "tenant", "annotated")
		if err != nil {
			return false, err.Error(), nil
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Running != nil || s.State.Terminated != nil {
				return false, "", fmt.Errorf("the annotated pod's container started: %s", harness.PodSummary(p))
			}
			if w := s.State.Waiting; w != nil && w.Reason == "CreateContainerError" &&
				strings.Contains(w.Message, "gpus.nri-gpu.dev/container.main") && strings.Contains(w.Message, "policy.annotationNamespaces") {
				return true, "", nil
			}
		}
		return false, harness.PodSummary(p), nil
	})
}

// testKustomize installs nri-gpu with kubectl apply -k of the test
// overlay, checks the install, GPU workloads and the closed policy, and
// deletes it again.
func testKustomize(k kc) {
	k.doc("apply", nil)
	k.t.Cleanup(func() {
		// Also after a failure: the Helm install that follows needs the
		// namespace free.
		_, _ = k.c.Kubectl(k.ctx, "delete", "namespace", "ml", "--ignore-not-found", "--wait=true", "--timeout=2m")
		_, _ = k.c.Kubectl(k.ctx, "delete", "-k", harness.KustomizeOverlay(repoRoot()), "--ignore-not-found", "--wait=true", "--timeout=2m")
	})
	checkInstalled(k, "")
	k.run("create", "namespace", "ml")
	testGPUWorkloads(k, "ml")
	checkTableIsCheckpoints(k)
	testClosedPolicy(k)
	k.run("delete", "namespace", "ml", "--wait=true", "--timeout=2m")
	k.t.Run("sharing", func(t *testing.T) { testSharing(kc{t: t, c: k.c, ctx: k.ctx}) })
	k.doc("delete", nil)
	k.wait(2*time.Minute, "namespace nri-gpu gone", func() (bool, string, error) {
		_, err := k.c.Kubectl(k.ctx, "get", "namespace", "nri-gpu")
		return err != nil && strings.Contains(err.Error(), "NotFound"), fmt.Sprint(err), nil
	})
	// The links stay for the next install (the Helm one), which takes
	// over their record.
	checkLinksStay(k)
}

// chartDir is the chart in this checkout.
func chartDir() string { return filepath.Join(repoRoot(), "deploy", "helm", "nri-gpu") }

// testHelm installs nri-gpu with the Helm CLI, restarts and upgrades it
// with GPU pods running, drains and uncordons a node, and uninstalls it.
func testHelm(k kc) {
	t := k.t
	k.doc("lint", nil)
	rendered := k.doc("template", nil)
	if img := releaseImage(k, ""); !strings.Contains(rendered, "image: "+img.Name) || !strings.Contains(rendered, "path: /run/nvidia/driver/proc") {
		t.Errorf("helm template: no image %s or /run/nvidia/driver/proc in\n%s", img.Name, rendered)
	}
	k.doc("install", nil)
	checkInstalled(k, "")
	// The update strategy docs/install.md describes: one node at a time.
	var ds appsv1.DaemonSet
	if err := k.c.GetJSON(k.ctx, &ds, "daemonset", "-n", "nri-gpu", "nri-gpu"); err != nil {
		t.Fatal(err)
	}
	if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil ||
		u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.String() != "1" {
		t.Errorf("the chart's DaemonSet update strategy: %+v, want RollingUpdate with maxUnavailable 1 (docs/install.md)", u)
	}
	k.run("create", "namespace", "ml")
	views := testGPUWorkloads(k, "ml")
	checkTableIsCheckpoints(k)

	before := containerIDs(k, views)
	t.Run("rollout restart", func(t *testing.T) {
		k := kc{t: t, c: k.c, ctx: k.ctx}
		k.doc("restart", nil)
		k.doc("status", nil)
		checkUndisturbed(k, views, before)
	})
	t.Run("helm upgrade to a new image tag", func(t *testing.T) {
		k := kc{t: t, c: k.c, ctx: k.ctx}
		k.doc("upgrade", map[string]string{"tag": imageUpgradeTag})
		k.doc("status", nil)
		checkInstalled(k, imageUpgradeTag)
		for _, n := range k.c.Nodes {
			out, err := k.c.Exec(k.ctx, "nri-gpu", daemonPod(k, n.Name), "", "nri-gpu", "--version")
			if err != nil || !strings.Contains(out, imageUpgradeTag) {
				t.Errorf("node %s: nri-gpu --version after the upgrade: %v %q, want %s", n.Name, err, out, imageUpgradeTag)
			}
		}
		checkUndisturbed(k, views, before)
	})
	t.Run("drain and uncordon", func(t *testing.T) { testDrain(kc{t: t, c: k.c, ctx: k.ctx}) })
	t.Run("helm uninstall", func(t *testing.T) { testUninstall(kc{t: t, c: k.c, ctx: k.ctx}) })
}

// containerIDs are the GPU pods' container IDs and restart counts.
func containerIDs(k kc, views []gpuPodView) map[string]string {
	ids := map[string]string{}
	for _, v := range views {
		p, err := k.c.GetPod(k.ctx, v.pod.Namespace, v.pod.Name)
		if err != nil {
			k.t.Fatal(err)
		}
		for _, s := range p.Status.ContainerStatuses {
			ids[p.Name+"/"+s.Name] = fmt.Sprintf("%s restarts=%d", s.ContainerID, s.RestartCount)
		}
	}
	return ids
}

// checkUndisturbed checks after a restart or upgrade of nri-gpu that the
// GPU pods kept their containers (no restart) and see the same GPUs,
// nri-gpu's table equals the checkpoints, and a new pod gets free GPUs.
func checkUndisturbed(k kc, views []gpuPodView, before map[string]string) {
	t := k.t
	t.Helper()
	if after := containerIDs(k, views); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("GPU pods' containers changed:\nbefore %v\nafter  %v", before, after)
	}
	for _, v := range views {
		now := viewGPUPod(k, v.pod)
		checkSeesExactly(k, now, len(v.assigned))
		if !slices.Equal(now.assigned, v.assigned) {
			t.Errorf("pod %s: assigned %v, was %v", v.pod.Name, now.assigned, v.assigned)
		}
	}
	checkTableIsCheckpoints(k)
	k.apply(gpuDeployment("fresh", "ml", 1, 1))
	p := runningPods(k, "ml", "app=fresh", 1)[0]
	fresh := viewGPUPod(k, p)
	checkSeesExactly(k, fresh, 1)
	checkPlacement(k, append(slices.Clone(views), fresh))
	k.run("delete", "deployment", "-n", "ml", "fresh", "--wait=true")
	k.wait(time.Minute, "fresh's pod gone", func() (bool, string, error) {
		pods, err := k.c.ListPods(k.ctx, "ml", "app=fresh")
		return err == nil && len(pods) == 0, fmt.Sprint(len(pods), err), nil
	})
}

// testDrain drains gpu-a: its GPU pods go (the Deployments' replacements
// land where GPUs are free or wait), its GPUs are free (nri-gpu's table and
// the kubelet's checkpoint empty); after uncordon its GPUs are used again.
func testDrain(k kc) {
	t := k.t
	k.doc("drain", map[string]string{"node": "gpu-a"})
	k.wait(2*time.Minute, "no GPU pod on gpu-a", func() (bool, string, error) {
		var pods corev1.PodList
		if err := k.c.GetJSON(k.ctx, &pods, "pods", "-n", "ml", "--field-selector", "spec.nodeName=gpu-a"); err != nil {
			return false, err.Error(), nil
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d pods", len(pods.Items)), nil
	})
	checkTableIsCheckpoints(k)
	pending := 0
	pods, err := k.c.ListPods(k.ctx, "ml", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Spec.NodeName == "" {
			pending++
		}
	}
	t.Logf("after the drain: %d GPU pods wait for GPUs", pending)
	k.doc("uncordon", map[string]string{"node": "gpu-a"})
	var views []gpuPodView
	for _, d := range []struct {
		app  string
		n, g int
	}{{"gpu1", 2, 1}, {"gpu2", 1, 2}} {
		for _, p := range runningPods(k, "ml", "app="+d.app, d.n) {
			v := viewGPUPod(k, p)
			checkSeesExactly(k, v, d.g)
			views = append(views, v)
		}
	}
	checkPlacement(k, views)
	checkTableIsCheckpoints(k)
}
