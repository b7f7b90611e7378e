package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
)

// kubeletCtr is a running container as the kubelet creates it after
// nri-gpu's device plugin's Allocate: the device nodes of the given GPUs
// (a deny-all device cgroup rule and one allow rule per node) and the
// annotation alloc.KubeletAnnotation with ann.
func kubeletCtr(name, ann string, gpus ...int) (*api.PodSandbox, *api.Container) {
	pod := &api.PodSandbox{Id: "pod-" + name, Name: name, Namespace: "ns"}
	l := &api.LinuxContainer{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{{Access: "rwm"}}}}
	for _, g := range gpus {
		l.Devices = append(l.Devices, &api.LinuxDevice{Path: "/dev/nvidia" + string(rune('0'+g)), Type: "c", Major: 195, Minor: int64(g)})
		l.Resources.Devices = append(l.Resources.Devices, &api.LinuxDeviceCgroup{Allow: true, Type: "c",
			Major: &api.OptionalInt64{Value: 195}, Minor: &api.OptionalInt64{Value: int64(g)}, Access: "rwm"})
	}
	return pod, &api.Container{Id: "ctr-" + name, PodSandboxId: pod.Id, Name: "main", State: api.ContainerState_CONTAINER_RUNNING,
		Linux: l, Annotations: map[string]string{alloc.KubeletAnnotation: ann}}
}

// TestSynchronizeKubeletAssignment: at Synchronize, a container with the
// kubelet's annotation and the device nodes of exactly its GPUs holds
// them as the kubelet's; one whose annotation the device nodes do not
// back (a pod annotation passed on) is logged and holds only what its
// nodes give it, as the runtime's choice. The status socket shows the
// kubelet's assignment beside the other holders.
func TestSynchronizeKubeletAssignment(t *testing.T) {
	ctx := context.Background()
	var log bytes.Buffer
	p := testPlugin(sharing.Shared, &log)
	kpod, kctr := kubeletCtr("k", uuid(1)+","+uuid(2), 1, 2)
	fpod, fctr := kubeletCtr("forged", uuid(5)+","+uuid(6), 6)
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{kpod, fpod}, []*api.Container{kctr, fctr}); err != nil {
		t.Fatal(err)
	}
	want := "0=free 1=shared[kubelet:ns/k/main] 2=shared[kubelet:ns/k/main] 3=free 4=free 5=free 6=shared[ns/forged/main] 7=free"
	if got := alloc.Summary(p.table.State()); got != want {
		t.Errorf("after sync: %s\nwant %s", got, want)
	}
	if !strings.Contains(log.String(), "ns/forged/main: annotation "+alloc.KubeletAnnotation+" ignored") {
		t.Errorf("forged annotation not logged:\n%s", log.String())
	}

	// A container the kubelet assigns GPU 3, created now.
	npod, nctr := kubeletCtr("new", uuid(3), 3)
	nctr.State = 0
	adj, _, err := p.CreateContainer(ctx, npod, nctr)
	if err != nil || visible(adj) != uuid(3) || len(adj.GetMounts()) == 0 {
		t.Fatalf("kubelet's container: %v, %v", err, adj)
	}

	dir, err := os.MkdirTemp("", "nri-kst-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "status.sock")
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := status.Serve(sctx, socket, p, p.log); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, socket, "/status")
	var s status.Status
	if err := json.Unmarshal([]byte(body), &s); code != 200 || err != nil {
		t.Fatalf("/status: %d %v %s", code, err, body)
	}
	for _, g := range []int{1, 2, 3} {
		if k := s.GPUs[g].Kubelet; len(k) != 1 || k[0].Pod != map[int]string{1: "k", 2: "k", 3: "new"}[g] || !s.GPUs[g].Holders[0].Kubelet {
			t.Errorf("GPU %d: kubelet %+v, holders %+v", g, k, s.GPUs[g].Holders)
		}
	}
	if k := s.GPUs[6].Kubelet; k == nil || len(k) != 0 || len(s.GPUs[6].Holders) != 1 || s.GPUs[6].Holders[0].Kubelet {
		t.Errorf("GPU 6 (forged): kubelet %+v, holders %+v", k, s.GPUs[6].Holders)
	}
	if !strings.Contains(body, `"kubelet":[]`) || !strings.Contains(body, `"kubelet":true`) {
		t.Errorf("/status JSON lacks the kubelet's fields: %s", body)
	}
}
