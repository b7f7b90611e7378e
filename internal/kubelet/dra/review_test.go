package dra

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

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
