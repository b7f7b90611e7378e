package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// simulatedMaker opens the simulated NVML of a one-H100 node in MIG mode
// through the real binding, and returns it as a MIGMaker with the GPU's
// UUID (reading profiles needs no root).
func simulatedMaker(t *testing.T) (nvml.MIGMaker, string) {
	t.Helper()
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.WriteNVMLState(simnode.NVMLState{GPUs: []simnode.NVMLGPU{{MIGMode: 1}}}); err != nil {
		t.Fatal(err)
	}
	lib, err := nvml.Open(filepath.Join(n.Root, n.LibDir, "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Close() })
	return lib.(nvml.MIGMaker), n.GPUs[0].UUID
}

// partitionedResources publishes testSnapshot with GPU 1 (in MIG mode)
// in dra.dynamicMIG, its profiles from the simulated NVML; unhealthy are
// the node's unhealthy devices.
func partitionedResources(t *testing.T, unhealthy ...string) resourceslice.DriverResources {
	t.Helper()
	d, st := partitionedDriver(t, unhealthy...)
	return d.resources(st)
}

// partitionedDriver is partitionedResources's driver and state.
func partitionedDriver(t *testing.T, unhealthy ...string) (*Driver, *node.State) {
	t.Helper()
	mk, uuid := simulatedMaker(t)
	snap := testSnapshot()
	snap.GPUs[1].UUID = uuid
	for i := range snap.MIG {
		snap.MIG[i].ParentUUID = uuid
	}
	cfg := draConfig()
	cfg.DRA.DynamicMIG.Devices = []string{"1"}
	d := &Driver{nodeName: testNode, roots: map[string]string{}, log: quietLog().WithField("test", t.Name()), opts: Options{MIG: mk}}
	st := stateOf(snap, cfg)
	if len(unhealthy) > 0 {
		st.Unhealthy = map[string]string{}
		for _, u := range unhealthy {
			st.Unhealthy[u] = "XID 79 (GPU has fallen off the bus)"
		}
	}
	return d, st
}

// TestPartitionsWithoutTheGate: an API server without
// DRAPartitionableDevices (1.34) drops the counter sets; the dynamic GPU
// is then left out of the slices altogether, the other GPUs stay.
func TestPartitionsWithoutTheGate(t *testing.T) {
	d, st := partitionedDriver(t)
	sl := d.resources(st).Pools[testNode].Slices
	desired := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{SharedCounters: sl[0].SharedCounters}}
	actual := &resourceapi.ResourceSlice{}
	d.HandleError(context.Background(), &resourceslice.DroppedFieldsError{PoolName: testNode, DesiredSlice: desired, ActualSlice: actual}, "publish")
	if !d.noPartitions.Load() {
		t.Fatalf("the dropped counter sets were not taken as a missing %s", PartitionableGate)
	}
	again := d.resources(st).Pools[testNode].Slices
	var names []string
	for _, s := range again {
		if len(s.SharedCounters) > 0 {
			t.Errorf("counter sets published: %v", s.SharedCounters)
		}
		for _, dv := range s.Devices {
			names = append(names, dv.Name)
		}
	}
	if !slices.Equal(names, []string{"gpu-0", "gpu-2"}) {
		t.Errorf("published %v, want gpu-0 and gpu-2 only", names)
	}
}

// TestPartitionHealth: health stays on for a dra.dynamicMIG GPU: an XID
// on it taints the GPU and every placement, as NVIDIA's driver taints
// (its DynamicMIG gate cannot be combined with its health checks).
func TestPartitionHealth(t *testing.T) {
	_, uuid := simulatedMaker(t) // simnode's UUIDs follow the bus id: the same GPU as partitionedResources's
	res := partitionedResources(t, uuid)
	devs := res.Pools[testNode].Slices[1].Devices
	for _, d := range devs {
		if len(d.Taints) != 1 || d.Taints[0].Key != TaintXID || d.Taints[0].Value != "79" {
			t.Errorf("%s: taints %v, want the XID's", d.Name, d.Taints)
		}
	}
	if len(devs) != 26 {
		t.Errorf("%d devices", len(devs))
	}
}

// counterFits reports whether devs can be allocated together from set:
// what they consume of each counter adds up to no more than it has.
func counterFits(set resourceapi.CounterSet, devs ...resourceapi.Device) bool {
	used := map[string]int64{}
	for _, d := range devs {
		for _, c := range d.ConsumesCounters {
			for k, v := range c.Counters {
				used[k] += v.Value.Value()
			}
		}
	}
	for k, v := range used {
		if have, ok := set.Counters[k]; !ok || v > have.Value.Value() {
			return false
		}
	}
	return true
}

// TestPartitionSlices: a GPU of dra.dynamicMIG is published as NVIDIA's
// DynamicMIG publishes it: a slice of its counter set alone, then the GPU
// and every placement of every profile consuming it; its MIG devices that
// exist are not published (their placements are); the other GPUs as
// before. The counters keep apart exactly what the GPU cannot hold at
// once: the GPU whole and any MIG device, placements sharing a memory
// slice, two 1g.10gb+me.
func TestPartitionSlices(t *testing.T) {
	res := partitionedResources(t)
	sl := res.Pools[testNode].Slices
	if len(sl) != 3 {
		t.Fatalf("%d slices, want 3 (counters, GPU 1's devices, the others)", len(sl))
	}
	if len(sl[0].Devices) != 0 || len(sl[0].SharedCounters) != 1 {
		t.Fatalf("first slice: %d devices, %d counter sets; want counters alone", len(sl[0].Devices), len(sl[0].SharedCounters))
	}
	set := sl[0].SharedCounters[0]
	want := map[string]int64{"multiprocessors": 132, "copy-engines": 8, "decoders": 7, "encoders": 0, "jpeg-engines": 7, "ofa-engines": 1, "memory": 81152 << 20}
	for i := 0; i < 8; i++ {
		want[memSliceCounter(i)] = 1
	}
	got := map[string]int64{}
	for k, v := range set.Counters {
		got[k] = v.Value.Value()
	}
	if set.Name != "gpu-1-counter-set" || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("counter set %s %v, want gpu-1-counter-set %v", set.Name, got, want)
	}
	devs := sl[1].Devices
	var names []string
	byName := map[string]resourceapi.Device{}
	for _, d := range devs {
		names = append(names, d.Name)
		byName[d.Name] = d
		if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != set.Name {
			t.Errorf("%s consumes %v", d.Name, d.ConsumesCounters)
		}
	}
	var wantNames []string
	for _, p := range []struct {
		name   string
		id     int
		starts []int
	}{{"1g10gb", 19, []int{0, 1, 2, 3, 4, 5, 6}}, {"2g20gb", 14, []int{0, 2, 4}}, {"3g40gb", 9, []int{0, 4}}, {"4g40gb", 5, []int{0}},
		{"7g80gb", 0, []int{0}}, {"1g10gb-me", 20, []int{0, 1, 2, 3, 4, 5, 6}}, {"1g20gb", 15, []int{0, 2, 4, 6}}} {
		for _, s := range p.starts {
			wantNames = append(wantNames, fmt.Sprintf("gpu-1-mig-%s-%d-%d", p.name, p.id, s))
		}
	}
	wantNames = append(wantNames, "gpu-1")
	sort.Strings(names)
	sort.Strings(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Errorf("GPU 1's devices\n%v\nwant\n%v", names, wantNames)
	}
	if a := byName["gpu-1-mig-3g40gb-9-4"].Attributes; *a["gpu.nvidia.com/profile"].StringValue != "3g.40gb" || *a["gpu.nvidia.com/type"].StringValue != "mig" ||
		*a["gpu.nvidia.com/parentUUID"].StringValue == "" || a["gpu.nvidia.com/uuid"].StringValue != nil {
		t.Errorf("gpu-1-mig-3g40gb-9-4's attributes: %v", a)
	}
	var others []string
	for _, d := range sl[2].Devices {
		others = append(others, d.Name)
	}
	if !slices.Equal(others, []string{"gpu-0", "gpu-2"}) {
		t.Errorf("the other slice: %v, want gpu-0 and gpu-2 (GPU 1's existing MIG devices are its placements)", others)
	}
	// Every pair: together exactly when NVML could make both.
	for _, a := range devs {
		for _, b := range devs {
			if a.Name >= b.Name {
				continue
			}
			ok := a.Name != "gpu-1" && b.Name != "gpu-1" && !memOverlap(t, a.Name, b.Name) &&
				(!isMe(a.Name) || !isMe(b.Name))
			if counterFits(set, a, b) != ok {
				t.Errorf("%s with %s: counters allow %v, NVML's rules %v", a.Name, b.Name, !ok, ok)
			}
		}
	}
	// Seven 1g.10gb fit; an eighth device of any kind does not.
	var seven []resourceapi.Device
	for s := 0; s < 7; s++ {
		seven = append(seven, byName[fmt.Sprintf("gpu-1-mig-1g10gb-19-%d", s)])
	}
	if !counterFits(set, seven...) {
		t.Error("seven 1g.10gb do not fit")
	}
	if counterFits(set, append(seven, byName["gpu-1-mig-1g20gb-15-6"])...) {
		t.Error("seven 1g.10gb and a 1g.20gb fit")
	}
}

