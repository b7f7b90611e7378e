package suite

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// MIG made on demand on the cluster (docs/dra.md, "MIG made on demand"):
// gpu-a's second H100 in MIG mode with no MIG device, listed in
// dra.dynamicMIG.devices by the test overlay dra-dynmig, which installs
// the shipped component deploy/kubernetes-dra-dynamic-mig.

// dynMIGOverlay is the DRA test overlay with MIG made on demand.
func dynMIGOverlay() string {
	return filepath.Join(repoRoot(), "test", "e2e", "cluster", "dra-dynmig")
}

// dynMIGBusID is the bus of the GPU the overlay lists: gpu-a's second.
var dynMIGBusID = simnode.DefaultBusID(1)

// migClaimPod is a ResourceClaimTemplate of one MIG device of
// mig.nri-gpu.dev of profile on the GPU parent, and a pod of it.
func migClaimPod(name, profile, parent string) string {
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nri-gpu.dev
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '%[3]s' && device.attributes['gpu.nvidia.com'].parentUUID == '%[4]s'"}
---
apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: mig
    resourceClaimTemplateName: %[1]s
  containers:
  - name: main
    image: %[5]s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: mig}]}
`, name, draNS, profile, parent, harness.GlibcCUDAImage)
}

// madeLedger is nri-gpu's record of the MIG devices it made on node n
// (dynamic-mig.json in its plugin directory): MIG UUID -> claim UID, GPU
// and compute instance.
type madeEntry struct {
	GPU   string `json:"gpu"`
	GI    int    `json:"gi"`
	CI    int    `json:"ci"`
	UUID  string `json:"uuid"`
	Claim string `json:"claim"`
}

func madeLedger(k kc, n *harness.Node) []madeEntry {
	k.t.Helper()
	data, err := os.ReadFile(n.HostPath("/var/lib/kubelet/plugins/" + draDriver + "/dynamic-mig.json"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		k.t.Fatal(err)
	}
	var l struct {
		Made []madeEntry `json:"made"`
	}
	if err := json.Unmarshal(data, &l); err != nil {
		k.t.Fatalf("dynamic-mig.json: %v\n%s", err, data)
	}
	return l.Made
}

// simInstances are the GPU and compute instances the simulated NVML of
// n holds on GPU uuid ("gi/ci" of its dci lines, "gi/-" of a GPU
// instance without one).
func simInstances(k kc, n *harness.Node, uuid string) []string {
	k.t.Helper()
	data, err := os.ReadFile(filepath.Join(filepath.Dir(n.GPU.HostPath(simnode.NVMLStatePath)), simnode.MIGInstancesFile))
	if err != nil && !os.IsNotExist(err) {
		k.t.Fatal(err)
	}
	var out []string
	withCI := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 4 && f[0] == "dci" && strings.EqualFold(f[1], uuid) {
			out = append(out, f[2]+"/"+f[3])
			withCI[f[2]] = true
		}
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == "dgi" && strings.EqualFold(f[1], uuid) && !withCI[f[2]] {
			out = append(out, f[2]+"/-")
		}
	}
	sort.Strings(out)
	return out
}

// simMIGMode is the MIG mode nri-gpu last set through the simulated NVML
// of n on GPU uuid ("1", "0"; "" when it set none since the layout).
func simMIGMode(k kc, n *harness.Node, uuid string) string {
	k.t.Helper()
	data, err := os.ReadFile(filepath.Join(filepath.Dir(n.GPU.HostPath(simnode.NVMLStatePath)), simnode.MIGInstancesFile))
	if err != nil && !os.IsNotExist(err) {
		k.t.Fatal(err)
	}
	mode := ""
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "dmode" && strings.EqualFold(f[1], uuid) {
			mode = f[2]
		}
	}
	return mode
}

// testDRADynamicMIG: with Kubernetes' partitionable devices (beta and on
// from 1.36; the suite's 1.34 has them alpha and off), gpu-a's second
// H100, in MIG mode with no MIG device and listed in
// dra.dynamicMIG.devices, is published whole and as its 25 placements; a
// 1g.10gb claim and a 3g.40gb claim get their MIG devices made at
// prepare (GPU and compute instance in the simulated NVML, the ledger,
// the nvidia-caps nodes) and run side by side, each container seeing
// its own MIG device only; a 4g.40gb claim, which does not fit beside
// them, and a claim of the whole GPU stay Pending by the scheduler's
// counters; when the MIG pods are deleted their devices are gone (NVML,
// ledger, nodes), the GPU leaves MIG mode (nri-gpu switches it on for the
// first MIG device and off after the last, as NVIDIA's driver does on
// Hopper), and the whole-GPU claim is allocated, prepared and runs,
// its container seeing the GPU whole.
func testDRADynamicMIG(k kc, version string) {
	t := k.t
	if minorVersion(version) < 36 {
		t.Skipf("Kubernetes %s: DRAPartitionableDevices is alpha and off (the cluster enables no alpha feature); MIG made on demand needs its counters", version)
	}
	start := time.Now()
	a := k.c.Node("gpu-a")
	g := a.GPU.GPUs[1]
	if g.BusID != dynMIGBusID {
		t.Fatalf("gpu-a's second GPU is on bus %s; the overlay lists %s", g.BusID, dynMIGBusID)
	}
	k.wait(time.Minute, "gpu-a's GPU 1 free", func() (bool, string, error) {
		h := claimTable(k)["gpu-a"][g.UUID]
		return len(h) == 0, fmt.Sprint("held by ", h), nil
	})
	restore := saveMIGFiles(t, a.GPU)
	st := simnode.NVMLState{GPUs: make([]simnode.NVMLGPU, len(a.GPU.GPUs))}
	st.GPUs[1] = simnode.NVMLGPU{MIGMode: 1}
	if err := a.GPU.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	pods := []string{"dyn-small", "dyn-mid", "dyn-four", "dyn-whole"}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := k.c.Kubectl(k.ctx, "get", "pods,resourceclaims", "-n", draNS, "-o", "wide")
			ds, _ := k.c.Kubectl(k.ctx, "describe", "pods", "-n", "nri-gpu", "-l", "app.kubernetes.io/name=nri-gpu")
			t.Logf("--- namespace %s ---\n%s\n--- nri-gpu's pods ---\n%s\n--- nri-gpu on gpu-a ---\n%s", draNS, out, lastLines(ds, 60), lastLines(nriGPULogs(k, a.Name), 40))
		}
		args := append([]string{"delete", "pod", "-n", draNS, "--ignore-not-found", "--wait=true", "--timeout=2m"}, pods...)
		_, _ = k.c.Kubectl(k.ctx, args...)
		// The DaemonSet and ConfigMap go with the DRA phase's overlay.
		restore()
		t.Logf("DRA dynamic MIG: %s", time.Since(start).Round(time.Second))
	})

	// The component's DaemonSet (capabilities, /dev/nvidia-caps) rolls
	// out with the configuration listing the GPU.
	k.run("apply", "-k", dynMIGOverlay())
	k.run("rollout", "status", "-n", "nri-gpu", "daemonset/nri-gpu", "--timeout=3m")
	rolled := time.Since(start)
	whole := fmt.Sprintf("gpu-%d", g.Minor)
	k.wait(time.Minute, "gpu-a's slices: GPU 1 whole and as placements", func() (bool, string, error) {
		devs, err := sliceDevices(k, a.Name)
		if err != nil {
			return false, err.Error(), nil
		}
		var names []string
		n := 0
		for _, d := range devs {
			if strings.HasPrefix(d.Name, whole+"-mig-") || d.Name == whole {
				n++
				if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != whole+"-counter-set" {
					return false, fmt.Sprintf("device %s consumes %+v", d.Name, d.ConsumesCounters), nil
				}
			}
			names = append(names, d.Name)
		}
		return n == 26, fmt.Sprintf("%d devices of %s (want the GPU and its 25 placements, an H100 80GB's): %v", n, whole, names), nil
	})
	t.Logf("the component rolled out in %s; GPU 1 published with its placements in %s", rolled.Round(time.Second), time.Since(start).Round(time.Second))

	k.apply(migClaimPod("dyn-small", "1g.10gb", g.UUID) + "---\n" + migClaimPod("dyn-mid", "3g.40gb", g.UUID))
	type made struct{ uuid, caps string }
	seen := map[string]made{}
	for _, p := range []string{"dyn-small", "dyn-mid"} {
		pod, err := k.c.WaitPodRunning(k.ctx, draNS, p, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var c resourceapi.ResourceClaim
		if err := k.c.GetJSON(k.ctx, &c, "resourceclaim", "-n", draNS, podClaims(pod)[0]); err != nil {
			t.Fatal(err)
		}
		var entry *madeEntry
		for _, m := range madeLedger(k, a) {
			if m.Claim == string(c.UID) {
				entry = &m
			}
		}
		if entry == nil || entry.GPU != g.UUID {
			t.Fatalf("pod %s: claim %s (%s) is not in nri-gpu's ledger of made MIG devices on GPU %s: %+v", p, c.Name, c.UID, g.UUID, madeLedger(k, a))
		}
		v := seenGPU(k, p)
		nvd, gpus, caps, out := v.nvd, v.gpus, v.caps, v.out
		wantCaps := []string{fmt.Sprintf("nvidia-cap%d", simnode.GIMinor(g.Minor, entry.GI)), fmt.Sprintf("nvidia-cap%d", simnode.CIMinor(g.Minor, entry.GI, entry.CI))}
		sort.Strings(caps)
		sort.Strings(wantCaps)
		if nvd != entry.UUID || !slices.Equal(gpus, []string{fmt.Sprintf("nvidia%d", g.Minor)}) || !slices.Equal(caps, wantCaps) {
			t.Errorf("pod %s sees NVIDIA_VISIBLE_DEVICES %q, GPU nodes %v, nvidia-caps %v; want its own MIG device %s (gi %d, ci %d): nvidia%d, %v:\n%s",
				p, nvd, gpus, caps, entry.UUID, entry.GI, entry.CI, g.Minor, wantCaps, out)
		}
		for _, c := range wantCaps {
			if fi, err := os.Stat(a.GPU.HostPath("/dev/nvidia-caps/" + c)); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
				t.Errorf("pod %s: the host's /dev/nvidia-caps/%s: %v, %v; want the node nri-gpu made", p, c, fi, err)
			}
		}
		seen[p] = made{entry.UUID, strings.Join(wantCaps, " ")}
	}
	if seen["dyn-small"].uuid == seen["dyn-mid"].uuid {
		t.Errorf("both claims got MIG device %s", seen["dyn-small"].uuid)
	}
	if got := simInstances(k, a, g.UUID); len(got) != 2 {
		t.Errorf("the simulated NVML holds instances %v on GPU 1, want two", got)
	}
	if m := simMIGMode(k, a, g.UUID); m != "1" {
		t.Errorf("GPU 1's MIG mode as nri-gpu set it: %q, want 1 (on for its MIG devices)", m)
	}
	t.Logf("made on demand: %v", seen)

	// 4 compute slices are not left beside 1 + 3, and the GPU whole
	// shares every counter with them: the scheduler leaves both Pending.
	k.apply(migClaimPod("dyn-four", "4g.40gb", g.UUID) + "---\n" +
		claimPod("dyn-whole", 1, fmt.Sprintf("device.attributes['gpu.nvidia.com'].uuid == '%s'", g.UUID)))
	checkUnschedulable(k, "dyn-four", "cannot allocate all claims")
	checkUnschedulable(k, "dyn-whole", "cannot allocate all claims")

	// The MIG pods go: their devices with them.
	k.run("delete", "pod", "-n", draNS, "dyn-small", "dyn-mid", "dyn-four", "--wait=true", "--timeout=2m")
	k.wait(time.Minute, "the made MIG devices destroyed", func() (bool, string, error) {
		inst, ledger := simInstances(k, a, g.UUID), madeLedger(k, a)
		var left []string
		for _, m := range seen {
			for _, c := range strings.Fields(m.caps) {
				if _, err := os.Lstat(a.GPU.HostPath("/dev/nvidia-caps/" + c)); err == nil {
					left = append(left, c)
				}
			}
		}
		return len(inst) == 0 && len(ledger) == 0 && len(left) == 0, fmt.Sprintf("NVML instances %v, ledger %+v, nvidia-caps nodes %v", inst, ledger, left), nil
	})

	// The whole GPU is then allocated to the claim that waited.
	k.wait(time.Minute, "dyn-whole's claim allocated", func() (bool, string, error) {
		pod, err := k.c.GetPod(k.ctx, draNS, "dyn-whole")
		if err != nil {
			return false, err.Error(), nil
		}
		names := podClaims(pod)
		if len(names) != 1 {
			return false, fmt.Sprint("claims ", names), nil
		}
		var c resourceapi.ResourceClaim
		if err := k.c.GetJSON(k.ctx, &c, "resourceclaim", "-n", draNS, names[0]); err != nil {
			return false, err.Error(), nil
		}
		if c.Status.Allocation == nil {
			return false, "not allocated", nil
		}
		var got []string
		for _, r := range c.Status.Allocation.Devices.Results {
			got = append(got, r.Pool+"/"+r.Device)
		}
		return slices.Equal(got, []string{a.Name + "/" + whole}), fmt.Sprint("allocated ", got), nil
	})
	// Its MIG devices gone, the GPU left MIG mode: the claim of it whole
	// is prepared and its container sees the GPU whole.
	if m := simMIGMode(k, a, g.UUID); m != "0" {
		t.Errorf("GPU 1's MIG mode after its last MIG device: %q, want 0", m)
	}
	if _, err := k.c.WaitPodRunning(k.ctx, draNS, "dyn-whole", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	v := seenGPU(k, "dyn-whole")
	nvd, gpus, caps, out := v.nvd, v.gpus, v.caps, v.out
	if nvd != g.UUID || !slices.Equal(gpus, []string{fmt.Sprintf("nvidia%d", g.Minor)}) || len(caps) != 0 {
		t.Errorf("pod dyn-whole sees NVIDIA_VISIBLE_DEVICES %q, GPU nodes %v, nvidia-caps %v; want the GPU whole %s: nvidia%d, no MIG capability:\n%s",
			nvd, gpus, caps, g.UUID, g.Minor, out)
	}
}

// gpuView is what a claim pod's container sees of its GPU:
// NVIDIA_VISIBLE_DEVICES, its GPU device nodes (nvidia<N> in /dev), the
// entries of /dev/nvidia-caps (none when it has no such directory), and
// the exec's output for messages.
type gpuView struct {
	nvd        string
	gpus, caps []string
	out        string
}

// seenGPU execs into pod's container "main" in draNS and returns what it
// sees of its GPU; the test fails if the exec does.
func seenGPU(k kc, pod string) gpuView {
	k.t.Helper()
	out, err := k.c.Exec(k.ctx, draNS, pod, "main", "sh", "-c", `echo "NVD=$NVIDIA_VISIBLE_DEVICES"; ls /dev; echo CAPS; ls /dev/nvidia-caps 2>/dev/null; true`)
	if err != nil {
		k.t.Fatalf("pod %s: exec: %v\n%s", pod, err, out)
	}
	v := gpuView{out: out}
	gpuNode := regexp.MustCompile(`^nvidia\d+$`)
	inCaps := false
	for _, l := range strings.Split(out, "\n") {
		switch {
		case l == "CAPS":
			inCaps = true
		case inCaps && l != "":
			v.caps = append(v.caps, l)
		case strings.HasPrefix(l, "NVD="):
			v.nvd = strings.TrimPrefix(l, "NVD=")
		case gpuNode.MatchString(l):
			v.gpus = append(v.gpus, l)
		}
	}
	sort.Strings(v.caps)
	return v
}
