package pipeline

import (
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

var (
	shareA = claims.Claim{UID: "uid-share-a", Namespace: "ml", Name: "share-a"}
	shareB = claims.Claim{UID: "uid-share-b", Namespace: "ml", Name: "share-b"}
)

// shareDev is GPU i prepared for claim cl as a share of memMiB of its
// 81920 MiB.
func shareDev(cl claims.Claim, i int, memMiB uint64) claims.Device {
	d := claimDev(cl, i, false)
	d.Share = claims.Share{ID: "share-" + cl.Name, MemoryMiB: memMiB, GPUMemoryMiB: 81920}
	return d
}

// TestClaimSharesBooked: two claims' memory shares of GPU 2 are booked
// shared on an exclusive node, side by side; a share of the whole memory
// (a claim that asked for none) is booked in the node's mode.
func TestClaimSharesBooked(t *testing.T) {
	whole := shareDev(trainClaim, 4, 81920)
	p := claimPath(t, alloc.Exclusive, claims.New([]claims.Device{shareDev(shareA, 2, 20480), shareDev(shareB, 2, 40960), whole}))
	want := "0=free 1=free 2=shared[claim ml/share-a,claim ml/share-b] 3=free 4=exclusive[claim ml/train] 5=free 6=free 7=free"
	if got := alloc.Summary(p.Table.State()); got != want {
		t.Errorf("table %s\nwant %s", got, want)
	}
}
