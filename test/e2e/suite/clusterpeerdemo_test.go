package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// peerDemos are NVIDIA's quickstart examples (the module's
// demo/specs/quickstart/v1) that need neither a ComputeDomain, VFIO nor
// an MPS control daemon (NVIDIA's runs as a Deployment of NVIDIA's image,
// which this offline machine does not have): one GPU per pod, a claim
// shared by two containers, a claim shared by two pods, four MIG devices
// of one A100 per pod (the "half-balanced" layout), and A100s selected by
// an attribute with time-slicing.
var peerDemos = []string{"gpu-test1", "gpu-test2", "gpu-test3", "gpu-test4", "gpu-test6"}

// nriGPUClass is nri-gpu's DeviceClass for NVIDIA's of the same kind.
var nriGPUClass = map[string]string{"gpu.nvidia.com": "gpu.nri-gpu.dev", "mig.nvidia.com": "mig.nri-gpu.dev"}

// demoManifest is NVIDIA's example name as it runs here: each container's
// image, pull policy and command replaced by the suite's glibc image
// sleeping (no image is pulled here; gpucheck in it reports what the
// container sees), and pods given a grace period of 1 s; for nri-gpu
// (toNRIGPU), each deviceClassName replaced by nri-gpu's, nothing else.
func demoManifest(name string, toNRIGPU bool) (string, error) {
	dir, err := harness.NVIDIADRASource(context.Background())
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(dir, "demo", "specs", "quickstart", "v1", name+".yaml"))
	if err != nil {
		return "", err
	}
	var out []string
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		if len(obj) == 0 {
			continue
		}
		rewriteDemo(obj, toNRIGPU)
		y, err := yaml.Marshal(obj)
		if err != nil {
			return "", err
		}
		out = append(out, string(y))
	}
	return strings.Join(out, "---\n"), nil
}

// rewriteDemo walks a manifest: deviceClassName (toNRIGPU), a pod spec's
// containers and grace period.
func rewriteDemo(v any, toNRIGPU bool) {
	switch x := v.(type) {
	case map[string]any:
		if c, ok := x["deviceClassName"].(string); ok && toNRIGPU && nriGPUClass[c] != "" {
			x["deviceClassName"] = nriGPUClass[c]
		}
		if cs, ok := x["containers"].([]any); ok {
			x["terminationGracePeriodSeconds"] = 1
			for _, c := range cs {
				if m, ok := c.(map[string]any); ok {
					m["image"] = harness.GlibcImage
					m["imagePullPolicy"] = "Never"
					m["command"] = []any{"sleep", "3600"}
					delete(m, "args")
				}
			}
		}
		for _, e := range x {
			rewriteDemo(e, toNRIGPU)
		}
	case []any:
		for _, e := range x {
			rewriteDemo(e, toNRIGPU)
		}
	}
}

// demoOutcome is what one container of an example saw, relative to what
// its claims were allocated: so that the same example under the two
// drivers, which may pick other GPUs, compares.
type demoOutcome map[string]string

