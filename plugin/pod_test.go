package plugin

import (
	"context"
	"io"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
)

// TestPodCountThroughPlugin: a pod-level count through the NRI callbacks.
// The init container stops before the main one and the sidecar are
// created; all three get the same GPUs, the table shows the pod holding
// them once, a restart (Synchronize) rebuilds that, and only the pod's
// stop releases them.
func TestPodCountThroughPlugin(t *testing.T) {
	ctx := context.Background()
	p := testPlugin(sharing.Exclusive, io.Discard)
	pod := &api.PodSandbox{Id: "pod-p", Name: "p", Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "2"}}
	var live []*api.Container
	create := func(name string) string {
		t.Helper()
		c := &api.Container{Id: "ctr-" + name, PodSandboxId: pod.Id, Name: name}
		adj, _, err := p.CreateContainer(ctx, pod, c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c.Annotations = adj.Annotations
		c.Linux = &api.LinuxContainer{Devices: adj.GetLinux().GetDevices()}
		c.State = api.ContainerState_CONTAINER_RUNNING
		live = append(live, c)
		return visible(adj)
	}
	init := create("init")
	if _, err := p.StopContainer(ctx, pod, live[0]); err != nil {
		t.Fatal(err)
	}
	live = live[:0]
	main, sidecar := create("main"), create("sidecar")
	if init != main || main != sidecar {
		t.Errorf("init %s, main %s, sidecar %s: want the same GPUs", init, main, sidecar)
	}
	want := "0=exclusive[ns/p] 1=exclusive[ns/p] 2=free 3=free 4=free 5=free 6=free 7=free"
	if got := alloc.Summary(p.table.State()); got != want {
		t.Errorf("table %s\nwant %s", got, want)
	}
	// nri-gpu restarts: the runtime lists the pod and its two running
	// containers.
	p = testPlugin(sharing.Exclusive, io.Discard)
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{pod}, live); err != nil {
		t.Fatal(err)
	}
	if got := alloc.Summary(p.table.State()); got != want {
		t.Errorf("after Synchronize: %s\nwant %s", got, want)
	}
	// The sidecar stops: the pod still holds its GPUs.
	if _, err := p.StopContainer(ctx, pod, live[1]); err != nil {
		t.Fatal(err)
	}
	if got := alloc.Summary(p.table.State()); got != want {
		t.Errorf("after the sidecar stopped: %s\nwant %s", got, want)
	}
	if err := p.StopPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if got, want := alloc.Summary(p.table.State()), "0=free 1=free 2=free 3=free 4=free 5=free 6=free 7=free"; got != want {
		t.Errorf("after the pod stopped: %s", got)
	}
}
