package pipeline

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

const imexMajor = 500

// imexSnapshot is the in-memory node with IMEX channels 0-2.
func imexSnapshot() *inventory.Snapshot {
	s := *benchSnapshot()
	for n := 0; n < 3; n++ {
		s.IMEXChannels = append(s.IMEXChannels, inventory.IMEXChannel{Number: n,
			Node: inventory.DeviceNode{Path: inventory.IMEXChannelPath(n), Major: imexMajor, Minor: int64(n), Mode: 0o666}})
	}
	return &s
}

// imexDevices returns the IMEX channel nodes of an adjustment.
func imexDevices(adj *api.ContainerAdjustment) []*api.LinuxDevice {
	var out []*api.LinuxDevice
	for _, d := range adj.GetLinux().GetDevices() {
		if strings.HasPrefix(d.Path, inventory.IMEXChannelDir+"/") {
			out = append(out, d)
		}
	}
	return out
}

// wantChannel1 checks that devs is exactly channel1, as a character device
// with its numbers and mode (the runtime makes the cgroup rule from them).
func wantChannel1(t *testing.T, devs []*api.LinuxDevice) {
	t.Helper()
	if len(devs) != 1 {
		t.Fatalf("IMEX devices %v, want channel1 only", devs)
	}
	d := devs[0]
	if d.Path != "/dev/nvidia-caps-imex-channels/channel1" || d.Type != "c" || d.Major != imexMajor || d.Minor != 1 || d.FileMode.GetValue() != 0o666 {
		t.Errorf("channel1 = %+v", d)
	}
}

