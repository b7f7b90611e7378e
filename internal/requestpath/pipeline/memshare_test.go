package pipeline

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

var (
	shareA = claims.Claim{UID: "uid-share-a", Namespace: "ml", Name: "share-a"}
	shareB = claims.Claim{UID: "uid-share-b", Namespace: "ml", Name: "share-b"}
)

// shareDev is GPU i prepared for claim cl as a share of memMiB of its
// 81920 MiB, with GpuConfig MPS and the client limits the driver sizes
// from the share (threads proportional).
func shareDev(cl claims.Claim, i int, memMiB uint64) claims.Device {
	d := mpsClaimDev(cl, i, true)
	d.Share = claims.Share{ID: "share-" + cl.Name, MemoryMiB: memMiB, GPUMemoryMiB: 81920}
	d.MPS.ActiveThreadPercentage, d.MPS.PinnedMemoryMiB = d.Share.ThreadPercentage(), memMiB
	return d
}

// TestClaimSharesBooked: two claims' memory shares of GPU 2 are booked
// shared on an exclusive node, side by side; a share of the whole memory
// (a claim that asked for none) is booked in the node's mode.
func TestClaimSharesBooked(t *testing.T) {
	whole := claimDev(trainClaim, 4, false)
	whole.Share = claims.Share{ID: "share-w", MemoryMiB: 81920, GPUMemoryMiB: 81920}
	p := claimPath(t, sharing.Exclusive, claims.New([]claims.Device{shareDev(shareA, 2, 20480), shareDev(shareB, 2, 40960), whole}))
	want := "0=free 1=free 2=shared[claim ml/share-a,claim ml/share-b] 3=free 4=exclusive[claim ml/train] 5=free 6=free 7=free"
	if got := alloc.Summary(p.Table.State()); got != want {
		t.Errorf("table %s\nwant %s", got, want)
	}
}

// TestClaimSharesMPS: the containers of two claims' shares of GPU 2, of
// 20 and 40 GiB, are clients of the GPU's one daemon, each with its own
// claim's limits (the pod spec's higher ones replaced), and both are
// served beside each other on an exclusive node.
func TestClaimSharesMPS(t *testing.T) {
	p := claimPath(t, sharing.Exclusive, claims.New([]claims.Device{shareDev(shareA, 2, 20480), shareDev(shareB, 2, 40960)}))
	raise := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=81920M"}
	for _, tc := range []struct {
		cl   claims.Claim
		env  []string
		want []string
	}{
		{shareA, raise, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}},
		{shareB, nil, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}},
	} {
		pod := &api.PodSandbox{Id: "p-" + tc.cl.Name, Name: tc.cl.Name, Namespace: "ml"}
		env := claimEnv(tc.cl, tc.env, 2)
		ctr := &api.Container{Id: "c-" + tc.cl.Name, PodSandboxId: pod.Id, Name: "main", Linux: pluginLinux(2), Env: env}
		adj, res, err := p.Handle(context.Background(), pod, ctr)
		if err != nil || res.MPS == nil || res.MPS.UUID != uuid(2) {
			t.Fatalf("%s: %v, %+v", tc.cl.Name, err, res)
		}
		var got []string
		for _, e := range applyEnv(env, adj) {
			if strings.HasPrefix(e, "CUDA_MPS_") {
				got = append(got, e)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: CUDA_MPS_* %q\nwant %q", tc.cl.Name, got, tc.want)
		}
	}
	want := "0=free 1=free 2=shared[claim ml/share-a,claim ml/share-b] 3=free 4=free 5=free 6=free 7=free"
	if got := alloc.Summary(p.Table.State()); got != want {
		t.Errorf("table %s\nwant %s", got, want)
	}
}

// TestReviewDefect4NodeLocalJoinsMemoryShare: a node-local request of
// another namespace that names a GPU whose memory claims share
// (exclusive=false) is refused: a GPU a claim holds is reached only
// through its claim, in any mode. Nothing is booked.
func TestReviewDefect4NodeLocalJoinsMemoryShare(t *testing.T) {
	p := claimPath(t, sharing.Exclusive, claims.New([]claims.Device{shareDev(shareA, 2, 20480), shareDev(shareB, 2, 40960)}))
	before := alloc.Summary(p.Table.State())
	pod := &api.PodSandbox{Id: "p-i", Name: "intruder", Namespace: "other", Annotations: map[string]string{"gpus.nri-gpu.dev/container.main": "device=2,exclusive=false"}}
	adj, _, err := p.Handle(context.Background(), pod, &api.Container{Id: "c-i", PodSandboxId: "p-i", Name: "main"})
	want := "nri-gpu: annotation gpus.nri-gpu.dev/container.main: GPU 2 is held by 2 pods in other namespaces (shared): a GPU that a ResourceClaim holds is reached only through that claim"
	if adj != nil || err == nil || err.Error() != want {
		t.Errorf("a node-local request on a memory-shared GPU: %v, %v\nwant %s", adj, err, want)
	}
	if got := alloc.Summary(p.Table.State()); got != before {
		t.Errorf("table %s\nwant %s", got, before)
	}
}
