package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// nicDriver is test/e2e/cmd/dra-test-nic's driver name, and its
// DeviceClass's.
const nicDriver = "nic.e2e.nri-gpu.dev"

// nicBeside is the bus id of a NIC at the bus after the GPU at busID,
// under the same PCIe root (simnode.PCIeRootFor).
func nicBeside(busID string) string {
	dom, rest, _ := strings.Cut(busID, ":")
	n, _ := strconv.ParseUint(rest[:2], 16, 8)
	return fmt.Sprintf("%s:%02x:00.0", dom, n+1)
}

// startNICDriver lays out nics on node n's simulated sysfs and runs
// test/e2e/cmd/dra-test-nic in n's namespaces for them, with its
// DeviceClass, until the test ends; then its ResourceSlices go too.
func startNICDriver(k kc, n *harness.Node, nics []simnode.PCIDevice) {
	t := k.t
	t.Helper()
	var buses []string
	for _, d := range nics {
		if err := n.GPU.AddPCIDevice(d); err != nil {
			t.Fatal(err)
		}
		buses = append(buses, d.BusID)
	}
	built := time.Now()
	bin, err := harness.BuildE2ECommand(k.ctx, "dra-test-nic", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dra-test-nic built in %s", time.Since(built).Round(100*time.Millisecond))
	log, err := os.Create(filepath.Join(n.NS.Dir, "dra-test-nic.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := n.NS.NS.Command(context.Background(), bin, "-node", n.Name, "-kubeconfig", k.c.Kubeconfig,
		"-sysfs", harness.NodeDriverRoot+"/sys", "-nic", strings.Join(buses, ","))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("--- node %s: dra-test-nic's log ---\n%s", n.Name, out)
		}
		_, _ = k.c.Kubectl(k.ctx, "delete", "resourceslices", "--field-selector", "spec.driver="+nicDriver, "--wait=false")
		_, _ = k.c.Kubectl(k.ctx, "delete", "deviceclass", nicDriver, "--ignore-not-found", "--wait=false")
	})
	k.apply(fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: %[1]s}
spec:
  selectors:
  - cel: {expression: "device.driver == '%[1]s'"}
`, nicDriver))
}

// alignedPod is a ResourceClaimTemplate of one nri-gpu GPU and one NIC
// (nicSelector, if any, choosing it) whose attribute attr is the same,
// and a pod of it whose container main sleeps.
func alignedPod(name, attr, nicSelector string) string {
	sel := ""
	if nicSelector != "" {
		sel = fmt.Sprintf("\n          selectors:\n          - cel: {expression: %q}", nicSelector)
	}
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: %[3]s}
      - name: nic
        exactly:
          deviceClassName: %[4]s%[5]s
      constraints:
      - requests: [gpu, nic]
        matchAttribute: resource.kubernetes.io/%[7]s
---
apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: both
    resourceClaimTemplateName: %[1]s
  containers:
  - name: main
    image: %[6]s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: both}]}
`, name, draNS, draDriver, nicDriver, sel, harness.GlibcCUDAImage, attr)
}

