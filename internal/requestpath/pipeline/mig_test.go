package pipeline

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// migUUID is the UUID of MIG device mig of GPU gpu in
// simnode.MemoryMIGSnapshot.
func migUUID(s *inventory.Snapshot, gpu, mig int) string {
	for _, m := range s.MIG {
		if m.Parent == gpu && m.Index == mig {
			return m.UUID
		}
	}
	panic("no such MIG device")
}

func capNode(minor int) string { return fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor) }

// TestMIGRequestForms: every request source names MIG devices by
// MIG-<uuid> or <gpu>:<mig>; the container gets its parent's node once,
// the GPU and compute instance's capability nodes, the control nodes, and
// NVIDIA_VISIBLE_DEVICES names the MIG devices.
func TestMIGRequestForms(t *testing.T) {
	s := simnode.MemoryMIGSnapshot()
	u01, u03, u13 := migUUID(s, 0, 1), migUUID(s, 0, 3), migUUID(s, 1, 3)
	// GPU 0 (minor 0): GI 8 and 10 for 0:1 and 0:3; GPU 1 (minor 1): GI 13 for 1:3.
	want01 := []string{"/dev/nvidia0", capNode(simnode.GIMinor(0, 8)), capNode(simnode.CIMinor(0, 8, 0))}
	want03 := []string{capNode(simnode.GIMinor(0, 10)), capNode(simnode.CIMinor(0, 10, 0))}
	want13 := []string{"/dev/nvidia1", capNode(simnode.GIMinor(1, 13)), capNode(simnode.CIMinor(1, 13, 0))}
	control := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
	mounts := func(ids ...string) []*api.Mount {
		var ms []*api.Mount
		for _, id := range ids {
			ms = append(ms, &api.Mount{Source: "/dev/null", Destination: "/var/run/nvidia-container-devices/" + id})
		}
		return ms
	}
	// The NVIDIA device plugin passes the MIG device's nodes with
	// PASS_DEVICE_SPECS=true, as the volume-mount list requires.
	specs := &api.LinuxContainer{Devices: []*api.LinuxDevice{
		{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0},
		{Path: capNode(simnode.GIMinor(0, 8)), Type: "c", Major: simnode.MemoryCapsMajor, Minor: int64(simnode.GIMinor(0, 8))},
		{Path: capNode(simnode.CIMinor(0, 8, 0)), Type: "c", Major: simnode.MemoryCapsMajor, Minor: int64(simnode.CIMinor(0, 8, 0))},
	}}
	for _, tc := range []struct {
		name    string
		pod     map[string]string
		ctr     *api.Container
		devices []string
		visible string
	}{
		{"annotation MIG uuid", map[string]string{"gpus.nri-gpu.dev/container.c": "device=" + strings.ToLower(u01)}, &api.Container{Name: "c"},
			slices.Concat(want01, control), u01},
		{"annotation pairs", map[string]string{"gpus.nri-gpu.dev/container.c": `"device=0:1,0:3,1:3"`}, &api.Container{Name: "c"},
			slices.Concat(want01, want03, want13, control), u01 + "," + u03 + "," + u13},
		{"env pair", nil, &api.Container{Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=1:3"}}, slices.Concat(want13, control), u13},
		{"env uuid", nil, &api.Container{Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=" + u01 + ",0:3"}}, slices.Concat(want01, want03, control), u01 + "," + u03},
		{"cdi pair", map[string]string{"nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=0:1"}, &api.Container{Name: "c"}, slices.Concat(want01, control), u01},
		{"cdi uuid", map[string]string{"nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=" + u13}, &api.Container{Name: "c"}, slices.Concat(want13, control), u13},
		{"volume mounts", nil, &api.Container{Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"}, Mounts: mounts(u01), Linux: specs},
			control, u01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adj, _, err := handle(adjust.Prepare(s, layout), tableFor(s), sharing.Shared, &api.PodSandbox{Name: "p", Namespace: "ns", Annotations: tc.pod}, tc.ctr)
			if err != nil {
				t.Fatal(err)
			}
			got := devicePaths(adj)
			if !slices.Equal(got, tc.devices) {
				t.Errorf("devices %q, want %q", got, tc.devices)
			}
			if v := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; v != tc.visible {
				t.Errorf("NVIDIA_VISIBLE_DEVICES=%s, want %s", v, tc.visible)
			}
		})
	}
}

// TestMIGParentNotWhole: a MIG-enabled GPU is not handed out whole, by
// name or by count; a MIG device that does not exist is named.
func TestMIGParentNotWhole(t *testing.T) {
	s := simnode.MemoryMIGSnapshot()
	for _, tc := range []struct{ name, annotation, want string }{
		{"index", "device=0", `nri-gpu: annotation gpus.nri-gpu.dev/container.c: GPU "0" (index 0) has MIG enabled and is not handed out whole; request one of its MIG devices 0:0-0:6 (or their MIG-<uuid>)`},
		{"uuid", "device=" + s.GPUs[1].UUID, `has MIG enabled and is not handed out whole; request one of its MIG devices 1:0-1:3 (or their MIG-<uuid>)`},
		{"count", "count=7", `nri-gpu: annotation gpus.nri-gpu.dev/container.c: count 7 exceeds the node's 6 whole GPUs (2-7): GPUs 0-1 have MIG enabled and are not handed out whole; name their MIG devices (0:0-0:6,1:0-1:3, or MIG-<uuid>)`},
		{"gone pair", "device=0:7", `nri-gpu: annotation gpus.nri-gpu.dev/container.c: unknown MIG device "0:7" (node has MIG devices 0:0-0:6,1:0-1:3; see nri-gpu inventory)`},
		{"pair beyond a GPU's keys", "device=0:65536", `unknown MIG device "0:65536"`},
		{"gone uuid", "device=MIG-00000000-0000-0000-0000-000000000000", `unknown MIG device "MIG-00000000-0000-0000-0000-000000000000" (no MIG device of the node has this UUID, node has MIG devices 0:0-0:6,1:0-1:3; see nri-gpu inventory)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &api.PodSandbox{Annotations: map[string]string{"gpus.nri-gpu.dev/container.c": tc.annotation}}
			_, _, err := handle(adjust.Prepare(s, layout), tableFor(s), sharing.Shared, pod, &api.Container{Name: "c"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("error of more than one line: %q", err)
			}
		})
	}
	// A count of whole GPUs skips the MIG-enabled ones.
	pod := &api.PodSandbox{Annotations: map[string]string{"gpus.nri-gpu.dev/container.c": "count=6"}}
	_, res, err := handle(adjust.Prepare(s, layout), tableFor(s), sharing.Exclusive, pod, &api.Container{Name: "c"})
	if err != nil {
		t.Fatal(err)
	}
	var idx []int
	for _, g := range res.GPUs {
		idx = append(idx, g.Index)
	}
	if !slices.Equal(idx, []int{2, 3, 4, 5, 6, 7}) {
		t.Errorf("count=6 got %v, want GPUs 2-7", idx)
	}
}

// TestMIGBooking: each MIG device is a unit of the table; booking one
// exclusively leaves its siblings free, and the table shows it.
func TestMIGBooking(t *testing.T) {
	s := simnode.MemoryMIGSnapshot()
	src, table := adjust.Prepare(s, layout), tableFor(s)
	book := func(ctr, devs string) error {
		pod := &api.PodSandbox{Id: "pod-" + ctr, Name: ctr, Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.dev/container.c": `"device=` + devs + `"`}}
		_, _, err := handle(src, table, sharing.Exclusive, pod, &api.Container{Id: ctr, Name: "c"})
		return err
	}
	if err := book("a", "0:0"); err != nil {
		t.Fatal(err)
	}
	if err := book("b", "0:1,0:2"); err != nil {
		t.Fatalf("a sibling of a booked MIG device: %v", err)
	}
	err := book("c", "0:1")
	if err == nil || !strings.Contains(err.Error(), "MIG device 0:1 cannot be held exclusively: it is held by ns/b/c (exclusive)") {
		t.Errorf("a booked MIG device: %v", err)
	}
	sum := alloc.Summary(table.State())
	for _, want := range []string{"0:0=exclusive[ns/a/c]", "0:1=exclusive[ns/b/c]", "0:2=exclusive[ns/b/c]", "0:3=free", "1:3=free", "2=free"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary %q lacks %q", sum, want)
		}
	}
	if strings.Contains(sum, "0=") && strings.Contains(sum, " 0=") {
		t.Errorf("summary %q lists the MIG-enabled GPU 0 whole", sum)
	}
}

// TestMIGManagement: NVIDIA_MIG_CONFIG_DEVICES=all and
// NVIDIA_MIG_MONITOR_DEVICES=all add the mig/config and mig/monitor
// capability nodes where the namespace may make management requests, and
// fail naming the variable elsewhere.
func TestMIGManagement(t *testing.T) {
	s := simnode.MemoryMIGSnapshot()
	pol := policy.Policy{Default: policy.DefaultAllow, ManagementNamespaces: []string{"gpu-admin"}}
	pol.SetDefaults()
	run := func(ns string, env ...string) (*api.ContainerAdjustment, error) {
		pod := &api.PodSandbox{Name: "p", Namespace: ns, Annotations: map[string]string{"gpus.nri-gpu.dev/container.c": "device=0:0"}}
		adj, _, err := handleWithPolicy(adjust.Prepare(s, layout), tableFor(s), sharing.Shared, pol, pod, &api.Container{Name: "c", Env: env})
		return adj, err
	}
	adj, err := run("gpu-admin", "NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_MIG_MONITOR_DEVICES=all")
	if err != nil {
		t.Fatal(err)
	}
	devs := devicePaths(adj)
	if !slices.Contains(devs, capNode(1)) || !slices.Contains(devs, capNode(2)) {
		t.Errorf("devices %q lack mig/config (cap1) and mig/monitor (cap2)", devs)
	}
	adj, err = run("gpu-admin", "NVIDIA_MIG_MONITOR_DEVICES=all")
	if err != nil || slices.Contains(devicePaths(adj), capNode(1)) || !slices.Contains(devicePaths(adj), capNode(2)) {
		t.Errorf("monitor only: %q, %v", devicePaths(adj), err)
	}
	if adj, err := run("gpu-admin"); err != nil || slices.Contains(devicePaths(adj), capNode(1)) || slices.Contains(devicePaths(adj), capNode(2)) {
		t.Errorf("no management asked: %q, %v", devicePaths(adj), err)
	}
	for _, tc := range []struct {
		ns, env, want string
	}{
		{"web", "NVIDIA_MIG_CONFIG_DEVICES=all", `nri-gpu: env NVIDIA_MIG_CONFIG_DEVICES: MIG management not allowed in namespace "web"`},
		{"gpu-admin", "NVIDIA_MIG_MONITOR_DEVICES=0", `nri-gpu: env NVIDIA_MIG_MONITOR_DEVICES: unsupported value "0" (valid: all)`},
	} {
		if _, err := run(tc.ns, tc.env); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s in %s: %v, want %q", tc.env, tc.ns, err, tc.want)
		}
	}
}

// TestMIGHoldings: after a restart, a container nri-gpu gave MIG devices
// holds them again by its record, backed by its parent's node and its
// compute instance's capability node; a record without the capability
// node (a forged annotation next to the parent's node) does not count,
// and a container made without nri-gpu holds the MIG devices whose nodes
// it has, not its GPU's siblings.
func TestMIGHoldings(t *testing.T) {
	s := simnode.MemoryMIGSnapshot()
	src := adjust.Prepare(s, layout)
	m01, m02 := s.MIG[1], s.MIG[2]
	dev := func(n inventory.DeviceNode) *api.LinuxDevice {
		return &api.LinuxDevice{Path: n.Path, Type: "c", Major: n.Major, Minor: n.Minor}
	}
	parent := dev(s.GPUs[0].Node)
	rec := func(uuids ...string) map[string]string {
		return map[string]string{alloc.Annotation: alloc.Record{Mode: "exclusive", GPUs: uuids}.Encode()}
	}
	running := api.ContainerState_CONTAINER_RUNNING
	pods := []*api.PodSandbox{{Id: "p", Name: "p", Namespace: "ns"}}
	ctrs := []*api.Container{
		{Id: "a", PodSandboxId: "p", Name: "a", State: running, Annotations: rec(m01.UUID),
			Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{parent, dev(m01.GINode), dev(m01.CINode)}}},
		{Id: "b", PodSandboxId: "p", Name: "b", State: running, Annotations: rec(m02.UUID),
			Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{parent}}},
		{Id: "c", PodSandboxId: "p", Name: "c", State: running,
			Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{parent, dev(m02.GINode), dev(m02.CINode)}}},
	}
	hs, warnings := holdings(src, sharing.Shared, pods, ctrs)
	got := map[string][]int{}
	for _, h := range hs {
		got[h.Holder.ID] = h.GPUs
	}
	k01, k02 := inventory.MIGKey(0, 1), inventory.MIGKey(0, 2)
	if len(got) != 2 || !slices.Equal(got["a"], []int{k01}) || !slices.Equal(got["c"], []int{k02}) {
		t.Errorf("holdings %v, want a: 0:1, c: 0:2", got)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "names GPUs whose device nodes the container does not have ("+m02.UUID+")") {
		t.Errorf("warnings %q", warnings)
	}
}
