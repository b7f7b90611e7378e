package suite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// draUpgradeVersion is the driver version the DRA phase upgrades gpu-a's
// simulated driver to (and back from).
const draUpgradeVersion = "590.44.01"

// testDRAMore runs last in the DRA phase, after every check of testDRA
// that needs the pods it made: it deletes those that hold the DRA GPUs it
// needs (gpu-a's after and ext, gpu-b's a100), then checks device health
// in a claim pod's status (clusterdrahealth_test.go), a GPU and a NIC on
// one PCIe root (clusterdratopology_test.go), a MIG claim on
// a GPU of gpu-a put into MIG mode, a driver upgrade of gpu-a between
// two pods of one claim template, and (Kubernetes 1.36 on) a pod's
// resources.limits nvidia.com/gpu served through DRA on gpu-b. Each puts
// the node back as it was.
func testDRAMore(k kc, version string) {
	begin := time.Now()
	defer func() {
		k.t.Logf("DRA MIG, driver upgrade, nvidia.com/gpu (with the deletions before): %s", time.Since(begin).Round(time.Second))
	}()
	for _, p := range []string{"after", "ext", "a100"} {
		k.run("delete", "pod", "-n", draNS, p, "--ignore-not-found", "--wait=true", "--timeout=2m")
	}
	sub := func(name string, f func(kc)) {
		start := time.Now()
		k.t.Run(name, func(t *testing.T) { f(kc{t: t, c: k.c, ctx: k.ctx}) })
		k.t.Logf("DRA %s: %s", name, time.Since(start).Round(time.Second))
	}
	sub("health", func(k kc) { testDRAHealth(k, version) })
	sub("topology", testDRATopology)
	sub("mig", testDRAMIG)
	sub("driver upgrade", testDRAUpgrade)
	sub("nvidia.com/gpu", func(k kc) { testDRANvidiaGPU(k, version) })
	sub("dynamic MIG", func(k kc) { testDRADynamicMIG(k, version) })
}

// migLayout is the MIG layout the DRA phase puts on one GPU: three
// 2g.20gb devices (GPU instances 3 to 5) and one 1g.10gb (13).
func migLayout() []simnode.MIG {
	return []simnode.MIG{simnode.H100MIG(3, 0, 2), simnode.H100MIG(4, 0, 2), simnode.H100MIG(5, 0, 2), simnode.H100MIG(13, 0, 1)}
}

