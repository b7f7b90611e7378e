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
)

// gpuNode is GPU i's device node as the runtime lists it.
func gpuNode(i int) *api.LinuxDevice {
	return &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", i), Type: "c", Major: 195, Minor: int64(i)}
}

// privilegedLinux is a privileged container as containerd 2.4's CRI
// passes it to NRI (seen with a logging plugin, test/e2e): every device
// node of the host, here the node's 8 GPUs among others, and one device
// cgroup rule, {"allow":true,"access":"rwm"}.
func privilegedLinux() *api.LinuxContainer {
	l := &api.LinuxContainer{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}}}
	l.Devices = append(l.Devices, &api.LinuxDevice{Path: "/dev/null", Type: "c", Major: 1, Minor: 3})
	for i := range 8 {
		l.Devices = append(l.Devices, gpuNode(i))
	}
	l.Devices = append(l.Devices, &api.LinuxDevice{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
		&api.LinuxDevice{Path: "/dev/tty", Type: "c", Major: 5, Minor: 0})
	return l
}

// pluginLinux is a container given GPUs one by one, as containerd passes
// a device plugin's DeviceSpecs (or --device): the nodes, a deny-all
// device cgroup rule and one allow rule per node.
func pluginLinux(gpus ...int) *api.LinuxContainer {
	l := &api.LinuxContainer{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{{Access: "rwm"}}}}
	for _, g := range gpus {
		l.Devices = append(l.Devices, gpuNode(g))
		l.Resources.Devices = append(l.Resources.Devices, &api.LinuxDeviceCgroup{Allow: true, Type: "c",
			Major: &api.OptionalInt64{Value: 195}, Minor: &api.OptionalInt64{Value: int64(g)}, Access: "rwm"})
	}
	return l
}

func TestPrivilegedRule(t *testing.T) {
	rule := func(allow bool, typ string, major, minor *api.OptionalInt64, access string) *api.LinuxDeviceCgroup {
		return &api.LinuxDeviceCgroup{Allow: allow, Type: typ, Major: major, Minor: minor, Access: access}
	}
	any := &api.OptionalInt64{Value: -1}
	for _, tc := range []struct {
		name  string
		rules []*api.LinuxDeviceCgroup
		want  bool
	}{
		{"containerd privileged", privilegedLinux().Resources.Devices, true},
		{"device plugin", pluginLinux(0, 1).Resources.Devices, false},
		{"no rules", nil, false},
		{"type a, wildcard numbers", []*api.LinuxDeviceCgroup{rule(true, "a", any, any, "rwm")}, true},
		{"deny after allow-all", []*api.LinuxDeviceCgroup{rule(true, "", nil, nil, "rwm"), rule(false, "c", &api.OptionalInt64{Value: 195}, nil, "rwm")}, false},
		{"allow-all after deny-all", []*api.LinuxDeviceCgroup{rule(false, "", nil, nil, "rwm"), rule(true, "", nil, nil, "rwm")}, true},
		{"every char device only", []*api.LinuxDeviceCgroup{rule(true, "c", nil, nil, "rwm")}, false},
		{"every major 195", []*api.LinuxDeviceCgroup{rule(true, "", &api.OptionalInt64{Value: 195}, nil, "rwm")}, false},
		{"read only", []*api.LinuxDeviceCgroup{rule(true, "", nil, nil, "r")}, false},
	} {
		ctr := &api.Container{Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Devices: tc.rules}}}
		if got := isPrivileged(ctr); got != tc.want {
			t.Errorf("%s: privileged = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPrivilegedContainer: a privileged container, which the runtime gave
// every host device, holds no GPU by its device nodes, at CreateContainer
// and at Synchronize; its request is served as if it had none.
func TestPrivilegedContainer(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	table := tableFor(prep.Snapshot())
	pod := &api.PodSandbox{Id: "p-agent", Name: "agent", Namespace: "gpu-operator"}
	running := api.ContainerState_CONTAINER_RUNNING
	agent := &api.Container{Id: "agent", PodSandboxId: "p-agent", Name: "agent", State: running, Linux: privilegedLinux()}

	// Without a request: untouched, nothing booked.
	adj, res, err := handle(prep, table, sharing.Exclusive, pod, agent)
	if adj != nil || err != nil || res.Holding != nil || len(table.Holdings()) != 0 {
		t.Fatalf("request-less privileged container: %v, %v, %v, table %v", adj, err, res.Holding, table.Holdings())
	}
	// After a restart it is not a holder: the node's GPUs stay free.
	hs, warnings := holdings(prep, sharing.Exclusive, []*api.PodSandbox{pod}, []*api.Container{agent})
	if len(hs) != 0 || len(warnings) != 0 {
		t.Errorf("holdings of a privileged container: %+v, %q", hs, warnings)
	}
	table.Rebuild(hs)
	other := &api.PodSandbox{Id: "p-train", Name: "train", Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "8"}}
	if _, res, err := handle(prep, table, sharing.Exclusive, other, &api.Container{Id: "train", PodSandboxId: "p-train", Name: "main"}); err != nil || len(res.GPUs) != 8 {
		t.Fatalf("count request next to a privileged container on an exclusive node: %v, %d GPUs", err, len(res.GPUs))
	}
	table.ReleasePod("p-train")

	// With a count request: the count is booked and named, not every
	// GPU of the host.
	pod.Annotations = map[string]string{"gpus.nri-gpu.dev/container.agent": "1"}
	adj, res, err = handle(prep, table, sharing.Exclusive, pod, agent)
	if err != nil || res.Holding == nil || !slices.Equal(res.Holding.GPUs, []int{0}) {
		t.Fatalf("privileged container with a count: %v, %+v", err, res.Holding)
	}
	if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != uuid(0) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want GPU 0's UUID", got)
	}
	// Its record counts at Synchronize (it has the GPU's node).
	agent.Annotations = adj.Annotations
	hs, _ = holdings(prep, sharing.Exclusive, []*api.PodSandbox{pod}, []*api.Container{agent})
	if len(hs) != 1 || !slices.Equal(hs[0].GPUs, []int{0}) || hs[0].Mode != sharing.Exclusive {
		t.Errorf("holdings of a privileged container with a record: %+v", hs)
	}
}

