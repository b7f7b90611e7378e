package dra

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/pipeline"
)

// tableBooker is Options.Book as nri-gpu run wires it
// (plugin.Plugin.SetPrepared): the NRI side's real allocation table,
// booked through pipeline.ClaimHoldings and alloc.Table.SyncClaims.
type tableBooker struct {
	mu    sync.Mutex
	st    *node.State
	table *alloc.Table
}

func newTableBooker(st *node.State) *tableBooker {
	var idx []int
	for _, g := range st.Source.Devices() {
		idx = append(idx, g.Index)
	}
	return &tableBooker{st: st, table: alloc.New(idx)}
}

func (b *tableBooker) book(p *claims.Prepared, claim string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	hs, _ := pipeline.ClaimHoldings(b.st.Source, sharing.Exclusive, p)
	must := ""
	if claim != "" {
		must = alloc.ClaimHolderPrefix + claim
	}
	return b.table.SyncClaims(hs, must)
}

// envWithTable is a driver whose Book is the real allocation table.
func envWithTable(t *testing.T) (*testEnv, *tableBooker) {
	t.Helper()
	root := t.TempDir()
	b := newTableBooker(stateOf(testSnapshot(), draConfig()))
	opts := Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"),
		RegistrationDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev", Book: b.book}
	return newEnv(t, draConfig(), testSnapshot(), &opts), b
}

// TestReviewDefect2DeletedClaimFreesGPU: a claim deleted in the API
// server while prepared never blocks its GPU, with the NRI side's real
// allocation table booking the claims (as nri-gpu run does): the stale
// claim's holding goes before the new claim is checked against the
// table. And a stale claim's CDI spec is removed only once the checkpoint
// no longer lists it: a new claim that the table refuses for another
// reason leaves the stale claim, its record and its spec, as they were.
func TestReviewDefect2DeletedClaimFreesGPU(t *testing.T) {
	e, b := envWithTable(t)
	old := e.claim(t, "old", "uid-old", false, "gpu-0")
	if r := e.prepare(t, old); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if err := e.client.ResourceV1().ResourceClaims("ml").Delete(context.Background(), "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A node-local request holds GPU 2 exclusively: a claim of gpu-0 and
	// gpu-2 drops the stale claim in its plan, and is then refused.
	if _, err := b.table.Allocate(alloc.Request{Holder: alloc.Holder{ID: "c1", Namespace: "other", Pod: "p", Container: "main"}, Mode: sharing.Exclusive, GPUs: []int{2}, Source: "annotation"}); err != nil {
		t.Fatal(err)
	}
	both := e.claim(t, "both", "uid-both", false, "gpu-0", "gpu-2")
	if r := e.prepare(t, both); !strings.Contains(r.GetError(), "GPU 2 cannot be held exclusively") {
		t.Fatalf("a claim of a GPU held by a node-local request: %v", r)
	}
	if !strings.Contains(checkpointText(t, e), "uid-old") || e.spec(t, "uid-old") == nil {
		t.Errorf("a refused claim changed the stale claim: in the checkpoint %v, spec %v (a spec goes only after its record)",
			strings.Contains(checkpointText(t, e), "uid-old"), e.spec(t, "uid-old") != nil)
	}
	busy := e.claim(t, "busy", "uid-busy", false, "gpu-0")
	if r := e.prepare(t, busy); r.GetError() != "" {
		t.Fatalf("a deleted claim blocks its GPU: %s", r.GetError())
	}
	if strings.Contains(checkpointText(t, e), "uid-old") || e.spec(t, "uid-old") != nil {
		t.Error("the stale claim stayed in the checkpoint or kept its spec")
	}
	if got := alloc.Summary(b.table.State()); !strings.Contains(got, "0=exclusive[claim ml/busy]") {
		t.Errorf("table %s, want GPU 0 held by claim ml/busy", got)
	}
}

func checkpointText(t *testing.T, e *testEnv) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.dirs.PluginDir, CheckpointFile))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestReviewDefect9GpuConfigStrict: GpuConfig is decoded as NVIDIA's
// driver decodes it (apimachinery's strict decoding): a field given twice,
// in any case, and a field name in another case are refused, naming the
// field; encoding/json took the last duplicate and matched any case, so
// an admission policy reading the object saw 10 where nri-gpu applied 100.
func TestReviewDefect9GpuConfigStrict(t *testing.T) {
	for _, tc := range []struct{ name, raw, want string }{
		{"duplicate in another case", gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10, "DefaultActiveThreadPercentage": 100}}}`,
			`unknown field "sharing.mpsConfig.DefaultActiveThreadPercentage"`},
		{"duplicate", gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10, "defaultActiveThreadPercentage": 100}}}`,
			`duplicate field "sharing.mpsConfig.defaultActiveThreadPercentage"`},
		{"duplicate strategy", gpuConfigHead + `, "sharing": {"strategy": "MPS", "strategy": "TimeSlicing"}}`, `duplicate field "sharing.strategy"`},
		{"another case", gpuConfigHead + `, "Sharing": {"strategy": "MPS"}}`, `unknown field "Sharing"`},
		{"duplicate kind", `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "kind": "GpuConfig"}`, `duplicate field "kind"`},
		{"two values", gpuConfigHead + `} {}`, `invalid character '{' after top-level value`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfigs(testDriver, []resourceapi.DeviceAllocationConfiguration{opaque(testDriver, tc.raw, false)})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "claim spec.devices.config[0].opaque.parameters") {
				t.Errorf("parse: %v\nwant an error naming %s", err, tc.want)
			}
		})
	}
}

