package plugin

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// claimDevs are devices gpu-<i> of claim ns/name (uid) as the DRA driver
// records them.
func claimDevs(uid, name string, gpus ...int) []claims.Device {
	var out []claims.Device
	for _, g := range gpus {
		n := "/dev/nvidia" + string(rune('0'+g))
		out = append(out, claims.Device{Claim: claims.Claim{UID: uid, Namespace: "ns", Name: name}, Request: "gpu",
			Name: "gpu-" + string(rune('0'+g)), UUID: uuid(g), Node: n, Nodes: []string{n}})
	}
	return out
}

// TestSetPrepared: the DRA driver's prepared claims are booked in the
// allocation table by claim as they are prepared, before any container
// of theirs exists; a claim on a GPU that a node-local request holds
// exclusively is refused, naming the holder, and changes nothing; a
// claim's container gets its GPUs at CreateContainer; Synchronize keeps
// the claims' bookings; Unprepare frees them.
func TestSetPrepared(t *testing.T) {
	ctx := context.Background()
	var log bytes.Buffer
	p := testPlugin(sharing.Exclusive, &log)
	lpod, lctr := podCtr("local", "device=4")
	if _, _, err := p.CreateContainer(ctx, lpod, lctr); err != nil {
		t.Fatal(err)
	}
	train := claimDevs("uid-train", "train", 1, 3)
	if err := p.SetPrepared(claims.New(train), "uid-train"); err != nil {
		t.Fatal(err)
	}
	want := "0=free 1=exclusive[claim ns/train] 2=free 3=exclusive[claim ns/train] 4=exclusive[ns/local/main] 5=free 6=free 7=free"
	if got := alloc.Summary(p.table.State()); got != want {
		t.Fatalf("prepared: %s\nwant %s", got, want)
	}
	err := p.SetPrepared(claims.New(append(train, claimDevs("uid-late", "late", 4)...)), "uid-late")
	if err == nil || !strings.Contains(err.Error(), "GPU 4") || !strings.Contains(err.Error(), "ns/local/main") {
		t.Errorf("claim on a node-local exclusive GPU: %v", err)
	}
	if got := alloc.Summary(p.table.State()); got != want {
		t.Errorf("after a refused claim: %s\nwant %s", got, want)
	}
	if p.claims.Load().Len() != 2 {
		t.Errorf("the refused set became current: %d devices", p.claims.Load().Len())
	}
	// The claim's container.
	cpod, cctr := kubeletCtr("c", "", 1, 3)
	cctr.State, cctr.Annotations = 0, nil
	cctr.Env = []string{"NVIDIA_VISIBLE_DEVICES=all", claims.EnvKey("gpu-1") + "=uid-train", claims.EnvKey("gpu-3") + "=uid-train"}
	adj, _, err := p.CreateContainer(ctx, cpod, cctr)
	if err != nil || visible(adj) != uuid(1)+","+uuid(3) || len(adj.GetMounts()) == 0 {
		t.Fatalf("claim's container: %v, %v", err, adj)
	}
	if !strings.Contains(log.String(), "claim ns/train: the runtime already gives the container /dev/nvidia1, /dev/nvidia3: injected only the missing control nodes and driver files") {
		t.Errorf("injection log names no claim:\n%s", log.String())
	}
	// A restart of the runtime, after the node-local container went: the
	// claim's bookings, rebuilt from the prepared claims.
	cctr.State = api.ContainerState_CONTAINER_RUNNING
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{cpod}, []*api.Container{cctr}); err != nil {
		t.Fatal(err)
	}
	want = "0=free 1=exclusive[claim ns/train] 2=free 3=exclusive[claim ns/train] 4=free 5=free 6=free 7=free"
	if got := alloc.Summary(p.table.State()); got != want {
		t.Errorf("after sync: %s\nwant %s", got, want)
	}
	// Unprepared: its GPUs are free for node-local requests.
	if err := p.SetPrepared(claims.New(nil), ""); err != nil {
		t.Fatal(err)
	}
	npod, nctr := podCtr("n", "8")
	if _, _, err := p.CreateContainer(ctx, npod, nctr); err != nil {
		t.Errorf("every GPU after the claim's Unprepare: %v", err)
	}
}

// TestClaimsUnknown: while the DRA checkpoint cannot be read, the GPUs
// the driver offers are held exclusively for its unknown claims: a
// node-local request for one is refused, naming them (to every
// namespace: they are the node's), Synchronize keeps them held, the
// plugin is not ready; the first set of claims read releases them.
func TestClaimsUnknown(t *testing.T) {
	ctx := context.Background()
	var log bytes.Buffer
	p := testPlugin(sharing.Shared, &log)
	p.ClaimsUnknown(errors.New("read checkpoint /p/checkpoint.json: unexpected end of JSON input"), []string{uuid(1), uuid(2)})
	want := "0=free 1=exclusive[the DRA driver's prepared claims (its checkpoint cannot be read)] 2=exclusive[the DRA driver's prepared claims (its checkpoint cannot be read)] 3=free"
	if got := alloc.Summary(p.table.State()); !strings.HasPrefix(got, want) {
		t.Fatalf("held: %s\nwant %s ...", got, want)
	}
	pod, ctr := podCtr("local", "device=1")
	if _, _, err := p.CreateContainer(ctx, pod, ctr); err == nil || !strings.Contains(err.Error(), "GPU 1 is held exclusively by the DRA driver's prepared claims (its checkpoint cannot be read)") {
		t.Errorf("a node-local request for a held GPU: %v", err)
	}
	if _, err := p.Synchronize(ctx, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := alloc.Summary(p.table.State()); !strings.HasPrefix(got, want) {
		t.Errorf("after Synchronize: %s\nwant %s ...", got, want)
	}
	if err := p.NotReady(); err == nil || !strings.Contains(err.Error(), "unexpected end of JSON input") {
		t.Errorf("ready with unknown claims: %v", err)
	}
	if err := p.SetPrepared(claims.New(claimDevs("uid-train", "train", 1)), ""); err != nil {
		t.Fatal(err)
	}
	want = "0=free 1=shared[claim ns/train] 2=free 3=free"
	if got := alloc.Summary(p.table.State()); !strings.HasPrefix(got, want) {
		t.Errorf("once read: %s\nwant %s ...", got, want)
	}
	if err := p.NotReady(); err != nil {
		t.Errorf("not ready once read: %v", err)
	}
	if n := strings.Count(log.String(), "the prepared claims cannot be read"); n != 1 {
		t.Errorf("logged %d times", n)
	}
}