// TestRuntimeGPUsBooked: GPUs whose device nodes the runtime gave a
// container (a device plugin's DeviceSpecs) are booked as the runtime's
// choice, so that a count request never hands them out again, and a
// conflict with an exclusive holder refuses the container.
func TestRuntimeGPUsBooked(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	table := tableFor(prep.Snapshot())
	kubelet := &api.PodSandbox{Id: "p-k", Name: "k", Namespace: "ml"}
	k := &api.Container{Id: "k", PodSandboxId: "p-k", Name: "main", Env: []string{"NVIDIA_VISIBLE_DEVICES=" + uuid(2)}, Linux: pluginLinux(2)}
	adj, res, err := handle(prep, table, sharing.Exclusive, kubelet, k)
	if err != nil || adj == nil || res.Holding == nil || !slices.Equal(res.Holding.GPUs, []int{2}) || res.Holding.Mode != sharing.Exclusive {
		t.Fatalf("device plugin's container: %v, %v, %+v", adj, err, res.Holding)
	}
	// Request-less, the same.
	bare := &api.Container{Id: "bare", PodSandboxId: "p-k", Name: "bare", Linux: pluginLinux(5)}
	if adj, res, err := handle(prep, table, sharing.Exclusive, kubelet, bare); adj != nil || err != nil || res.Holding == nil || !strings.Contains(res.Selection.Note, "GPUs 5: booked (exclusive)") {
		t.Fatalf("request-less device plugin's container: %v, %v, %+v, %q", adj, err, res.Holding, res.Selection.Note)
	}
	// A count request does not get them.
	count := func(n string) ([]int, error) {
		pod := &api.PodSandbox{Id: "p-c", Name: "c", Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/container.main": n}}
		_, res, err := handle(prep, table, sharing.Exclusive, pod, &api.Container{Id: "c", PodSandboxId: "p-c", Name: "main"})
		if res.Holding == nil {
			return nil, err
		}
		return res.Holding.GPUs, err
	}
	if got, err := count("8"); err == nil {
		t.Errorf("count 8 next to the device plugin's GPUs: got %v", got)
	}
	if got, err := count("6"); err != nil || slices.Contains(got, 2) || slices.Contains(got, 5) {
		t.Errorf("count 6: %v, %v", got, err)
	}
	// The table's booking is what Synchronize rebuilds.
	k.State, bare.State = api.ContainerState_CONTAINER_RUNNING, api.ContainerState_CONTAINER_RUNNING
	hs, _ := holdings(prep, sharing.Exclusive, []*api.PodSandbox{kubelet}, []*api.Container{k, bare})
	if len(hs) != 2 || !slices.Equal(hs[0].GPUs, []int{2}) || !slices.Equal(hs[1].GPUs, []int{5}) || hs[0].Mode != sharing.Exclusive {
		t.Errorf("rebuilt: %+v", hs)
	}
	// GPU 0 is held exclusively by nri-gpu's count: a container the
	// runtime gave it is refused, naming the holder.
	late := &api.Container{Id: "late", PodSandboxId: "p-k", Name: "late", Linux: pluginLinux(0)}
	_, _, err = handleWithPolicy(prep, table, sharing.Shared, policy.Policy{}, kubelet, late)
	if want := "nri-gpu: " + runtimeSource + ": GPU 0 is held exclusively by ml/c/main (exclusive)"; err == nil || err.Error() != want {
		t.Errorf("conflict: %v, want %s", err, want)
	}
	if slices.ContainsFunc(table.Holdings(), func(h alloc.Holding) bool { return h.Holder.ID == "late" }) {
		t.Error("the refused container holds GPUs")
	}
}

// TestPodLevelCount: a pod-level count is booked once for the pod, and
// its init container, main container and sidecar all get the same GPUs;
// a container's stop does not release them, the pod's does; a restart
// rebuilds the pod's holding from its containers' records.
func TestPodLevelCount(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	table := tableFor(prep.Snapshot())
	pod := &api.PodSandbox{Id: "p1", Name: "train", Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "2"}}
	ctrs := map[string]*api.Container{}
	run := func(name string) []string {
		t.Helper()
		c := &api.Container{Id: "c-" + name, PodSandboxId: "p1", Name: name}
		adj, res, err := handle(prep, table, sharing.Exclusive, pod, c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.Holding == nil || res.Holding.Holder.ID != alloc.PodHolderPrefix+"p1" {
			t.Errorf("%s: holding %+v, want the pod's", name, res.Holding)
		}
		c.Annotations = adj.Annotations
		c.Linux = &api.LinuxContainer{Devices: adj.GetLinux().GetDevices()}
		c.State = api.ContainerState_CONTAINER_RUNNING
		ctrs[name] = c
		return strings.Split(envOf(adj)["NVIDIA_VISIBLE_DEVICES"], ",")
	}
	init := run("init")
	// The init container exits before the main one starts.
	table.Release("c-init")
	ctrs["init"].State = api.ContainerState_CONTAINER_STOPPED
	main, sidecar := run("main"), run("sidecar")
	if len(init) != 2 || !slices.Equal(init, main) || !slices.Equal(init, sidecar) {
		t.Errorf("init %v, main %v, sidecar %v: want the same 2 GPUs", init, main, sidecar)
	}
	want := "0=exclusive[ml/train] 1=exclusive[ml/train] 2=free 3=free 4=free 5=free 6=free 7=free"
	if got := alloc.Summary(table.State()); got != want {
		t.Errorf("table %s\nwant %s", got, want)
	}
	// A refused container of the pod leaves the pod's holding.
	bad := &api.Container{Id: "c-bad", PodSandboxId: "p1", Name: "bad", Env: []string{"NVIDIA_REQUIRE_ARCH=arch>=99.0"}}
	if _, _, err := handle(prep, table, sharing.Exclusive, pod, bad); err == nil {
		t.Error("unmet requirement served")
	}
	if got := alloc.Summary(table.State()); got != want {
		t.Errorf("after a refused container: %s\nwant %s", got, want)
	}
	// Rebuilt from the records of main and sidecar (init is stopped).
	hs, warnings := holdings(prep, sharing.Shared, []*api.PodSandbox{pod}, []*api.Container{ctrs["init"], ctrs["main"], ctrs["sidecar"]})
	if len(warnings) != 0 || len(hs) != 1 || hs[0].Holder != alloc.PodHolder("p1", "ml", "train") || !slices.Equal(hs[0].GPUs, []int{0, 1}) || hs[0].Mode != sharing.Exclusive {
		t.Errorf("rebuilt: %+v, %q", hs, warnings)
	}
	table.Rebuild(hs)
	if got := alloc.Summary(table.State()); got != want {
		t.Errorf("after rebuild: %s\nwant %s", got, want)
	}
	// A container of the pod created after the restart joins it.
	if got := run("late"); !slices.Equal(got, main) {
		t.Errorf("late container %v, want %v", got, main)
	}
	if n := table.ReleasePod("p1"); n != 1 || len(table.Holdings()) != 0 {
		t.Errorf("pod release: %d, left %+v", n, table.Holdings())
	}
}

// TestPodLevelExclusiveSidecar: a pod-level request (a count or named
// GPUs) with exclusive=true is the pod's, booked once: its init
// container, main container and sidecar all get the GPUs, and another
// pod cannot. Named GPUs were booked by each container for itself, so the
// main container's exclusive hold refused the sidecar (this test failed
// before named pod-level requests joined the pod's holding).
func TestPodLevelExclusiveSidecar(t *testing.T) {
	for _, tc := range []struct{ val, want string }{
		{"count=2,exclusive=true", "0,1"},
		{`"device=1,3",exclusive=true`, "1,3"},
	} {
		t.Run(tc.val, func(t *testing.T) {
			prep := adjust.Prepare(benchSnapshot(), layout)
			table := tableFor(prep.Snapshot())
			pod := &api.PodSandbox{Id: "p1", Name: "train", Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": tc.val}}
			var ctrs []*api.Container
			for _, name := range []string{"init", "main", "sidecar"} {
				c := &api.Container{Id: "c-" + name, PodSandboxId: "p1", Name: name}
				adj, res, err := handle(prep, table, sharing.Shared, pod, c)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if res.Holding == nil || res.Holding.Holder != alloc.PodHolder("p1", "ml", "train") || res.Holding.Mode != sharing.Exclusive {
					t.Errorf("%s: holding %+v, want the pod's, exclusive", name, res.Holding)
				}
				if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got == "" || len(strings.Split(got, ",")) != 2 {
					t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want 2 GPUs", name, got)
				}
				c.Annotations = adj.Annotations
				c.Linux = &api.LinuxContainer{Devices: adj.GetLinux().GetDevices()}
				c.State = api.ContainerState_CONTAINER_RUNNING
				if name == "init" {
					// The kubelet starts the main container once the init
					// container has exited.
					table.Release(c.Id)
					c.State = api.ContainerState_CONTAINER_STOPPED
				}
				ctrs = append(ctrs, c)
			}
			want := map[string]string{
				"0,1": "0=exclusive[ml/train] 1=exclusive[ml/train] 2=free 3=free 4=free 5=free 6=free 7=free",
				"1,3": "0=free 1=exclusive[ml/train] 2=free 3=exclusive[ml/train] 4=free 5=free 6=free 7=free",
			}[tc.want]
			if got := alloc.Summary(table.State()); got != want {
				t.Errorf("table %s\nwant %s", got, want)
			}
			// Another pod asking for the same GPUs is refused.
			other := &api.PodSandbox{Id: "p2", Name: "other", Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": `"device=` + tc.want + `"`}}
			if _, _, err := handle(prep, table, sharing.Shared, other, &api.Container{Id: "c-other", PodSandboxId: "p2", Name: "c"}); err == nil {
				t.Error("another pod got GPUs the pod holds exclusively")
			}
			// Synchronize rebuilds one holding for the pod.
			hs, warnings := holdings(prep, sharing.Shared, []*api.PodSandbox{pod}, ctrs)
			if len(warnings) != 0 || len(hs) != 1 || hs[0].Holder != alloc.PodHolder("p1", "ml", "train") || hs[0].Mode != sharing.Exclusive || len(hs[0].Members) != 2 {
				t.Errorf("rebuilt: %+v, %q", hs, warnings)
			}
			table.Rebuild(hs)
			if got := alloc.Summary(table.State()); got != want {
				t.Errorf("after rebuild: %s\nwant %s", got, want)
			}
		})
	}
}