// runDemo applies an example, waits for its pods (each Running, or left
// Pending for a minute), records each container's view and deletes the
// example's namespace again.
func runDemo(k kc, name, driver string) demoOutcome {
	t := k.t
	manifest, err := demoManifest(name, driver == draDriver)
	if err != nil {
		t.Fatal(err)
	}
	k.apply(manifest)
	ns := name
	begin := time.Now()
	defer func() {
		settled := time.Since(begin)
		k.run("delete", "namespace", ns, "--wait=true", "--timeout=3m")
		t.Logf("%s on %s: settled in %s, deleted in %s", name, driver, settled.Round(100*time.Millisecond), (time.Since(begin) - settled).Round(100*time.Millisecond))
	}()
	out := demoOutcome{}
	var pods []corev1.Pod
	deadline := time.Now().Add(time.Minute)
	for {
		var err error
		pods, err = k.c.ListPods(k.ctx, ns, "")
		if err != nil {
			t.Fatal(err)
		}
		settled := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning || unschedulable(p) {
				settled++
			}
		}
		if (len(pods) > 0 && settled == len(pods)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	for i, p := range pods {
		pod := p.Name
		if len(p.OwnerReferences) > 0 { // a Deployment's: by its place
			pod = fmt.Sprintf("replica %d", i)
		}
		if p.Status.Phase != corev1.PodRunning {
			out[pod] = "not running: " + podWaitReason(k, p)
			continue
		}
		for _, c := range p.Spec.Containers {
			out[pod+" "+c.Name] = demoContainerView(k, p, c, driver)
		}
	}
	return out
}

// unschedulable reports whether the scheduler found no node for p.
func unschedulable(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// podWaitReason says why pod p does not run: the scheduler's condition or
// the kubelet's last warning, without the names of this run's objects.
func podWaitReason(k kc, p corev1.Pod) string {
	if unschedulable(p) {
		return "unschedulable"
	}
	evs, _ := k.c.Events(k.ctx, p.Namespace, "involvedObject.name="+p.Name)
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type == corev1.EventTypeWarning {
			return evs[i].Reason
		}
	}
	return string(p.Status.Phase)
}

// demoDevice is an allocated device as the container should see it.
type demoDevice struct {
	uuid  string
	minor int      // the GPU's, the parent's for a MIG device
	caps  []string // a MIG device's nvidia-caps nodes
	mig   string   // a MIG device's profile
}

// demoContainerView execs into container c of pod p and sets what it sees
// against the devices of c's claims (driver's): whether its device nodes
// are exactly theirs (/dev/nvidia<minor>, a MIG device's nvidia-caps
// nodes), NVIDIA_VISIBLE_DEVICES (void, their UUIDs, or its value),
// libcuda.so.1's count, and what the devices are.
func demoContainerView(k kc, p corev1.Pod, c corev1.Container, driver string) string {
	n := k.c.Node(p.Spec.NodeName)
	devs := demoAllocated(k, p, c, driver, n)
	out, err := k.c.Exec(k.ctx, p.Namespace, p.Name, c.Name, "sh", "-c", `echo "NVD=$NVIDIA_VISIBLE_DEVICES"; ls /dev; echo CAPS; ls /dev/nvidia-caps 2>/dev/null; gpucheck cuda`)
	if err != nil {
		return fmt.Sprintf("exec: %v", err)
	}
	var nodes, caps []string
	visible, inCaps := "", false
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "NVD="):
			visible = strings.TrimPrefix(l, "NVD=")
		case l == "CAPS":
			inCaps = true
		case inCaps && strings.HasPrefix(l, "nvidia-cap"):
			caps = append(caps, l)
		case !inCaps && regexp.MustCompile(`^nvidia\d+$`).MatchString(l):
			nodes = append(nodes, "/dev/"+l)
		}
	}
	var wantNodes, wantCaps, uuids, kinds []string
	for _, d := range devs {
		if node := fmt.Sprintf("/dev/nvidia%d", d.minor); !slices.Contains(wantNodes, node) {
			wantNodes = append(wantNodes, node)
		}
		wantCaps = append(wantCaps, d.caps...)
		uuids = append(uuids, d.uuid)
		kind := "gpu"
		if d.mig != "" {
			kind = "mig " + d.mig
		}
		kinds = append(kinds, kind)
	}
	for _, s := range [][]string{nodes, caps, wantNodes, wantCaps, uuids, kinds} {
		sort.Strings(s)
	}
	exact := slices.Equal(nodes, wantNodes) && slices.Equal(caps, wantCaps)
	got := strings.Split(visible, ",")
	sort.Strings(got)
	switch {
	case visible == "void" || visible == "":
	case slices.Equal(got, uuids):
		visible = "their UUIDs"
	}
	cuda := "not loaded"
	if m := cudaDevicesRE.FindStringSubmatch(out); m != nil {
		cuda = m[1]
	}
	view := fmt.Sprintf("devices [%s]; nodes exactly theirs: %v; NVIDIA_VISIBLE_DEVICES=%s; libcuda devices: %s", strings.Join(kinds, ", "), exact, visible, cuda)
	if !exact {
		view += fmt.Sprintf(" (sees %v %v, theirs %v %v)", nodes, caps, wantNodes, wantCaps)
	}
	return view
}

// demoAllocated are the devices of driver that container c of pod p was
// given: those of the requests it names of its claims, all of a claim it
// names without a request.
func demoAllocated(k kc, p corev1.Pod, c corev1.Container, driver string, n *harness.Node) []demoDevice {
	slice, err := driverDevices(k, driver, n.Name)
	if err != nil {
		k.t.Fatal(err)
	}
	claimOf := map[string]string{}
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			claimOf[rc.Name] = *rc.ResourceClaimName
		}
	}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			claimOf[st.Name] = *st.ResourceClaimName
		}
	}
	var out []demoDevice
	for _, ref := range c.Resources.Claims {
		var claim resourceapi.ResourceClaim
		if err := k.c.GetJSON(k.ctx, &claim, "resourceclaim", "-n", p.Namespace, claimOf[ref.Name]); err != nil {
			k.t.Fatal(err)
		}
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if ref.Request != "" && r.Request != ref.Request {
				continue
			}
			out = append(out, demoDeviceOf(driver, slice[r.Device], n))
		}
	}
	return out
}

