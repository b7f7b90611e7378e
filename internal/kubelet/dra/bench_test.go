package dra

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// BenchmarkPrepareResourceClaims is the latency of preparing and
// unpreparing one claim of one GPU as the kubelet asks for it:
// NodePrepareResources then NodeUnprepareResources on the plugin's
// socket (the helper library reads the claim from the API server, a fake
// one here), each writing the checkpoint and the claim's CDI spec with
// fsync, and telling the booking (Book, a no-op here; the allocation
// table's SyncClaims is benchmarked apart). "direct" calls the driver's
// methods without gRPC and the API server. prepare-µs/op is the
// prepare's part.
func BenchmarkPrepareResourceClaims(b *testing.B) {
	root := b.TempDir()
	opts := Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"),
		RegistrationDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev",
		Book: func(*claims.Prepared, string) error { return nil }}
	e := newEnv(b, draConfig(), testSnapshot(), &opts)
	c := e.claim(b, "bench", "uid-bench", false, "gpu-0")
	b.Run("grpc", func(b *testing.B) {
		req := &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}}
		unreq := &drapb.NodeUnprepareResourcesRequest{Claims: req.Claims}
		var prep time.Duration
		for b.Loop() {
			t0 := time.Now()
			resp, err := e.conn.NodePrepareResources(context.Background(), req)
			prep += time.Since(t0)
			if err != nil || resp.Claims[string(c.UID)].GetError() != "" {
				b.Fatal(err, resp)
			}
			if _, err := e.conn.NodeUnprepareResources(context.Background(), unreq); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(prep.Microseconds())/float64(b.N), "prepare-µs/op")
	})
	b.Run("direct", func(b *testing.B) {
		ctx := context.Background()
		un := []kubeletplugin.NamespacedObject{{UID: c.UID}}
		var prep time.Duration
		for b.Loop() {
			t0 := time.Now()
			out, err := e.d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
			prep += time.Since(t0)
			if err != nil || out[types.UID("uid-bench")].Err != nil {
				b.Fatal(err, out)
			}
			if _, err := e.d.UnprepareResourceClaims(ctx, un); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(prep.Microseconds())/float64(b.N), "prepare-µs/op")
	})
}