// testDRAMIG puts gpu-a's GPU 2 (a DRA GPU no claim holds now) into MIG
// mode through the simulated node (NVML's state, the driver's capability
// files and nvidia-caps nodes, as nvidia-smi mig -cgi -C leaves them),
// waits for nri-gpu's slice to be republished with its four MIG devices
// in place of the GPU (type mig, parentUUID, profile, memory, uuid), and
// runs a pod whose claim of mig.nri-gpu.dev selects the profile 1g.10gb:
// its container sees exactly that MIG device (NVIDIA_VISIBLE_DEVICES its
// UUID, the nvidia-caps nodes of its GPU and compute instance, the
// parent's /dev/nvidia<minor> and no other GPU's), and the claim's CDI
// spec has device nodes only. Then the layout is undone and the slice is
// the GPU again.
func testDRAMIG(k kc) {
	t := k.t
	a := k.c.Node("gpu-a")
	g := a.GPU.GPUs[2]
	table := claimTable(k)
	if h := table["gpu-a"][g.UUID]; len(h) != 0 {
		t.Fatalf("gpu-a's GPU 2 is held by %v: it cannot go into MIG mode", h)
	}
	restore := saveMIGFiles(t, a.GPU)
	layout := migLayout()
	st := simnode.NVMLState{GPUs: make([]simnode.NVMLGPU, len(a.GPU.GPUs))}
	st.GPUs[2] = simnode.NVMLGPU{MIGMode: 1, MIG: layout}
	if err := a.GPU.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = k.c.Kubectl(k.ctx, "delete", "pod", "-n", draNS, "mig", "--ignore-not-found", "--wait=true", "--timeout=2m")
		restore()
		checkSlices(k)
	})

	// The slice: GPU 2's four MIG devices, not the GPU.
	want := map[string]simnode.MIG{}
	for _, m := range layout {
		want[simnode.MIGUUIDFor(g.UUID, m.GI, m.CI)] = m
	}
	byUUID := map[string]string{}
	k.wait(time.Minute, "gpu-a's slice has GPU 2's MIG devices", func() (bool, string, error) {
		devs, err := sliceDevices(k, "gpu-a")
		if err != nil {
			return false, err.Error(), nil
		}
		var problems []string
		byUUID = map[string]string{}
		for _, d := range devs {
			if d.Name == fmt.Sprintf("gpu-%d", g.Minor) {
				problems = append(problems, "the MIG GPU is published whole as "+d.Name)
			}
			if attrStr(d, "type") != "mig" {
				continue
			}
			u := attrStr(d, "uuid")
			m, ok := want[u]
			mem := d.Capacity["gpu.nvidia.com/memory"]
			prof := fmt.Sprintf("%dg.%dgb", m.GISlices, m.GISlices*10)
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("MIG device %s (%s) is not of the layout", d.Name, u))
			case attrStr(d, "parentUUID") != g.UUID || attrStr(d, "profile") != prof || mem.Value.Value() != int64(m.MemoryMiB)<<20 ||
				attrStr(d, "productName") != g.Model:
				problems = append(problems, fmt.Sprintf("MIG device %s: attributes %v, capacity %v; want parentUUID %s, profile %s, memory %d MiB, productName %s",
					d.Name, d.Attributes, d.Capacity, g.UUID, prof, m.MemoryMiB, g.Model))
			}
			byUUID[u] = d.Name
		}
		if len(byUUID) != len(want) {
			problems = append(problems, fmt.Sprintf("%d MIG devices, want %d", len(byUUID), len(want)))
		}
		return len(problems) == 0, strings.Join(problems, "; "), nil
	})
	t.Logf("gpu-a's MIG devices: %v", byUUID)

	k.apply(fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: mig, namespace: %[1]s}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nri-gpu.dev
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}
---
apiVersion: v1
kind: Pod
metadata: {name: mig, namespace: %[1]s}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: mig
    resourceClaimTemplateName: mig
  containers:
  - name: main
    image: %[2]s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: mig}]}