func TestHandleIMEX(t *testing.T) {
	s := imexSnapshot()
	src := adjust.Prepare(s, layout)
	pod := &api.PodSandbox{Namespace: "nvl72", Annotations: map[string]string{}}

	// With a GPU, from the environment.
	adj, res, err := handle(src, tableFor(s), sharing.Shared, pod, &api.Container{Name: "a",
		Env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=1"}})
	if err != nil {
		t.Fatal(err)
	}
	wantChannel1(t, imexDevices(adj))
	if len(adj.Linux.Devices) != 1+3+1 || len(res.IMEX) != 1 || !res.Injected() {
		t.Errorf("%d devices (want a GPU, 3 control nodes of compute, channel1), result IMEX %v", len(adj.Linux.Devices), res.IMEX)
	}

	// Alone, from the annotation's field: the channel and nothing else.
	annPod := &api.PodSandbox{Namespace: "nvl72", Annotations: map[string]string{"gpus.nri-gpu.dev/container.a": "imex-channels=channel1"}}
	adj, _, err = handle(src, tableFor(s), sharing.Shared, annPod, &api.Container{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	wantChannel1(t, imexDevices(adj))
	if len(adj.Linux.Devices) != 1 || len(adj.Mounts) != 0 || len(adj.Env) != 0 {
		t.Errorf("IMEX-only answer has more than the channel: %v", adj)
	}

	// On CRI-O the name may come only from the kubelet's label: the
	// container annotation still names this container.
	adj, _, err = handle(src, tableFor(s), sharing.Shared, annPod, &api.Container{Labels: map[string]string{request.ContainerNameLabel: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	wantChannel1(t, imexDevices(adj))

	// From the device plugin's mounts, which win over the environment.
	adj, _, err = handle(src, tableFor(s), sharing.Shared, pod, &api.Container{Name: "a", Env: []string{"NVIDIA_IMEX_CHANNELS=all"},
		Mounts: []*api.Mount{{Source: "/dev/null", Destination: request.DeviceListIMEX + "/1"}}})
	if err != nil {
		t.Fatal(err)
	}
	wantChannel1(t, imexDevices(adj))

	// all: every channel of the node.
	adj, _, err = handle(src, tableFor(s), sharing.Shared, pod, &api.Container{Name: "a", Env: []string{"NVIDIA_IMEX_CHANNELS=all"}})
	if err != nil || len(imexDevices(adj)) != 3 {
		t.Errorf("all: %v, %v", imexDevices(adj), err)
	}

	// A channel the runtime gives already is not added again.
	given := &api.Container{Name: "a", Env: []string{"NVIDIA_IMEX_CHANNELS=1"},
		Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia-caps-imex-channels/channel1", Type: "c", Major: imexMajor, Minor: 1}}}}
	adj, res, err = handle(src, tableFor(s), sharing.Shared, pod, given)
	if err != nil || len(imexDevices(adj)) != 0 || len(res.IMEX) != 1 {
		t.Errorf("channel given by the runtime: %v, %v, %v", adj, res.IMEX, err)
	}
}

// TestHandleIMEXRefused: a channel the node lacks refuses the whole
// container, naming the source, the token and what the node has, and
// books nothing.
func TestHandleIMEXRefused(t *testing.T) {
	s := imexSnapshot()
	table := tableFor(s)
	pod := &api.PodSandbox{Namespace: "nvl72"}
	adj, _, err := handle(adjust.Prepare(s, layout), table, sharing.Exclusive, pod, &api.Container{Name: "a", Id: "c1",
		Env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=0,7"}})
	if adj != nil || err == nil || err.Error() != `nri-gpu: env NVIDIA_IMEX_CHANNELS: unknown IMEX channel "7" (node has 0-2)` {
		t.Fatalf("missing channel: %v, %v", adj, err)
	}
	if h := table.Holdings(); len(h) != 0 {
		t.Errorf("a refused container holds %v", h)
	}
	// A node without channels.
	plain := benchSnapshot()
	_, _, err = handle(adjust.Prepare(plain, layout), tableFor(plain), sharing.Shared, pod, &api.Container{Name: "a",
		Mounts: []*api.Mount{{Source: "/dev/null", Destination: request.DeviceListIMEX + "/0"}}})
	if err == nil || err.Error() != `nri-gpu: mounts /var/run/nvidia-container-devices/imex: unknown IMEX channel "0" (node has none)` {
		t.Errorf("node without channels: %v", err)
	}
}

// TestHandleIMEXPolicy: every carrier of a channel request is subject to
// policy.imexNamespaces; under default: deny, allowing annotations (or
// the device list) allows no channel.
func TestHandleIMEXPolicy(t *testing.T) {
	s := imexSnapshot()
	src := adjust.Prepare(s, layout)
	closed := policy.Policy{Default: policy.DefaultDeny, AnnotationNamespaces: []string{"ml", "nvl72"}, DeviceListNamespaces: []string{"ml"}, VisibleDevices: policy.VisibleDevicesAllow}
	closed.SetDefaults()
	open := closed
	open.IMEXNamespaces = []string{"nvl72"}
	for _, tc := range []struct {
		name string
		pod  *api.PodSandbox
		ctr  *api.Container
		want string
	}{
		{"env", &api.PodSandbox{Namespace: "ml"}, &api.Container{Name: "a", Env: []string{"NVIDIA_IMEX_CHANNELS=1"}},
			`nri-gpu: env NVIDIA_IMEX_CHANNELS: IMEX channels: not allowed in namespace "ml"`},
		{"mounts", &api.PodSandbox{Namespace: "ml"}, &api.Container{Name: "a", Mounts: []*api.Mount{{Source: "/dev/null", Destination: request.DeviceListIMEX + "/1"}}},
			`nri-gpu: mounts /var/run/nvidia-container-devices/imex: IMEX channels: not allowed in namespace "ml"`},
		{"annotation", &api.PodSandbox{Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "imex-channels=1"}}, &api.Container{Name: "a"},
			`nri-gpu: annotation gpus.nri-gpu.dev/pod: IMEX channels: not allowed in namespace "ml"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, pol := range []policy.Policy{closed, open} {
				adj, _, err := handleWithPolicy(src, tableFor(s), sharing.Shared, pol, tc.pod, tc.ctr)
				if adj != nil || err == nil || !strings.HasPrefix(err.Error(), tc.want) {
					t.Errorf("namespace ml: %v, %v; want %s", adj, err, tc.want)
				}
			}
			pod := &api.PodSandbox{Namespace: "nvl72", Annotations: tc.pod.Annotations}
			if _, _, err := handleWithPolicy(src, tableFor(s), sharing.Shared, closed, pod, tc.ctr); err == nil || !strings.Contains(err.Error(), "policy.imexNamespaces: [] (none: policy.default is deny)") {
				t.Errorf("closed policy, namespace nvl72: %v", err)
			}
			adj, _, err := handleWithPolicy(src, tableFor(s), sharing.Shared, open, pod, tc.ctr)
			if err != nil {
				t.Fatalf("imexNamespaces [nvl72], namespace nvl72: %v", err)
			}
			wantChannel1(t, imexDevices(adj))
		})
	}
}

// BenchmarkHandleIMEXBounds is an IMEX request at the bounds: all 2048
// channels of a node (maxIMEXList, the driver's default count) for a
// container that the runtime gives 4096 device nodes (maxDevices), the
// last 2048 of them the channels themselves, so that every channel is
// looked up among the container's nodes. The work is linear: the nodes'
// paths are put in a set once.
func BenchmarkHandleIMEXBounds(b *testing.B) {
	s := *benchSnapshot()
	const channels = 2048
	for n := range channels {
		s.IMEXChannels = append(s.IMEXChannels, inventory.IMEXChannel{Number: n,
			Node: inventory.DeviceNode{Path: inventory.IMEXChannelPath(n), Major: imexMajor, Minor: int64(n), Mode: 0o666}})
	}
	ctr := &api.Container{Name: "a", Env: []string{"NVIDIA_IMEX_CHANNELS=all"}, Linux: &api.LinuxContainer{}}
	for i := range 4096 - channels {
		ctr.Linux.Devices = append(ctr.Linux.Devices, &api.LinuxDevice{Path: fmt.Sprintf("/dev/other%d", i), Type: "c", Major: 1, Minor: int64(i)})
	}
	for n := range channels {
		ctr.Linux.Devices = append(ctr.Linux.Devices, &api.LinuxDevice{Path: inventory.IMEXChannelPath(n), Type: "c", Major: imexMajor, Minor: int64(n)})
	}
	p := Path{Source: adjust.Prepare(&s, layout), Table: tableFor(&s), Sharing: sharing.Shared}
	pod := &api.PodSandbox{Namespace: "nvl72"}
	b.ReportAllocs()
	for b.Loop() {
		_, res, err := p.Handle(context.Background(), pod, ctr)
		if err != nil || len(res.IMEX) != channels {
			b.Fatalf("%v, %d channels", err, len(res.IMEX))
		}
	}
}