// testDRATopology: nri-gpu publishes each DRA GPU of gpu-a with its PCIe
// root and NUMA node (resource.kubernetes.io/pcieRoot, from the simulated
// node's sysfs through Kubernetes' deviceattribute helper, one root per
// GPU; resource.kubernetes.io/numaNode, GPUs 0 and 1 on node 0, 2 and 3
// on node 1). A test DRA driver for NICs (test/e2e/cmd/dra-test-nic)
// publishes two NICs of gpu-a with theirs: nic-0 beside GPU 1 (a DRA GPU,
// NUMA node 0), nic-1 beside GPU 3 (the device plugin's, not published
// through DRA; NUMA node 1). A claim of a GPU and a NIC with
// matchAttribute pcieRoot is allocated GPU 1 and nic-0, the only pair on
// one root; its container sees exactly GPU 1 and is given nic-0 (its CDI
// entry). A claim asking for nic-1 the same way cannot be met by any DRA
// GPU: its pod stays Pending by the scheduler. The same claim with
// matchAttribute numaNode is allocated nic-1 and GPU 2, the only free DRA
// GPU on its NUMA node. It is one piece: the claims are set against the
// attributes it checks first and the NICs it lays out.
func testDRATopology(k kc) {
	t := k.t
	a := k.c.Node("gpu-a")
	g1, g2, g3 := a.GPU.GPUs[1], a.GPU.GPUs[2], a.GPU.GPUs[3]
	for _, g := range []simnode.GPU{g1, g2} {
		if h := claimTable(k)["gpu-a"][g.UUID]; len(h) != 0 {
			t.Fatalf("gpu-a's GPU %d is held by %v", g.Index, h)
		}
	}
	k.wait(time.Minute, "gpu-a's DRA GPUs published with their PCIe roots and NUMA nodes", func() (bool, string, error) {
		devs, err := sliceDevices(k, "gpu-a")
		if err != nil {
			return false, err.Error(), nil
		}
		var problems []string
		roots := map[string]bool{}
		for _, g := range draGPUs(a) {
			for _, d := range devs {
				if d.Name != fmt.Sprintf("gpu-%d", g.Minor) {
					continue
				}
				r, n := d.Attributes["resource.kubernetes.io/pcieRoot"], d.Attributes["resource.kubernetes.io/numaNode"]
				if r.StringValue == nil || *r.StringValue != simnode.PCIeRootFor(g.BusID) || roots[*r.StringValue] ||
					n.IntValue == nil || fmt.Sprint(*n.IntValue) != g.NUMANode {
					problems = append(problems, fmt.Sprintf("%s (bus %s): pcieRoot %v, numaNode %v; want %s, one per GPU, and %s",
						d.Name, g.BusID, r, n, simnode.PCIeRootFor(g.BusID), g.NUMANode))
					continue
				}
				roots[*r.StringValue] = true
			}
		}
		return len(problems) == 0 && len(roots) == len(draGPUs(a)), strings.Join(problems, "; "), nil
	})
	nic0, nic1 := nicBeside(g1.BusID), nicBeside(g3.BusID)
	step := time.Now()
	startNICDriver(k, a, []simnode.PCIDevice{{BusID: nic0, NUMANode: g1.NUMANode}, {BusID: nic1, NUMANode: g3.NUMANode}})
	// Registered after the NIC driver's, so it runs first: the pods go
	// while the NIC driver still runs to unprepare their NICs (stopped
	// first, their deletion hung for its whole timeout and left GPUs 1
	// and 2 held for the checks after this one).
	t.Cleanup(func() {
		_, _ = k.c.Kubectl(k.ctx, "delete", "pod", "-n", draNS, "aligned", "misaligned", "numa", "--ignore-not-found", "--wait=true", "--timeout=2m")
	})
	k.wait(time.Minute, "the NIC driver's slice: nic-0 on GPU 1's root, nic-1 on GPU 3's", func() (bool, string, error) {
		var list resourceapi.ResourceSliceList
		if err := k.c.GetJSON(k.ctx, &list, "resourceslices"); err != nil {
			return false, err.Error(), nil
		}
		got := map[string]string{}
		for _, s := range list.Items {
			if s.Spec.Driver == nicDriver {
				for _, d := range s.Spec.Devices {
					if r, n := d.Attributes["resource.kubernetes.io/pcieRoot"], d.Attributes["resource.kubernetes.io/numaNode"]; r.StringValue != nil && n.IntValue != nil {
						got[d.Name] = fmt.Sprintf("%s/%d", *r.StringValue, *n.IntValue)
					}
				}
			}
		}
		want := map[string]string{"nic-0": simnode.PCIeRootFor(g1.BusID) + "/" + g1.NUMANode, "nic-1": simnode.PCIeRootFor(g3.BusID) + "/" + g3.NUMANode}
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("%v, want %v", got, want), nil
	})

	t.Logf("the NIC driver's slice published in %s", time.Since(step).Round(100*time.Millisecond))
	step = time.Now()
	k.apply(alignedPod("aligned", "pcieRoot", ""))
	checkAligned(k, "aligned", g1, "nic-0", nic0)
	t.Logf("pcieRoot: the aligned pod checked in %s", time.Since(step).Round(100*time.Millisecond))
	step = time.Now()

	// nic-1 shares its root with no DRA GPU: no allocation.
	onNIC1 := "device.attributes['resource.kubernetes.io'].pciBusID == '" + nic1 + "'"
	k.apply(alignedPod("misaligned", "pcieRoot", onNIC1))
	checkUnschedulable(k, "misaligned", "cannot allocate all claims")
	k.run("delete", "pod", "-n", draNS, "misaligned", "--wait=true", "--timeout=2m")
	t.Logf("pcieRoot: the misaligned pod Pending, then deleted, in %s", time.Since(step).Round(100*time.Millisecond))
	step = time.Now()

	// nic-1 shares its NUMA node with GPU 2.
	k.apply(alignedPod("numa", "numaNode", onNIC1))
	checkAligned(k, "numa", g2, "nic-1", nic1)
	t.Logf("numaNode: the pod checked in %s", time.Since(step).Round(100*time.Millisecond))
}

// checkAligned waits for the pod name of alignedPod and checks that its
// claim was allocated exactly GPU g and NIC nic (at bus), and that its
// container sees exactly g and is given nic.
func checkAligned(k kc, name string, g simnode.GPU, nic, bus string) {
	t := k.t
	t.Helper()
	a := k.c.Node("gpu-a")
	p, err := k.c.WaitPodRunning(k.ctx, draNS, name, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	names := podClaims(p)
	if p.Spec.NodeName != "gpu-a" || len(names) != 1 {
		t.Fatalf("pod %s on %s with claims %v, want gpu-a and one claim", name, p.Spec.NodeName, names)
	}
	var c resourceapi.ResourceClaim
	if err := k.c.GetJSON(k.ctx, &c, "resourceclaim", "-n", draNS, names[0]); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range c.Status.Allocation.Devices.Results {
		got = append(got, fmt.Sprintf("%s/%s/%s", r.Request, r.Driver, r.Device))
	}
	sort.Strings(got)
	want := []string{fmt.Sprintf("gpu/%s/gpu-%d", draDriver, g.Minor), "nic/" + nicDriver + "/" + nic}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("claim %s: allocated %v, want %v", c.Name, got, want)
	}
	checkClaimSpec(k, a, string(c.UID))
	v := viewGPUPod(k, *p)
	v.assigned = []string{g.UUID}
	checkSeesExactly(k, v, 1)
	out, err := k.c.Exec(k.ctx, draNS, name, "main", "sh", "-c", "env | grep ^DRA_TEST_NIC_")
	if want := fmt.Sprintf("DRA_TEST_NIC_%s=%s", strings.TrimPrefix(nic, "nic-"), bus); err != nil || strings.TrimSpace(out) != want {
		t.Errorf("pod %s: its NIC entries %q (%v), want %s", name, out, err, want)
	}
}
