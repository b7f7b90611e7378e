// CI's smoke (make e2e-scale) builds without this file (-tags nobench):
// BenchmarkAllocate needs the scheduler's CEL and allocator, about 100
// packages more to compile.

//go:build !nobench

package scale

import (
	"context"
	"fmt"
	"math"
	"os"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// allocatorFeatures are the DRA features kube-scheduler 1.37 allocates
// with by default (its AllocatorFeatures with 1.37's feature gate
// defaults): with consumable capacity and device binding conditions it
// runs the structured package's "incubating" allocator.
var allocatorFeatures = structured.Features{AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	DeviceBindingAndStatus: true, ConsumableCapacity: true, FractionalCapacityRange: true}

// allocNodes is how many nodes the allocator bench's cluster has: every
// one of them is a node the scheduler's DRA Filter tries for a pod (it
// tries them all up to 100 nodes; of more, a share, at least 100).
const allocNodes = 100

type classList []*resourceapi.DeviceClass

func (c classList) List() ([]*resourceapi.DeviceClass, error) { return c, nil }

func (c classList) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, x := range c {
		if x.Name == name {
			return x, nil
		}
	}
	return nil, fmt.Errorf("no DeviceClass %s", name)
}

// allocatedState is what the scheduler knows allocated at fill frac of
// shape s's variant v on nodes (as Fill allocates it).
func allocatedState(s *Shape, v Variant, nodes []string, frac float64) structured.AllocatedState {
	st := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}
	per := s.DeviceCount(v)
	total := int(math.Round(frac * float64(per*len(nodes))))
	for i, node := range nodes {
		devs := s.Devices(v, i)
		if v == Shares {
			if frac == 0 {
				continue
			}
			share := shareOf(s, frac)
			for _, d := range devs {
				id := structured.MakeDeviceID(s.Driver, node, d.Name)
				uid := types.UID(uuid.NewUUID())
				st.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, &uid))
				st.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, map[resourceapi.QualifiedName]resource.Quantity{s.MemoryCapacity: share}))
			}
			continue
		}
		k := total / len(nodes)
		if i < total%len(nodes) {
			k++
		}
		for _, d := range devs[:min(k, per)] {
			st.AllocatedDevices.Insert(structured.MakeDeviceID(s.Driver, node, d.Name))
		}
	}
	return st
}

// BenchmarkAllocate is the scheduler's DRA work for one claim pod on a
// cluster of allocNodes nodes: what kube-scheduler 1.37's DynamicResources
// plugin runs, the structured allocator of k8s.io/dynamic-resource-allocation
// v0.37.2 with 1.37's default features — an allocator over every node's
// slice (PreFilter) and Allocate of the pod's claim on each node (Filter)
// — for each shape, claim kind and fill, side by side in one process,
// without the API server, the informers or the machine's other load.
// op is one pod; cpu-µs/op is the CPU time it took (this process's, the
// Go runtime's included), steadier than ns/op on a machine other work
// loads; pods/cpu-s is the rate that allows on one core.
func BenchmarkAllocate(b *testing.B) {
	inv := discover(b)
	nri, err := NRIGPU(inv)
	if err != nil {
		b.Fatal(err)
	}
	// NVIDIA's real driver's slices where CapturedEnv names a capture
	// (TestSchedulerScale writes one to $NRI_GPU_SCALE_OUT/nvidia-slices).
	nv := NVIDIA(inv)
	if dir := os.Getenv(CapturedEnv); dir != "" {
		if err := Captured(nv, dir); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("shape %s: %s", nv.Name, nv.Source)
	var nodes []string
	var nodeObjs []*v1.Node
	for i := range allocNodes {
		n := fmt.Sprintf("gpu-%05d", i)
		nodes = append(nodes, n)
		nodeObjs = append(nodeObjs, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/hostname": n}}})
	}
	for _, f := range allFeatures {
		for _, fill := range []float64{0, 0.5, 0.9} {
			for _, s := range []*Shape{nri, nv} {
				v := f.Variant()
				var slices []*resourceapi.ResourceSlice
				for i, n := range nodes {
					slices = append(slices, slice(s, v, i, n))
				}
				var cls classList
				for i := range s.Classes {
					cls = append(cls, &s.Classes[i])
				}
				claim := claimOf(s, f, "bench")
				claim.UID = "bench-uid"
				claim.Namespace = "bench"
				state := allocatedState(s, v, nodes, fill)
				cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
				b.Run(fmt.Sprintf("%s/fill=%.0f%%/%s", f, fill*100, s.Name), func(b *testing.B) {
					ctx := context.Background()
					cpu0 := processCPUSelf()
					for b.Loop() {
						a, err := structured.NewAllocator(ctx, allocatorFeatures, state, cls, slices, cache)
						if err != nil {
							b.Fatal(err)
						}
						ok := 0
						for _, node := range nodeObjs {
							res, err := a.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
							if err != nil {
								b.Fatal(err)
							}
							if len(res) == 1 {
								ok++
							}
						}
						if ok == 0 {
							b.Fatalf("no node can allocate the claim")
						}
					}
					cpu := (processCPUSelf() - cpu0) / time.Duration(b.N)
					b.ReportMetric(float64(cpu.Microseconds()), "cpu-µs/op")
					b.ReportMetric(float64(time.Second)/float64(cpu), "pods/cpu-s")
				})
			}
		}
	}
}

// processCPUSelf is the CPU time this process has had.
func processCPUSelf() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