// demoDeviceOf finds slice device d on node n's simulated GPUs.
func demoDeviceOf(driver string, d resourceapi.Device, n *harness.Node) demoDevice {
	attr := func(name string) string {
		_, v := typed(d.Attributes[resourceapi.QualifiedName(name)])
		if v == "" {
			_, v = typed(d.Attributes[resourceapi.QualifiedName(nvidiaDriver+"/"+name)])
		}
		return v
	}
	dd := demoDevice{uuid: attr("uuid"), minor: -1}
	parent := attr("parentUUID")
	for _, g := range n.GPU.GPUs {
		if g.UUID == dd.uuid || g.UUID == parent {
			dd.minor = g.Minor
		}
		if g.UUID != parent {
			continue
		}
		dd.mig = attr("profile")
		for gi := 0; gi < 15; gi++ {
			if simnode.MIGUUIDFor(g.UUID, gi, 0) == dd.uuid {
				dd.caps = []string{fmt.Sprintf("nvidia-cap%d", simnode.GIMinor(g.Minor, gi)), fmt.Sprintf("nvidia-cap%d", simnode.CIMinor(g.Minor, gi, 0))}
			}
		}
	}
	return dd
}

// testPeerDemos runs each of peerDemos on NVIDIA's driver, then with only
// deviceClassName changed on nri-gpu's, and compares what each container
// saw, field by field: each container must see exactly its devices'
// nodes under both, and a field that differs must be one docs/dra.md
// lists with its reason.
func testPeerDemos(k kc) {
	t := k.t
	known, err := knownRows(repoRoot()+"/docs/dra.md", "### NVIDIA's example claims on both drivers")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, name := range peerDemos {
		start := time.Now()
		nv := runDemo(k, name, nvidiaDriver)
		ours := runDemo(k, name, draDriver)
		t.Logf("%s: %s on both drivers", name, time.Since(start).Round(time.Second))
		keys := map[string]bool{}
		for key := range nv {
			keys[key] = true
		}
		for key := range ours {
			keys[key] = true
		}
		var sorted []string
		for key := range keys {
			sorted = append(sorted, key)
		}
		sort.Strings(sorted)
		for _, key := range sorted {
			a, b := nv[key], ours[key]
			t.Logf("%s %s:\n  NVIDIA's driver: %s\n  nri-gpu:         %s", name, key, a, b)
			for _, v := range []string{a, b} {
				if strings.HasPrefix(v, "devices") && !strings.Contains(v, "nodes exactly theirs: true") {
					t.Errorf("%s %s: a container does not see exactly its devices' nodes: %s", name, key, v)
				}
			}
			fa, fb := strings.Split(a, "; "), strings.Split(b, "; ")
			if len(fa) != len(fb) {
				t.Errorf("%s %s: NVIDIA's driver %q, nri-gpu %q", name, key, a, b)
				continue
			}
			for i := range fa {
				if fa[i] == fb[i] {
					continue
				}
				field, _, _ := strings.Cut(fa[i], "=")
				field, _, _ = strings.Cut(field, ":")
				seen[field] = true
				if _, ok := known[field]; !ok {
					t.Errorf("%s %s: %s differs (NVIDIA's driver %q, nri-gpu %q), and docs/dra.md does not list it", name, key, field, fa[i], fb[i])
				}
			}
		}
	}
	for field := range known {
		if !seen[field] {
			t.Errorf("docs/dra.md lists a difference of the example claims not seen: %s", field)
		}
	}
}

// nvidiaDeviceClasses are NVIDIA's DeviceClasses of GPUs and MIG devices,
// as its chart installs them.
func nvidiaDeviceClasses() string {
	var docs []string
	for _, typ := range []string{"gpu", "mig"} {
		docs = append(docs, fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: %[1]s.nvidia.com}
spec:
  selectors:
  - cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '%[1]s'"}
`, typ))
	}
	return strings.Join(docs, "---\n")
}