`, draNS, harness.GlibcCUDAImage))
	p, err := k.c.WaitPodRunning(k.ctx, draNS, "mig", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	small := layout[3]
	mig := simnode.MIGUUIDFor(g.UUID, small.GI, small.CI)
	names := podClaims(p)
	if p.Spec.NodeName != "gpu-a" || len(names) != 1 {
		t.Fatalf("pod mig on %s with claims %v, want gpu-a and one claim", p.Spec.NodeName, names)
	}
	var c resourceapi.ResourceClaim
	if err := k.c.GetJSON(k.ctx, &c, "resourceclaim", "-n", draNS, names[0]); err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 || c.Status.Allocation.Devices.Results[0].Device != byUUID[mig] {
		t.Errorf("claim %s: allocation %+v, want gpu-a's 1g.10gb device %s", c.Name, c.Status.Allocation, byUUID[mig])
	}
	checkClaimSpec(k, a, string(c.UID))

	v := seenGPU(k, "mig")
	caps, out := v.caps, v.out
	var gpus []string
	for _, g := range v.gpus {
		gpus = append(gpus, "/dev/"+g)
	}
	wantCaps := []string{fmt.Sprintf("nvidia-cap%d", simnode.GIMinor(g.Minor, small.GI)), fmt.Sprintf("nvidia-cap%d", simnode.CIMinor(g.Minor, small.GI, small.CI))}
	sort.Strings(wantCaps)
	if v.nvd != mig || !slices.Equal(gpus, []string{fmt.Sprintf("/dev/nvidia%d", g.Minor)}) || !slices.Equal(caps, wantCaps) {
		t.Errorf("pod mig: want NVIDIA_VISIBLE_DEVICES=%s, GPU nodes [/dev/nvidia%d], nvidia-caps %v; it sees GPU nodes %v, nvidia-caps %v:\n%s",
			mig, g.Minor, wantCaps, gpus, caps, out)
	}
	if now := claimTable(k)["gpu-a"][mig]; !slices.Equal(now, []string{"claim " + draNS + "/" + c.Name}) {
		t.Errorf("nri-gpu's table for the MIG device %s: %v, want the claim %s", mig, now, c.Name)
	}
}

// saveMIGFiles records what SetMIG replaces on node n (the NVML state
// file, mig-minors, the capability files, /dev/nvidia-caps) and returns
// a function that puts it back: a file or directory that was not there
// is removed.
func saveMIGFiles(t *testing.T, n *simnode.Node) func() {
	t.Helper()
	state := n.HostPath(simnode.NVMLStatePath)
	saved, err := os.ReadFile(state)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	had := map[string]bool{}
	paths := []string{"/proc/driver/nvidia-caps/mig-minors", "/proc/driver/nvidia/capabilities", "/dev/nvidia-caps"}
	for _, p := range paths {
		_, err := os.Lstat(n.HostPath(p))
		had[p] = err == nil
	}
	return func() {
		// SetMIG without MIG removes the GPUs' instance files and nodes;
		// what it lays out besides (MIG config and monitor) goes where the
		// node had none.
		if err := n.SetMIG(simnode.NVMLState{}); err != nil {
			t.Error(err)
		}
		for _, p := range paths {
			if !had[p] {
				if err := os.RemoveAll(n.HostPath(p)); err != nil {
					t.Error(err)
				}
			}
		}
		if saved != nil {
			err = os.WriteFile(state, saved, 0o644)
		} else {
			err = os.Remove(state)
		}
		if err != nil {
			t.Error(err)
		}
	}
}

// sliceDevices are the devices of nri-gpu's ResourceSlices of node.
func sliceDevices(k kc, node string) ([]resourceapi.Device, error) {
	var list resourceapi.ResourceSliceList
	if err := k.c.GetJSON(k.ctx, &list, "resourceslices"); err != nil {
		return nil, err
	}
	var out []resourceapi.Device
	for _, s := range list.Items {
		if s.Spec.Driver == draDriver && s.Spec.NodeName != nil && *s.Spec.NodeName == node {
			out = append(out, s.Spec.Devices...)
		}
	}
	return out, nil
}

// attrStr is the string or version attribute gpu.nvidia.com/<name> of d.
func attrStr(d resourceapi.Device, name string) string {
	a := d.Attributes[resourceapi.QualifiedName("gpu.nvidia.com/"+name)]
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return ""
}

// semverOf is a driver version as NVIDIA's DRA driver publishes it
// ("580.126.09" -> "580.126.9").
func semverOf(v string) string {
	parts := strings.Split(v, ".")
	for i, p := range parts {
		if n, err := strconv.Atoi(p); err == nil {
			parts[i] = strconv.Itoa(n)
		}
	}
	return strings.Join(parts, ".")
}

// waitDriverVersion waits until every device of node's slice has
// driverVersion v.
func waitDriverVersion(k kc, node, v string) {
	k.t.Helper()
	want := semverOf(v)
	k.wait(time.Minute, "node "+node+"'s slice: driverVersion "+want, func() (bool, string, error) {
		devs, err := sliceDevices(k, node)
		if err != nil {
			return false, err.Error(), nil
		}
		var got []string
		ok := len(devs) > 0
		for _, d := range devs {
			got = append(got, d.Name+"="+attrStr(d, "driverVersion"))
			ok = ok && attrStr(d, "driverVersion") == want
		}
		return ok, strings.Join(got, " "), nil
	})
}

// driverFiles is, in the container main of pod, gpucheck nvml's driver
// version and the files whose names carry version old or version new
// (libraries, firmware) outside /proc and /sys.
func driverFiles(k kc, pod, old, new string) (nvml string, oldFiles, newFiles []string) {
	k.t.Helper()
	out, err := k.c.Exec(k.ctx, draNS, pod, "main", "sh", "-c",
		fmt.Sprintf(`gpucheck nvml; find / \( -path /proc -o -path /sys \) -prune -o \( -name '*%s*' -o -name '*%s*' \) -print 2>/dev/null`, old, new))
	if err != nil && !strings.Contains(out, "driver=") {
		k.t.Fatalf("pod %s: exec: %v\n%s", pod, err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.Contains(l, "driver="):
			nvml = l
		case strings.HasPrefix(l, "/") && strings.Contains(l, old):
			oldFiles = append(oldFiles, l)
		case strings.HasPrefix(l, "/") && strings.Contains(l, new):
			newFiles = append(newFiles, l)
		}
	}
	return nvml, oldFiles, newFiles
}

// testDRAUpgrade: pod upg-1 of the claim template upg (one GPU of 64 GiB
// or more: gpu-a) runs with the driver's files of the old version; then
// gpu-a's simulated driver is upgraded as a driver upgrade and module
// reload leave it (simnode.Upgrade: new libraries, binaries, version
// files, the old ones gone); nri-gpu's slice shows the new driverVersion
// on every gpu-a device; pod upg-2 of the same template gets the new
// version's libraries and none of the old, NVML in it reports the new
// driver, and its claim's CDI spec has device nodes only (no driver
// path); upg-1 keeps its old driver. Then the driver is put back.
func testDRAUpgrade(k kc) {
	t := k.t
	a := k.c.Node("gpu-a")
	orig := a.GPU
	old := orig.DriverVersion
	if old == draUpgradeVersion {
		t.Fatalf("gpu-a already runs driver %s", old)
	}
	k.apply(upgradeTemplate() + "---\n" + upgradePod("upg-1"))
	v1 := viewClaimPod(k, "upg-1")
	checkSeesExactly(k, v1.gpuPodView, 1)
	nvml, oldFiles, newFiles := driverFiles(k, "upg-1", old, draUpgradeVersion)
	if !strings.Contains(nvml, "driver="+old) || len(oldFiles) == 0 || len(newFiles) != 0 {
		t.Errorf("upg-1 before the upgrade: %q, files of %s %v, of %s %v", nvml, old, oldFiles, draUpgradeVersion, newFiles)
	}

	up, err := simnode.Upgrade(orig, draUpgradeVersion, simnode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a.GPU = up
	t.Cleanup(func() {
		_, _ = k.c.Kubectl(k.ctx, "delete", "pod", "-n", draNS, "upg-1", "upg-2", "--ignore-not-found", "--wait=true", "--timeout=2m")
		back, err := simnode.Upgrade(up, old, simnode.Options{})
		if err != nil {
			t.Fatal(err)
		}
		a.GPU = back
		waitDriverVersion(k, "gpu-a", old)
	})
	waitDriverVersion(k, "gpu-a", draUpgradeVersion)

	k.apply(upgradePod("upg-2"))
	v2 := viewClaimPod(k, "upg-2")
	checkSeesExactly(k, v2.gpuPodView, 1)
	if v2.pod.Spec.NodeName != "gpu-a" || slices.Equal(v1.claims, v2.claims) {
		t.Errorf("upg-2 on %s with claims %v (upg-1's %v), want gpu-a and a claim of its own", v2.pod.Spec.NodeName, v2.names, v1.names)
	}
	nvml, oldFiles, newFiles = driverFiles(k, "upg-2", old, draUpgradeVersion)
	var libs []string
	for _, f := range newFiles {
		if strings.Contains(filepath.Base(f), ".so.") {
			libs = append(libs, f)
		}
	}
	if !strings.Contains(nvml, "driver="+draUpgradeVersion) || len(libs) == 0 || len(oldFiles) != 0 {
		t.Errorf("upg-2 after the upgrade: %q, libraries of %s %v, files of %s %v", nvml, draUpgradeVersion, libs, old, oldFiles)
	} else {
		t.Logf("upg-2: %s; %d libraries of %s, e.g. %s", nvml, len(libs), draUpgradeVersion, libs[0])
	}
	if nvml, _, _ := driverFiles(k, "upg-1", old, draUpgradeVersion); !strings.Contains(nvml, "driver="+old) {
		t.Errorf("upg-1 lost its driver over the upgrade: %q", nvml)
	}
}

// upgradeTemplate is the claim template upg: one GPU of 64 GiB or more
// (gpu-a's).
func upgradeTemplate() string {
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: upg, namespace: %s}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: %s
          selectors:
          - cel: {expression: "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('64Gi')) >= 0"}
`, draNS, draDriver)
}

