package suite

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// peerOptIn is the env var that runs TestClusterPeer: the Kubernetes
// version to run it at (make e2e-peer: v1.37.2).
const peerOptIn = "NRI_GPU_E2E_PEER"

// peerOverlay is test/e2e/cluster/dra-peer: nri-gpu's DRA driver on every
// GPU of the node, no device plugin.
func peerOverlay() string { return filepath.Join(repoRoot(), "test", "e2e", "cluster", "dra-peer") }

// peerNodes are the comparison's nodes, both on containerd 2.4, their
// MIG layouts made before anything starts, as nvidia-smi mig -cgi -C (or
// nvidia-mig-parted) leaves a node: peer-h100 with six H100 80GB, GPUs 0
// and 1 in MIG mode with MixedMIG's layout (seven 1g.10gb; three 2g.20gb
// and a 1g.10gb); peer-a100 with eight A100 40GB, GPUs 0 to 3 in NVIDIA's
// quickstart's "half-balanced" layout (A100HalfBalanced), the others whole.
// Each GPU sits under a PCIe root complex of its own (simnode.PCIeRootFor)
// with a NUMA node in sysfs, the first half of a node's GPUs on node 0,
// the others on node 1 (peerNUMANode), as on a two-socket HGX board: both
// drivers read resource.kubernetes.io/pcieRoot and numaNode from there.
func peerNodes() []harness.NodeOptions {
	var h100, a100 []simnode.GPU
	for i := range 6 {
		h100 = append(h100, simnode.GPU{BusID: simnode.DefaultBusID(i), NUMANode: peerNUMANode(i, 6)})
	}
	for i := range 8 {
		// Bus ids after peer-h100's: GPU UUIDs (derived from them) are
		// unique in the cluster, as real ones are.
		a100 = append(a100, simnode.GPU{BusID: simnode.DefaultBusID(len(h100) + i), Model: simnode.A100Model, NUMANode: peerNUMANode(i, 8)})
	}
	return []harness.NodeOptions{
		{Name: "peer-h100", Runtime: harness.RuntimeContainerd24, GPUs: &simnode.Options{Layout: simnode.LayoutRHEL, GPUs: h100},
			Prepare: func(n *harness.Node, _ *harness.NodeOptions) error { return n.GPU.SetMIG(simnode.MixedMIG()) }},
		{Name: "peer-a100", Runtime: harness.RuntimeContainerd24, GPUs: &simnode.Options{Layout: simnode.LayoutRHEL, GPUs: a100},
			Prepare: func(n *harness.Node, _ *harness.NodeOptions) error {
				st := simnode.NVMLState{}
				for i := range n.GPU.GPUs {
					g := simnode.NVMLGPU{MemoryMiB: harness.GPUBMemoryMiB}
					if i < 4 {
						g.MIGMode, g.MIG = 1, simnode.A100HalfBalanced()
					}
					st.GPUs = append(st.GPUs, g)
				}
				return n.GPU.SetMIG(st)
			}},
	}
}

// peerNUMANode is the NUMA node of GPU i of a peer node of n GPUs.
func peerNUMANode(i, n int) string { return fmt.Sprint(i * 2 / n) }

// peerDRAOptions run NVIDIA's driver with its sharing gates on, so that
// its GpuConfig sharing settings are read rather than all refused (both
// alpha, off by default).
var peerDRAOptions = nvidiaDRAOptions{featureGates: "TimeSlicingSettings=true,MPSSupport=true"}

// peerDevices is how many devices each driver publishes on each peer
// node: the MIG devices and the GPUs without MIG.
var peerDevices = map[string]int{"peer-h100": 7 + 4 + 4, "peer-a100": 4*4 + 4}

// peerSelector is a CEL selector that keeps the claims of driver to its
// half of the peer nodes' GPUs (and their MIG devices): NVIDIA's driver
// the GPUs of even index on their node, nri-gpu the odd ones. Both
// drivers publish every GPU, so the scheduler, seeing two devices per
// GPU, may give one GPU to a claim of each; nri-gpu then refuses the
// container that NVIDIA's claim gives a GPU one of nri-gpu's claims holds
// (a GPU a claim holds is reached only through that claim). A real node
// has one driver per GPU; the comparison's claims run side by side, each
// on GPUs of its own.
func peerSelector(c *harness.Cluster, driver string) string {
	var buses []string
	for _, n := range c.Nodes {
		for _, g := range n.GPU.GPUs {
			if (g.Index%2 == 0) == (driver == nvidiaDriver) {
				buses = append(buses, "'"+strings.ToLower(g.BusID)+"'")
			}
		}
	}
	return "device.attributes['resource.kubernetes.io'].pciBusID in [" + strings.Join(buses, ", ") + "]"
}

