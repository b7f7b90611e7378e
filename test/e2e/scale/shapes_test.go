package scale

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
)

// unqualified is d with its attribute and capacity names in NVIDIA's
// domain written unqualified, as NVIDIA's driver writes them, and its
// memory's request policy left out (the shapes' shares policies differ:
// TestShapesShares).
func unqualified(d resourceapi.Device) resourceapi.Device {
	d = *d.DeepCopy()
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for n, a := range d.Attributes {
		attrs[resourceapi.QualifiedName(strings.TrimPrefix(string(n), "gpu.nvidia.com/"))] = a
	}
	caps := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	for n, c := range d.Capacity {
		c.RequestPolicy = nil
		caps[resourceapi.QualifiedName(strings.TrimPrefix(string(n), "gpu.nvidia.com/"))] = c
	}
	d.Attributes, d.Capacity = attrs, caps
	d.AllowMultipleAllocations = nil
	return d
}

func byName(devs []resourceapi.Device) map[string]resourceapi.Device {
	m := map[string]resourceapi.Device{}
	for _, d := range devs {
		m[d.Name] = unqualified(d)
	}
	return m
}

// TestShapes compares, device by device, nri-gpu's published devices of
// the simulated node (its own publishing code) with NVIDIA's shape of the
// same node as NVIDIA's source publishes it: the same names, attributes
// and capacities, NVIDIA's in its driver's domain unqualified, nri-gpu's
// qualified in it; the node's UUIDs are made unique per node.
func TestShapes(t *testing.T) {
	inv := discover(t)
	nri, err := NRIGPU(inv)
	if err != nil {
		t.Fatal(err)
	}
	nv := NVIDIA(inv)
	for v, want := range map[Variant]int{Whole: 8, Shares: 8, MIG: 56} {
		if nri.DeviceCount(v) != want || nv.DeviceCount(v) != want {
			t.Errorf("%s: nri-gpu %d devices, NVIDIA %d, want %d", v, nri.DeviceCount(v), nv.DeviceCount(v), want)
		}
		// Both read the simulated node's sysfs for the PCIe root, as both
		// drivers do on a node (NVIDIA's real one publishes it).
		for _, s := range []*Shape{nri, nv} {
			for _, d := range s.Devices(v, 3) {
				if _, ok := d.Attributes["resource.kubernetes.io/pcieRoot"]; !ok {
					t.Errorf("%s: %s %s: no resource.kubernetes.io/pcieRoot", v, s.Name, d.Name)
				}
			}
		}
		if diff := cmp.Diff(byName(nv.Devices(v, 3)), byName(nri.Devices(v, 3))); diff != "" {
			t.Errorf("%s: node 3's devices (-NVIDIA +nri-gpu):\n%s", v, diff)
		}
	}
	a, b := nri.Devices(Whole, 1)[0], nri.Devices(Whole, 2)[0]
	ua, ub := *a.Attributes["gpu.nvidia.com/uuid"].StringValue, *b.Attributes["gpu.nvidia.com/uuid"].StringValue
	if ua == ub || len(ua) != len(ub) || ua[:len(ua)-12] != ub[:len(ub)-12] {
		t.Errorf("node 1's and node 2's first GPU: UUIDs %s and %s, want the same form, differing", ua, ub)
	}
	if m := nri.Devices(MIG, 1)[0]; *m.Attributes["gpu.nvidia.com/parentUUID"].StringValue == *nri.Devices(MIG, 2)[0].Attributes["gpu.nvidia.com/parentUUID"].StringValue {
		t.Errorf("MIG parent UUIDs not made unique per node")
	}
}

// TestShapesShares: both shapes' GPUs shared by memory take a claim's
// memory request from their smallest share up to the whole GPU, defaulting
// to the whole GPU; nri-gpu's smallest share is dra.memoryShares.minimum
// (1Gi), NVIDIA's 1Mi.
func TestShapesShares(t *testing.T) {
	inv := discover(t)
	nri, err := NRIGPU(inv)
	if err != nil {
		t.Fatal(err)
	}
	nv := NVIDIA(inv)
	for _, s := range []*Shape{nri, nv} {
		d := s.Devices(Shares, 0)[0]
		c := d.Capacity[s.MemoryCapacity]
		p := c.RequestPolicy
		if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations || p == nil || p.Default == nil || p.Default.Cmp(c.Value) != 0 || p.ValidRange == nil {
			t.Fatalf("%s: %s: %+v, want shareable by %s, default the whole GPU", s.Name, d.Name, d, s.MemoryCapacity)
		}
		if s.GPUMemory() != c.Value.Value() {
			t.Errorf("%s: GPUMemory %d, capacity %s", s.Name, s.GPUMemory(), c.Value.String())
		}
	}
	if got := nri.Devices(Shares, 0)[0].Capacity[nri.MemoryCapacity].RequestPolicy.ValidRange.Min.String(); got != "1Gi" {
		t.Errorf("nri-gpu's smallest share %s, want 1Gi", got)
	}
}

// TestCaptured: slices captured from NVIDIA's real driver replace the
// variants they are given for.
func TestCaptured(t *testing.T) {
	inv := discover(t)
	nv := NVIDIA(inv)
	dir := t.TempDir()
	list := `{"kind":"ResourceSliceList","apiVersion":"resource.k8s.io/v1","items":[` +
		`{"spec":{"driver":"other.example.com","pool":{"name":"n1"},"devices":[{"name":"x"}]}},` +
		`{"spec":{"driver":"gpu.nvidia.com","pool":{"name":"n1","generation":1,"resourceSliceCount":1},"nodeName":"n1",` +
		`"devices":[{"name":"gpu-0","attributes":{"type":{"string":"gpu"},"uuid":{"string":"GPU-12345678-1234-1234-1234-123456789abc"}},"capacity":{"memory":{"value":"80Gi"}}}]}}]}`
	if err := os.WriteFile(filepath.Join(dir, "gpu.json"), []byte(list), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Captured(nv, dir); err != nil {
		t.Fatal(err)
	}
	got := nv.Devices(Whole, 5)
	if len(got) != 1 || got[0].Name != "gpu-0" || *got[0].Attributes["uuid"].StringValue != "GPU-12345678-1234-1234-1234-000005789abc" {
		t.Errorf("captured whole GPUs: %+v", got)
	}
	if nv.DeviceCount(MIG) != 56 || !strings.Contains(nv.Source, "captured") {
		t.Errorf("MIG devices %d (want NVIDIA's source's 56), source %q", nv.DeviceCount(MIG), nv.Source)
	}
}

// discover is Discover, once per test binary (its directory removed by
// TestMain), skipped without root.
func discover(t testing.TB) *Inventory {
	t.Helper()
	inv, err := sharedDiscover()
	if err != nil {
		t.Fatal(err)
	}
	if inv == nil {
		t.Skip("needs root: the simulated nodes have real device nodes (mknod); CI runs as root")
	}
	return inv
}

// sharedDiscover is Discover once per test binary; nil without root.
func sharedDiscover() (*Inventory, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	invOnce.Do(func() {
		invDir, invErr = os.MkdirTemp("", "nri-gpu-scale-")
		if invErr == nil {
			sharedInv, invErr = Discover(invDir)
		}
	})
	return sharedInv, invErr
}

var (
	invOnce   sync.Once
	sharedInv *Inventory
	invDir    string
	invErr    error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if invDir != "" {
		_ = os.RemoveAll(invDir)
	}
	os.Exit(code)
}