// TestReviewDefect5ReprepareFollowsAllocation: a claim prepared on gpu-0
// whose UID is allocated gpu-2 now is not answered gpu-0 again: its
// record is stale, released (no spec, not in the checkpoint) with an
// error naming both devices; a second claim then gets gpu-0, and the
// kubelet's next ask prepares the first on gpu-2.
func TestReviewDefect5ReprepareFollowsAllocation(t *testing.T) {
	e, b := envWithTable(t)
	x := e.claim(t, "x", "uid-x", false, "gpu-0")
	if r := e.prepare(t, x); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	x.Status.Allocation.Devices.Results[0].Device = "gpu-2"
	if _, err := e.client.ResourceV1().ResourceClaims("ml").Update(context.Background(), x, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := e.prepare(t, x)
	if !strings.Contains(r.GetError(), "prepare claim ml/x: its preparation is stale: request gpu was prepared with device gpu-0") ||
		!strings.Contains(r.GetError(), "is allocated device gpu-2") || len(r.GetDevices()) != 0 {
		t.Fatalf("re-prepare of a claim allocated another device: %v", r)
	}
	if strings.Contains(checkpointText(t, e), "uid-x") || e.spec(t, "uid-x") != nil {
		t.Error("the stale preparation stayed")
	}
	y := e.claim(t, "y", "uid-y", false, "gpu-0")
	if r := e.prepare(t, y); r.GetError() != "" || r.GetDevices()[0].GetDeviceName() != "gpu-0" {
		t.Errorf("a claim of the device the stale preparation had: %v", r)
	}
	if r := e.prepare(t, x); r.GetError() != "" || r.GetDevices()[0].GetDeviceName() != "gpu-2" {
		t.Errorf("the claim asked again: %v", r)
	}
	if got := alloc.Summary(b.table.State()); !strings.HasPrefix(got, "0=exclusive[claim ml/y] ") || !strings.Contains(got, "2=exclusive[claim ml/x]") {
		t.Errorf("table %s", got)
	}
}

// TestReviewDefect6ReplacedGPUIsStale: after a restart where minor 0 is
// another GPU (a driver reload, a GPU swapped), the claim prepared on the
// old one loses its CDI spec at start (a container the kubelet restarts
// must not get the new GPU's node), and its re-prepare fails naming both
// UUIDs, releasing the record; asked again, it is prepared on the GPU the
// node has now.
func TestReviewDefect6ReplacedGPUIsStale(t *testing.T) {
	e := newEnv(t, draConfig(), testSnapshot(), nil)
	c := e.claim(t, "train", "uid-1", false, "gpu-0")
	if r := e.prepare(t, c); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	e.stop()
	swapped := testSnapshot()
	swapped.GPUs[0].UUID = "GPU-zzzzzzzz"
	e2 := newEnv(t, draConfig(), swapped, &e.dirs)
	c = e2.claim(t, "train", "uid-1", false, "gpu-0") // the new fake API server's
	if e2.spec(t, "uid-1") != nil {
		t.Error("the spec of a claim whose GPU was replaced stayed: /dev/nvidia0 is another GPU now")
	}
	r := e2.prepare(t, c)
	if !strings.Contains(r.GetError(), "device gpu-0 was prepared as GPU-aaaaaaaa at /dev/nvidia0, and is GPU-zzzzzzzz at /dev/nvidia0 now") || len(r.GetDevices()) != 0 {
		t.Fatalf("re-prepare on a replaced GPU: %v", r)
	}
	if e2.spec(t, "uid-1") != nil || e2.d.Prepared().Len() != 0 {
		t.Error("the stale preparation stayed")
	}
	if r := e2.prepare(t, c); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if devs := e2.d.Prepared().Devices(); len(devs) != 1 || devs[0].UUID != "GPU-zzzzzzzz" {
		t.Errorf("prepared afresh: %+v", devs)
	}
}

// mpsEnv is a driver with an MPS root whose Book is the real allocation
// table.
func mpsEnv(t *testing.T) (*testEnv, *tableBooker, Options) {
	t.Helper()
	root := t.TempDir()
	b := newTableBooker(stateOf(testSnapshot(), draConfig()))
	opts := Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"), RegistrationDir: filepath.Join(root, "r"),
		CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev", MPSRoot: filepath.Join(root, "mps"), Book: b.book}
	return newEnv(t, draConfig(), testSnapshot(), &opts), b, opts
}

// TestReviewDefect8MPSWaitHoldsNoLock: a prepare waiting for its claim's
// MPS daemon holds neither the driver's lock nor the helper's: another
// claim's Unprepare and Prepare and publishing finish while it waits (they
// waited for the whole of mpsWait, 15 s by default), and the waiting
// prepare finishes once the daemon's ready file is written.
func TestReviewDefect8MPSWaitHoldsNoLock(t *testing.T) {
	defer func(w time.Duration) { mpsWait = w }(mpsWait)
	mpsWait = 5 * time.Second
	e, _, _ := mpsEnv(t)
	other := e.claim(t, "other", "uid-other", false, "gpu-2")
	if r := e.prepare(t, other); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	raw := gpuConfigHead + `, "sharing": {"strategy": "MPS"}}`
	c := e.mpsClaim(t, "infer", "uid-mps", raw, "gpu-0")
	waiting := make(chan string, 1)
	go func() { waiting <- e.prepare(t, c).GetError() }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(checkpointText(t, e), "uid-mps") {
		if time.Now().After(deadline) {
			t.Fatal("the MPS claim never reached the checkpoint")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The MPS claim waits for its daemon now.
	e.unprepare(t, other)
	third := e.claim(t, "third", "uid-3", false, "gpu-2")
	r := e.prepare(t, third)
	e.d.publish(context.Background())
	select {
	case err := <-waiting:
		t.Fatalf("the MPS claim's prepare ended (%q) before another claim's unprepare and prepare could: they waited for its daemon", err)
	default:
	}
	if r.GetError() != "" {
		t.Errorf("another claim's prepare while the MPS claim waits: %v", r.GetError())
	}
	d := MPSDaemons(e.d.Prepared())["GPU-aaaaaaaa"]
	if d == nil {
		t.Fatal("no daemon planned for the MPS claim")
	}
	writeReady(t, "GPU-aaaaaaaa", d)
	if err := <-waiting; err != "" {
		t.Errorf("the MPS claim once its daemon is ready: %s", err)
	}
}

// TestMPSTimeoutStaysPrepared: a prepare that times out waiting for its
// MPS daemon leaves the claim prepared (in the checkpoint, its daemon
// planned for nri-gpu mps, its GPU booked), across a restart of the
// driver, until the kubelet unprepares it: then the checkpoint, the
// spec, the booking and the daemon's plan go. An unprepare while the
// prepare waits ends the wait.
func TestMPSTimeoutStaysPrepared(t *testing.T) {
	defer func(w time.Duration) { mpsWait = w }(mpsWait)
	mpsWait = 200 * time.Millisecond
	e, b, opts := mpsEnv(t)
	c := e.mpsClaim(t, "infer", "uid-mps", gpuConfigHead+`, "sharing": {"strategy": "MPS"}}`, "gpu-0")
	if r := e.prepare(t, c); !strings.Contains(r.GetError(), "its MPS control daemon is not ready") {
		t.Fatalf("prepare without a daemon: %v", r)
	}
	held := func(what string, want bool) {
		t.Helper()
		p, err := ReadPrepared(opts.PluginDir)
		if err != nil {
			t.Fatal(err)
		}
		inTable := strings.HasPrefix(alloc.Summary(b.table.State()), "0=exclusive[claim ml/infer]")
		if (p.Len() == 1) != want || (len(MPSDaemons(p)) == 1) != want || inTable != want {
			t.Errorf("%s: %d prepared devices, daemons %v, table %s; want held %v", what, p.Len(), MPSDaemons(p), alloc.Summary(b.table.State()), want)
		}
	}
	held("after the timeout", true)
	e.stop()
	e2 := newEnv(t, draConfig(), testSnapshot(), &opts)
	c = e2.mpsClaim(t, "infer", "uid-mps", gpuConfigHead+`, "sharing": {"strategy": "MPS"}}`, "gpu-0")
	held("after a restart", true)
	e2.unprepare(t, c)
	held("after the unprepare", false)
	if e2.spec(t, "uid-mps") != nil {
		t.Error("the unprepared claim's spec stayed")
	}
	// Unprepared while its prepare waits: the wait ends at once.
	mpsWait = time.Hour
	waiting := make(chan string, 1)
	go func() { waiting <- e2.prepare(t, c).GetError() }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(checkpointText(t, e2), "uid-mps") {
		if time.Now().After(deadline) {
			t.Fatal("the MPS claim never reached the checkpoint")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e2.unprepare(t, c)
	if err := <-waiting; !strings.Contains(err, "unprepared while waiting for its MPS control daemon") {
		t.Errorf("a prepare whose claim was unprepared while it waited: %q", err)
	}
}
