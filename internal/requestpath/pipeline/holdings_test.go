package pipeline

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
)

func uuid(i int) string { return fmt.Sprintf("GPU-%08x-558d-fb20-8eca-25de8b98f5a7", i) }

func TestHoldings(t *testing.T) {
	s := benchSnapshot()
	pods := []*api.PodSandbox{{Id: "p1", Name: "one", Namespace: "ns"}, {Id: "p2", Name: "two", Namespace: "ns"}}
	rec := func(mode string, gpus ...int) map[string]string {
		r := alloc.Record{Mode: mode}
		for _, g := range gpus {
			r.GPUs = append(r.GPUs, uuid(g))
		}
		return map[string]string{alloc.Annotation: r.Encode()}
	}
	// nodes are the device nodes nri-gpu gave a container for the GPUs
	// of its record.
	nodes := func(gpus ...int) *api.LinuxContainer {
		l := &api.LinuxContainer{}
		for _, g := range gpus {
			l.Devices = append(l.Devices, &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", g), Type: "c", Major: 195, Minor: int64(g)})
		}
		return l
	}
	running := api.ContainerState_CONTAINER_RUNNING
	ctrs := []*api.Container{
		{Id: "a", PodSandboxId: "p1", Name: "a", State: running, Annotations: rec("exclusive", 0, 1), Linux: nodes(0, 1)},
		{Id: "b", PodSandboxId: "p1", Name: "b", State: api.ContainerState_CONTAINER_CREATED, Annotations: rec("shared", 2), Linux: nodes(2)},
		// Stopped: holds nothing.
		{Id: "c", PodSandboxId: "p1", Name: "c", State: api.ContainerState_CONTAINER_STOPPED, Annotations: rec("exclusive", 3)},
		// Made without nri-gpu: a GPU device node in its spec, and CDI
		// devices by index and UUID; other devices do not count.
		{Id: "d", PodSandboxId: "p2", Name: "d", State: running, Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{
			{Path: "/dev/nvidia4", Type: "c", Major: 195, Minor: 4},
			{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
			{Path: "/dev/null", Type: "c", Major: 1, Minor: 3},
		}}},
		{Id: "e", PodSandboxId: "p2", Name: "e", State: running, CDIDevices: []*api.CDIDevice{
			{Name: "nvidia.com/gpu=5"}, {Name: "nvidia.com/gpu=" + strings.ToUpper(uuid(6))}, {Name: "vendor.com/fpga=0"},
		}},
		{Id: "f", PodSandboxId: "p2", Name: "f", State: running, CDIDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=all"}}},
		// Broken or unknown records, unknown CDI devices.
		{Id: "g", PodSandboxId: "p2", Name: "g", State: running, Annotations: map[string]string{alloc.Annotation: "0,1"}},
		{Id: "h", PodSandboxId: "p2", Name: "h", State: running, Annotations: map[string]string{alloc.Annotation: `{"mode":"shared","gpus":["GPU-gone"]}`}},
		{Id: "i", PodSandboxId: "p2", Name: "i", State: running, CDIDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=0:1"}}},
		// An env-only container (the image's NVIDIA_VISIBLE_DEVICES, no
		// devices) holds nothing.
		{Id: "j", PodSandboxId: "p2", Name: "j", State: running, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
		// Forged records (a pod annotation the runtime passed on): no
		// device node, so nothing held; a record naming more than the
		// container's nodes is not counted either, and the container
		// holds what its nodes say, in the node's mode.
		{Id: "k", PodSandboxId: "p2", Name: "k", State: running, Annotations: rec("exclusive", 0, 1, 2, 3, 4, 5, 6, 7, 0, 1)},
		{Id: "l", PodSandboxId: "p2", Name: "l", State: running, Annotations: rec("shared", 7, 3), Linux: nodes(7)},
		// A record's GPU counts by the node's number, not its path.
		{Id: "m", PodSandboxId: "p2", Name: "m", State: running, Annotations: rec("shared", 3), Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{
			{Path: "/dev/nvidia3", Type: "c", Major: 1, Minor: 3},
		}}},
	}
	hs, warnings := holdings(adjust.Prepare(s, layout), sharing.Exclusive, pods, ctrs)
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	want := []alloc.Holding{
		{Holder: alloc.Holder{ID: "a", PodID: "p1", Namespace: "ns", Pod: "one", Container: "a"}, Mode: sharing.Exclusive, GPUs: []int{0, 1}},
		{Holder: alloc.Holder{ID: "b", PodID: "p1", Namespace: "ns", Pod: "one", Container: "b"}, Mode: sharing.Shared, GPUs: []int{2}},
		{Holder: alloc.Holder{ID: "d", PodID: "p2", Namespace: "ns", Pod: "two", Container: "d"}, Mode: sharing.Exclusive, GPUs: []int{4}, Runtime: true},
		{Holder: alloc.Holder{ID: "e", PodID: "p2", Namespace: "ns", Pod: "two", Container: "e"}, Mode: sharing.Exclusive, GPUs: []int{5, 6}, Runtime: true},
		{Holder: alloc.Holder{ID: "f", PodID: "p2", Namespace: "ns", Pod: "two", Container: "f"}, Mode: sharing.Exclusive, GPUs: all, Runtime: true},
		{Holder: alloc.Holder{ID: "l", PodID: "p2", Namespace: "ns", Pod: "two", Container: "l"}, Mode: sharing.Exclusive, GPUs: []int{7}, Runtime: true},
	}
	if diff := cmp.Diff(want, hs); diff != "" {
		t.Errorf("holdings (-want +got):\n%s", diff)
	}
	wantWarnings := []string{
		`ns/two/g: annotation nri-gpu.dev/allocation: "0,1": invalid character ',' after top-level value`,
		`ns/two/h: holds GPU GPU-gone, which the inventory does not have`,
		`ns/two/i: CDI device nvidia.com/gpu=0:1 names no GPU or MIG device of the inventory`,
		`ns/two/k: annotation nri-gpu.dev/allocation names GPUs whose device nodes the container does not have (` + strings.Join([]string{uuid(0), uuid(1), uuid(2), uuid(3), uuid(4), uuid(5), uuid(6), uuid(7)}, ", ") + ` and 2 more): not counted`,
		`ns/two/l: annotation nri-gpu.dev/allocation names GPUs whose device nodes the container does not have (` + uuid(3) + `): not counted`,
		`ns/two/m: annotation nri-gpu.dev/allocation names GPUs whose device nodes the container does not have (` + uuid(3) + `): not counted`,
	}
	if diff := cmp.Diff(wantWarnings, warnings); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}

// TestHoldingsRecordVersions: at Synchronize, a record without a version
// (copied verbatim from what commit e1d7dc6 wrote, before records had
// one) holds its GPUs as before, a container's or its pod's, so a node
// upgraded from there keeps its holdings; a record of a newer version is
// not read: it books nothing, a warning says why, and the container holds
// what its device nodes show, as one made without nri-gpu.
func TestHoldingsRecordVersions(t *testing.T) {
	src := adjust.Prepare(benchSnapshot(), layout)
	pod := &api.PodSandbox{Id: "p", Name: "p", Namespace: "ns"}
	nodes := func(gpus ...int) *api.LinuxContainer {
		l := &api.LinuxContainer{}
		for _, g := range gpus {
			l.Devices = append(l.Devices, &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", g), Type: "c", Major: 195, Minor: int64(g)})
		}
		return l
	}
	ctr := func(rec string, l *api.LinuxContainer) *api.Container {
		return &api.Container{Id: "c", PodSandboxId: "p", Name: "c", State: api.ContainerState_CONTAINER_RUNNING,
			Annotations: map[string]string{alloc.Annotation: rec}, Linux: l}
	}
	holder := alloc.Holder{ID: "c", PodID: "p", Namespace: "ns", Pod: "p", Container: "c"}
	const newer = `ns/p/c: annotation nri-gpu.dev/allocation: record version 2, which this nri-gpu cannot read (it reads versions up to 1; a newer nri-gpu wrote it?)`
	for _, tc := range []struct {
		name     string
		ctr      *api.Container
		want     []alloc.Holding
		warnings []string
	}{
		{"unversioned, the container's",
			ctr(`{"mode":"shared","gpus":["GPU-00000001-558d-fb20-8eca-25de8b98f5a7","GPU-00000003-558d-fb20-8eca-25de8b98f5a7"]}`, nodes(1, 3)),
			[]alloc.Holding{{Holder: holder, Mode: sharing.Shared, GPUs: []int{1, 3}}}, nil},
		{"unversioned, the pod's",
			ctr(`{"mode":"shared","gpus":["GPU-00000001-558d-fb20-8eca-25de8b98f5a7","GPU-00000003-558d-fb20-8eca-25de8b98f5a7"],"pod":true}`, nodes(1, 3)),
			[]alloc.Holding{{Holder: alloc.PodHolder("p", "ns", "p"), Mode: sharing.Shared, GPUs: []int{1, 3}, Members: []string{"c"}}}, nil},
		{"version 1", ctr(alloc.Record{Mode: "shared", GPUs: []string{uuid(1)}}.Encode(), nodes(1)),
			[]alloc.Holding{{Holder: holder, Mode: sharing.Shared, GPUs: []int{1}}}, nil},
		{"newer version, with the device nodes",
			ctr(`{"version":2,"mode":"shared","gpus":["GPU-00000001-558d-fb20-8eca-25de8b98f5a7"],"pod":true}`, nodes(1)),
			[]alloc.Holding{{Holder: holder, Mode: sharing.Exclusive, GPUs: []int{1}, Runtime: true}}, []string{newer}},
		{"newer version, no device nodes",
			ctr(`{"version":2,"mode":"shared","gpus":["GPU-00000001-558d-fb20-8eca-25de8b98f5a7"]}`, nil),
			nil, []string{newer}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs, warnings := holdings(src, sharing.Exclusive, []*api.PodSandbox{pod}, []*api.Container{tc.ctr})
			if d := cmp.Diff(tc.want, hs); d != "" {
				t.Errorf("holdings (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.warnings, warnings); d != "" {
				t.Errorf("warnings (-want +got):\n%s", d)
			}
		})
	}
}
