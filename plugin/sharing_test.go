package plugin

import (
	"bytes"
	"context"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestReplicatedState: the plugin hands the node state's sharing plan to
// the table and the request path. On a node whose mode is exclusive, with
// GPU 0 advertised as 4 time-slicing replicas, a replica holder rebuilt at
// Synchronize and one created after share GPU 0, the table marks it
// replicated, and a request of a container's own for GPU 0 is refused.
func TestReplicatedState(t *testing.T) {
	ctx := context.Background()
	var log bytes.Buffer
	l := logrus.New()
	l.SetOutput(&log)
	cfg := config.Default()
	cfg.Sharing = config.Sharing(sharing.Exclusive.String())
	src := adjust.Prepare(simnode.MemorySnapshot(), layout)
	plan := sharing.NewPlan(sharing.Spec{ResourceName: "nvidia.com/gpu", MIGStrategy: sharing.MIGStrategyNone, Strategy: sharing.TimeSlicing,
		Resources: []sharing.Resource{{Name: "nvidia.com/gpu", SharedName: "nvidia.com/gpu", Replicas: 4, Count: 1}}}, src.Devices())
	st := &node.State{Config: cfg, Source: src, Sharing: sharing.Exclusive, Shares: plan}
	p, err := newPlugin(l, func(opts ...node.Option) (*node.Node, error) { return node.Fixed(st, l, opts...), nil })
	if err != nil {
		t.Fatal(err)
	}
	apod, actr := kubeletCtr("a", uuid(0), 0)
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{apod}, []*api.Container{actr}); err != nil {
		t.Fatal(err)
	}
	bpod, bctr := kubeletCtr("b", uuid(0), 0)
	bctr.State = 0
	bctr.Annotations[alloc.KubeletSharedAnnotation("nvidia.com/gpu")] = "time-slicing:" + uuid(0) + "=1/4"
	if _, _, err := p.CreateContainer(ctx, bpod, bctr); err != nil {
		t.Fatalf("a second replica of GPU 0 on an exclusive node: %v\n%s", err, log.String())
	}
	want := "0=shared(replicas)[kubelet:ns/a/main,kubelet:ns/b/main] 1=free 2=free 3=free 4=free 5=free 6=free 7=free"
	if got := alloc.Summary(p.table.State()); got != want {
		t.Errorf("table %s\nwant  %s", got, want)
	}
	opod, octr := podCtr("own", "device=0")
	if _, _, err := p.CreateContainer(ctx, opod, octr); err == nil {
		t.Error("a request of its own got a GPU shared as replicas")
	}
}