// TestClusterPeer sets nri-gpu beside NVIDIA's own DRA driver
// (gpu-kubelet-plugin v0.5.0, built from its Go module) on one node of a
// real cluster, with the simulated NVML both read: the ResourceSlices
// device by device (docs/dra.md, "Beside NVIDIA's driver").
func TestClusterPeer(t *testing.T) {
	version := os.Getenv(peerOptIn)
	if version == "" {
		t.Skipf("runs only with %s=<Kubernetes version> (make e2e-peer: %s)", peerOptIn, harness.KubernetesVersion)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a cluster with real runtimes, kubelets and namespaces (CI runs as root)")
	}
	begin := time.Now()
	c := startTestCluster(t, version, peerNodes())
	k := kc{t: t, c: c, ctx: context.Background()}
	for _, n := range c.Nodes {
		k.doc("label", map[string]string{"node": n.Name})
	}
	k.run("apply", "-k", peerOverlay())
	if err := c.WaitDaemonSetReady(k.ctx, "nri-gpu", "nri-gpu", int32(len(c.Nodes)), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	k.apply(nvidiaDeviceClasses())
	nvs := map[string]*nvidiaDRA{}
	for _, n := range c.Nodes {
		start := time.Now()
		nvs[n.Name] = startNVIDIADRA(t, c, n, peerDRAOptions)
		waitNVIDIASlice(k, nvs[n.Name], peerDevices[n.Name])
		t.Logf("%s: NVIDIA's driver published its %d devices %s after its start", n.Name, peerDevices[n.Name], time.Since(start).Round(100*time.Millisecond))
	}
	t.Run("slices", func(t *testing.T) { testPeerSlices(kc{t: t, c: c, ctx: k.ctx}) })
	t.Run("demo claims", func(t *testing.T) { testPeerDemos(kc{t: t, c: c, ctx: k.ctx}) })
	t.Run("GpuConfig", func(t *testing.T) { testPeerConfigs(kc{t: t, c: c, ctx: k.ctx}) })
	t.Run("prepare and restart", func(t *testing.T) {
		testPeerLifecycle(kc{t: t, c: c, ctx: k.ctx}, func() *nvidiaDRA {
			nvs["peer-h100"].stop()
			nvs["peer-h100"] = startNVIDIADRA(t, c, c.Node("peer-h100"), peerDRAOptions)
			return nvs["peer-h100"]
		})
	})
	// Each driver's prepare and unprepare as the nodes' kubelets timed
	// them over the subtests that ran.
	for _, n := range c.Nodes {
		stats, err := kubeletDRAMetrics(k, n.Name)
		if err != nil {
			t.Errorf("node %s: the kubelet's metrics: %v", n.Name, err)
			continue
		}
		for _, d := range []string{nvidiaDriver, draDriver} {
			for _, op := range []string{"NodePrepareResources", "NodeUnprepareResources"} {
				t.Logf("%s on %s: %s: %s", d, n.Name, op, stats[d+" "+op])
			}
		}
	}
	t.Logf("TestClusterPeer: %s", time.Since(begin).Round(time.Second))
}

// driverDevices are the devices of driver's ResourceSlices of node, by
// name.
func driverDevices(k kc, driver, node string) (map[string]resourceapi.Device, error) {
	var list resourceapi.ResourceSliceList
	if err := k.c.GetJSON(k.ctx, &list, "resourceslices"); err != nil {
		return nil, err
	}
	out := map[string]resourceapi.Device{}
	for _, s := range list.Items {
		if s.Spec.Driver == driver && s.Spec.NodeName != nil && *s.Spec.NodeName == node {
			for _, d := range s.Spec.Devices {
				out[d.Name] = d
			}
		}
	}
	return out, nil
}

// testPeerSlices compares, device by device, NVIDIA's ResourceSlice and
// nri-gpu's of the same node: names, attributes (an unqualified name is
// in the publishing driver's domain), their types and values, capacities.
// Every difference must be one docs/dra.md lists with its reason, and
// every one listed must be seen.
func testPeerSlices(k kc) {
	t := k.t
	var diffs []sliceDiff
	compared := 0
	for _, n := range k.c.Nodes {
		var nv, ours map[string]resourceapi.Device
		want := peerDevices[n.Name]
		k.wait(time.Minute, "both drivers' slices of "+n.Name, func() (bool, string, error) {
			var err1, err2 error
			nv, err1 = driverDevices(k, nvidiaDriver, n.Name)
			ours, err2 = driverDevices(k, draDriver, n.Name)
			return err1 == nil && err2 == nil && len(nv) == want && len(ours) == want,
				fmt.Sprintf("NVIDIA's %d devices, nri-gpu's %d (%v %v)", len(nv), len(ours), err1, err2), nil
		})
		diffs = append(diffs, compareSlices(nv, ours)...)
		compared += len(nv)
		for driver, devs := range map[string]map[string]resourceapi.Device{nvidiaDriver: nv, draDriver: ours} {
			for _, p := range peerTopology(n, devs) {
				t.Errorf("%s on %s: %s", driver, n.Name, p)
			}
		}
	}
	known, err := knownRows(filepath.Join(repoRoot(), "docs", "dra.md"), "### Differences from NVIDIA's ResourceSlice")
	if err != nil {
		for _, d := range diffs {
			t.Logf("difference: %s (%s)", d.key, d.example)
		}
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range diffs {
		if seen[d.key] {
			continue
		}
		seen[d.key] = true
		if _, ok := known[d.key]; !ok {
			t.Errorf("a difference docs/dra.md does not list: %s (%s)", d.key, d.example)
		}
	}
	for key := range known {
		if !seen[key] {
			t.Errorf("docs/dra.md lists a difference not seen: %s", key)
		}
	}
	var keys []string
	for key := range seen {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	t.Logf("%d devices compared (each with its GPU's pcieRoot and numaNode on both); %d kinds of difference, each listed in docs/dra.md: %s", compared, len(keys), strings.Join(keys, "; "))
}

// peerTopology checks that each of devs (a GPU or a MIG device of node
// n) carries its GPU's PCIe root and NUMA node as n's sysfs has them
// (resource.kubernetes.io/pcieRoot and numaNode; a MIG device its
// parent's), so that the comparison of the two drivers' slices compares
// them rather than two absences; it returns the problems.
func peerTopology(n *harness.Node, devs map[string]resourceapi.Device) []string {
	byBus := map[string]simnode.GPU{}
	for _, g := range n.GPU.GPUs {
		byBus[strings.ToLower(g.BusID)] = g
	}
	var out []string
	for name, d := range devs {
		bus := d.Attributes["resource.kubernetes.io/pciBusID"]
		if bus.StringValue == nil {
			out = append(out, name+": no resource.kubernetes.io/pciBusID")
			continue
		}
		g, ok := byBus[strings.ToLower(*bus.StringValue)]
		if !ok {
			out = append(out, fmt.Sprintf("%s: pciBusID %s is no GPU of the node", name, *bus.StringValue))
			continue
		}
		r, num := d.Attributes["resource.kubernetes.io/pcieRoot"], d.Attributes["resource.kubernetes.io/numaNode"]
		if r.StringValue == nil || *r.StringValue != simnode.PCIeRootFor(g.BusID) {
			out = append(out, fmt.Sprintf("%s: pcieRoot %s, want %s", name, attrString(r), simnode.PCIeRootFor(g.BusID)))
		}
		if num.IntValue == nil || fmt.Sprint(*num.IntValue) != g.NUMANode {
			out = append(out, fmt.Sprintf("%s: numaNode %s, want %s", name, attrString(num), g.NUMANode))
		}
	}
	sort.Strings(out)
	return out
}

// attrString is an attribute as "<type> <value>", "none" when absent.
func attrString(a resourceapi.DeviceAttribute) string {
	typ, v := typed(a)
	if typ == "none" {
		return typ
	}
	return typ + " " + v
}

// sliceDiff is one difference between the two drivers' devices: key is
// its kind, as docs/dra.md lists it (device type, what differs), example
// one device where it was seen.
type sliceDiff struct{ key, example string }

// typed renders an attribute as its type and value.
func typed(a resourceapi.DeviceAttribute) (string, string) {
	switch {
	case a.StringValue != nil:
		return "string", *a.StringValue
	case a.VersionValue != nil:
		return "version", *a.VersionValue
	case a.IntValue != nil:
		return "int", fmt.Sprint(*a.IntValue)
	case a.BoolValue != nil:
		return "bool", fmt.Sprint(*a.BoolValue)
	}
	return "none", ""
}

// qualified is name in driver's domain when it has none.
func qualified(driver string, name resourceapi.QualifiedName) string {
	if strings.Contains(string(name), "/") {
		return string(name)
	}
	return driver + "/" + string(name)
}

// digits generalizes the numbers in a capacity's name (memorySlice3).
var digits = regexp.MustCompile(`[0-9]+$`)

// compareSlices lists the differences between NVIDIA's devices nv and
// nri-gpu's ours, one per kind (the first device it was seen on as the
// example).
func compareSlices(nv, ours map[string]resourceapi.Device) []sliceDiff {
	byKey := map[string]string{}
	add := func(key, example string) {
		if _, ok := byKey[key]; !ok {
			byKey[key] = example
		}
	}
	// kind is the device's type attribute (gpu, mig), NVIDIA's
	// unqualified or nri-gpu's qualified.
	kind := func(d resourceapi.Device) string {
		for _, q := range []resourceapi.QualifiedName{"type", nvidiaDriver + "/type"} {
			if a, ok := d.Attributes[q]; ok && a.StringValue != nil {
				return *a.StringValue
			}
		}
		return "?"
	}
	names := map[string]bool{}
	for name := range nv {
		names[name] = true
	}
	for name := range ours {
		names[name] = true
	}
	for name := range names {
		a, inNV := nv[name]
		b, inOurs := ours[name]
		switch {
		case !inOurs:
			add(fmt.Sprintf("%s device: only NVIDIA's", kind(a)), name)
			continue
		case !inNV:
			add(fmt.Sprintf("%s device: only nri-gpu's", kind(b)), name)
			continue
		}
		typ := kind(a)
		attrs := func(driver string, d resourceapi.Device) map[string]resourceapi.DeviceAttribute {
			out := map[string]resourceapi.DeviceAttribute{}
			for k, v := range d.Attributes {
				out[qualified(driver, k)] = v
			}
			return out
		}
		an, bn := attrs(nvidiaDriver, a), attrs(draDriver, b)
		for q, v := range an {
			w, ok := bn[q]
			if !ok {
				add(fmt.Sprintf("%s attribute %s: only NVIDIA's", typ, q), name)
				continue
			}
			tv, vv := typed(v)
			tw, vw := typed(w)
			switch {
			case tv != tw:
				add(fmt.Sprintf("%s attribute %s: type", typ, q), fmt.Sprintf("%s: NVIDIA's %s %q, nri-gpu's %s %q", name, tv, vv, tw, vw))
			case vv != vw:
				add(fmt.Sprintf("%s attribute %s: value", typ, q), fmt.Sprintf("%s: NVIDIA's %q, nri-gpu's %q", name, vv, vw))
			}
		}
		for q := range bn {
			if _, ok := an[q]; !ok {
				add(fmt.Sprintf("%s attribute %s: only nri-gpu's", typ, q), name)
			}
		}
		caps := func(driver string, d resourceapi.Device) map[string]resourceapi.DeviceCapacity {
			out := map[string]resourceapi.DeviceCapacity{}
			for k, v := range d.Capacity {
				out[qualified(driver, k)] = v
			}
			return out
		}
		cn, cb := caps(nvidiaDriver, a), caps(draDriver, b)
		for q, v := range cn {
			gq := digits.ReplaceAllString(q, "<N>")
			w, ok := cb[q]
			switch {
			case !ok:
				add(fmt.Sprintf("%s capacity %s: only NVIDIA's", typ, gq), name)
			case v.Value.Cmp(w.Value) != 0:
				add(fmt.Sprintf("%s capacity %s: value", typ, gq), fmt.Sprintf("%s: NVIDIA's %s, nri-gpu's %s", name, v.Value.String(), w.Value.String()))
			case (v.RequestPolicy == nil) != (w.RequestPolicy == nil):
				add(fmt.Sprintf("%s capacity %s: request policy", typ, gq), name)
			}
		}
		for q := range cb {
			if _, ok := cn[q]; !ok {
				add(fmt.Sprintf("%s capacity %s: only nri-gpu's", typ, digits.ReplaceAllString(q, "<N>")), name)
			}
		}
		if (a.AllowMultipleAllocations == nil) != (b.AllowMultipleAllocations == nil) {
			add(typ+" allowMultipleAllocations", name)
		}
		if len(a.ConsumesCounters) != len(b.ConsumesCounters) {
			add(typ+" consumesCounters", name)
		}
	}
	var out []sliceDiff
	for k, v := range byKey {
		out = append(out, sliceDiff{key: k, example: v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

// knownRow is a row of a table of docs/dra.md listing differences from
// NVIDIA's driver: | `<difference>` | <reason> |.
var knownRow = regexp.MustCompile("^\\| `([^`]+)` \\| (.+) \\|$")

// knownRows reads the table under heading of the docs file path, by
// difference (none when the section has no table); a missing heading or
// a row without a reason is an error.
func knownRows(path, heading string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	in, found := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
			in = line == heading
			found = found || in
		case in:
			if m := knownRow.FindStringSubmatch(line); m != nil {
				if strings.TrimSpace(m[2]) == "" {
					return nil, fmt.Errorf("%s: %s has no reason", path, m[1])
				}
				out[m[1]] = m[2]
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: no section %q", path, heading)
	}
	return out, sc.Err()
}