// upgradePod is a pod of the claim template upg.
func upgradePod(name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: upg
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {claims: [{name: gpu}]}
`, name, draNS, harness.GlibcCUDAImage)
}

// testDRANvidiaGPU: with gpu.nri-gpu.dev given extendedResourceName:
// nvidia.com/gpu (what the chart's nvidiaGPUResource: dra renders), a
// pod asking resources.limits nvidia.com/gpu: 1, on no node named, is
// served through DRA on gpu-b, whose nri-gpu device plugin offers none of
// its GPUs (allocatable nvidia.com/gpu 0: the scheduler delegates a name
// to DRA on a node with none of it allocatable), and not on gpu-a, whose
// device plugin serves the name (its one GPU held), though gpu-a has free
// DRA GPUs: the scheduler made the pod a claim (its
// extendedResourceClaimStatus), the kubelet's device manager assigned it
// nothing, and the container sees exactly the claim's GPU.
func testDRANvidiaGPU(k kc, version string) {
	t := k.t
	if minorVersion(version) < 36 {
		t.Skipf("Kubernetes %s: DRAExtendedResource is alpha before 1.36 (off by default; the cluster enables no alpha feature)", version)
	}
	for node, want := range map[string]string{"gpu-a": "1", "gpu-b": "0"} {
		n, err := k.c.GetNode(k.ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Status.Allocatable["nvidia.com/gpu"]; got.String() != want {
			t.Fatalf("node %s: allocatable nvidia.com/gpu %s, want %s (the overlay's device plugin GPUs)", node, got.String(), want)
		}
	}
	k.run("patch", "deviceclass", draDriver, "--type", "merge", "-p", `{"spec":{"extendedResourceName":"nvidia.com/gpu"}}`)
	defer k.run("patch", "deviceclass", draDriver, "--type", "json", "-p", `[{"op":"remove","path":"/spec/extendedResourceName"}]`)
	k.apply(limitsPod("nvgpu", draNS, harness.GlibcCUDAImage, "nvidia.com/gpu", 1))
	defer k.run("delete", "pod", "-n", draNS, "nvgpu", "--wait=true", "--timeout=2m")
	v := viewClaimPod(k, "nvgpu")
	if v.pod.Status.ExtendedResourceClaimStatus == nil || len(v.claims) != 1 || v.pod.Spec.NodeName != "gpu-b" {
		t.Errorf("pod nvgpu: on %s with claims %v (extendedResourceClaimStatus %+v), want gpu-b and the scheduler's claim", v.pod.Spec.NodeName, v.names, v.pod.Status.ExtendedResourceClaimStatus)
	}
	checkSeesExactly(k, v.gpuPodView, 1)
	cp, err := harness.ReadDeviceCheckpointAt(k.c.Node(v.pod.Spec.NodeName).HostPath(harness.KubeletCheckpoint))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range cp.Entries {
		if e.PodUID == string(v.pod.UID) {
			t.Errorf("the kubelet's device manager assigned pod nvgpu %s %v", e.ResourceName, e.DeviceIDs)
		}
	}
}