// placementOf reads a partition's placement from its name.
func placementOf(t *testing.T, name string) (start, size int) {
	m := partitionNameRE.FindStringSubmatch(name)
	if m == nil {
		t.Fatalf("%q is no partition name", name)
	}
	var id int
	fmt.Sscan(m[2], &id)
	fmt.Sscan(m[3], &start)
	return start, map[int]int{19: 1, 20: 1, 15: 2, 14: 2, 9: 4, 5: 4, 0: 8}[id]
}

func memOverlap(t *testing.T, a, b string) bool {
	sa, na := placementOf(t, a)
	sb, nb := placementOf(t, b)
	return sa < sb+nb && sb < sa+na
}

func isMe(name string) bool {
	m := partitionNameRE.FindStringSubmatch(name)
	return m != nil && m[2] == "20"
}

// TestPartitionSliceSize measures the ResourceSlices' size, as JSON (what
// the API server stores), of one H100 published whole and MIG devices
// made on demand (its counter set's slice and its devices' slice), against
// the same GPU published whole alone. docs/benchmarks.md has the figures.
func TestPartitionSliceSize(t *testing.T) {
	res := partitionedResources(t)
	sl := res.Pools[testNode].Slices
	size := func(s resourceslice.Slice) int {
		rs := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.nri-gpu.dev", NodeName: &[]string{testNode}[0],
			Pool: resourceapi.ResourcePool{Name: testNode, ResourceSliceCount: 3}, Devices: s.Devices, SharedCounters: s.SharedCounters}}
		b, err := json.Marshal(rs)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	dynamic := size(sl[0]) + size(sl[1])
	whole := size(resourceslice.Slice{Devices: sl[2].Devices[:1]})
	empty := size(resourceslice.Slice{})
	t.Logf("one H100 as JSON: whole %d bytes; whole and %d MIG placements with counters %d bytes (counter slice %d, devices %d; an empty slice %d)",
		whole-empty, len(sl[1].Devices)-1, dynamic-2*empty, size(sl[0])-empty, size(sl[1])-empty, empty)
	if dynamic <= whole || dynamic > 1<<20 {
		t.Errorf("sizes: whole %d, dynamic %d", whole, dynamic)
	}
}
