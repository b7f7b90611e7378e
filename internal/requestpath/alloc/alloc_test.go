package alloc

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
)

func holder(name string) Holder {
	return Holder{ID: "ctr-" + name, PodID: "pod-" + name, Namespace: "default", Pod: name, Container: "main"}
}

// step is one request made to a table, and what it must give.
type step struct {
	name  string
	mode  sharing.Mode
	count int
	gpus  []int
	want  []int
	err   string // the whole message, when the request must fail
}

func TestAllocate(t *testing.T) {
	const src = "annotation gpus.nri-gpu.dev/pod"
	for _, tc := range []struct {
		name  string
		gpus  []int
		steps []step
	}{
		{"count prefers free GPUs, ties by index", []int{0, 1, 2, 3}, []step{
			{name: "a", mode: sharing.Shared, count: 2, want: []int{0, 1}},
			{name: "b", mode: sharing.Shared, count: 1, want: []int{2}},
			{name: "c", mode: sharing.Shared, count: 2, want: []int{0, 3}},
			{name: "d", mode: sharing.Shared, count: 4, want: []int{0, 1, 2, 3}},
		}},
		{"count prefers the least shared", []int{0, 1, 2}, []step{
			{name: "a", mode: sharing.Shared, gpus: []int{0, 1}, want: []int{0, 1}},
			{name: "b", mode: sharing.Shared, gpus: []int{0, 2}, want: []int{0, 2}},
			// holders: 0:2, 1:1, 2:1
			{name: "c", mode: sharing.Shared, count: 1, want: []int{1}},
			// holders: 0:2, 1:2, 2:1; of 0 and 1, the lower index
			{name: "d", mode: sharing.Shared, count: 2, want: []int{0, 2}},
		}},
		{"exclusive count takes only free GPUs", []int{0, 1, 2, 3}, []step{
			{name: "a", mode: sharing.Shared, count: 1, want: []int{0}},
			{name: "b", mode: sharing.Exclusive, count: 2, want: []int{1, 2}},
			{name: "c", mode: sharing.Exclusive, count: 2,
				err: "nri-gpu: " + src + ": exclusive request for 2 GPUs cannot be met: 1 of the node's 4 GPUs are free; held: GPU 0: default/a/main (shared); GPU 1: default/b/main (exclusive); GPU 2: default/b/main (exclusive)"},
			{name: "d", mode: sharing.Shared, count: 2, want: []int{0, 3}},
			{name: "e", mode: sharing.Shared, count: 3,
				err: "nri-gpu: " + src + ": shared request for 3 GPUs cannot be met: 2 of the node's 4 GPUs are free or shared; held: GPU 1: default/b/main (exclusive); GPU 2: default/b/main (exclusive)"},
		}},
		{"named GPUs against exclusive holders", []int{0, 1, 2, 3}, []step{
			{name: "a", mode: sharing.Exclusive, gpus: []int{2}, want: []int{2}},
			{name: "b", mode: sharing.Shared, gpus: []int{1, 2},
				err: "nri-gpu: " + src + ": GPU 2 is held exclusively by default/a/main (exclusive)"},
			{name: "c", mode: sharing.Shared, gpus: []int{1, 3, 1}, want: []int{1, 3}},
			{name: "d", mode: sharing.Exclusive, gpus: []int{0, 3},
				err: "nri-gpu: " + src + ": GPU 3 cannot be held exclusively: it is held by default/c/main (shared)"},
			{name: "e", mode: sharing.Exclusive, gpus: []int{0}, want: []int{0}},
			{name: "all", mode: sharing.Shared, gpus: []int{0, 1, 2, 3},
				err: "nri-gpu: " + src + ": GPU 0 is held exclusively by default/e/main (exclusive)"},
		}},
		{"node without GPUs", nil, []step{
			{name: "a", mode: sharing.Shared, count: 1,
				err: "nri-gpu: " + src + ": shared request for 1 GPU cannot be met: 0 of the node's 0 GPUs are free or shared"},
		}},
		{"a failed repeat keeps the old holding", []int{0, 1}, []step{
			{name: "a", mode: sharing.Exclusive, count: 1, want: []int{0}},
			{name: "b", mode: sharing.Exclusive, count: 1, want: []int{1}},
			{name: "a", mode: sharing.Exclusive, count: 2,
				err: "nri-gpu: " + src + ": exclusive request for 2 GPUs cannot be met: 1 of the node's 2 GPUs are free; held: GPU 1: default/b/main (exclusive)"},
			{name: "c", mode: sharing.Shared, count: 1,
				err: "nri-gpu: " + src + ": shared request for 1 GPU cannot be met: 0 of the node's 2 GPUs are free or shared; held: GPU 0: default/a/main (exclusive); GPU 1: default/b/main (exclusive)"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := New(tc.gpus)
			for _, s := range tc.steps {
				got, err := tbl.Allocate(Request{Holder: holder(s.name), Mode: s.mode, Count: s.count, GPUs: s.gpus, Source: src})
				if s.err != "" {
					if err == nil || err.Error() != s.err {
						t.Fatalf("%s: got %v, %v\nwant error %s", s.name, got, err, s.err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if !cmp.Equal(got, s.want) {
					t.Fatalf("%s: got GPUs %v, want %v", s.name, got, s.want)
				}
			}
		})
	}
}

func TestReleaseAndState(t *testing.T) {
	tbl := New([]int{0, 1, 2})
	mustAlloc := func(name string, m sharing.Mode, gpus ...int) {
		t.Helper()
		if _, err := tbl.Allocate(Request{Holder: holder(name), Mode: m, GPUs: gpus, Source: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	mustAlloc("a", sharing.Exclusive, 0)
	mustAlloc("b", sharing.Shared, 1)
	mustAlloc("c", sharing.Shared, 1, 2)
	// A second container of pod c.
	c2 := holder("c")
	c2.ID, c2.Container = "ctr-c2", "side"
	if _, err := tbl.Allocate(Request{Holder: c2, Mode: sharing.Shared, GPUs: []int{2}}); err != nil {
		t.Fatal(err)
	}
	if got, want := Summary(tbl.State()), "0=exclusive[default/a/main] 1=shared[default/b/main,default/c/main] 2=shared[default/c/main,default/c/side]"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
	if !tbl.Release("ctr-a") || tbl.Release("ctr-a") {
		t.Error("Release of a holder: want true then false")
	}
	if n := tbl.ReleasePod("pod-c"); n != 2 {
		t.Errorf("ReleasePod released %d containers, want 2", n)
	}
	if n := tbl.ReleasePod(""); n != 0 {
		t.Errorf("ReleasePod of no pod released %d", n)
	}
	want := []GPUState{
		{Index: 0, Mode: "free", Holders: []HolderState{}},
		{Index: 1, Mode: "shared", Holders: []HolderState{{Holder: holder("b"), Mode: "shared"}}},
		{Index: 2, Mode: "free", Holders: []HolderState{}},
	}
	if diff := cmp.Diff(want, tbl.State()); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	// An exclusive request can now have GPU 0 and 2.
	if got, err := tbl.Allocate(Request{Holder: holder("d"), Mode: sharing.Exclusive, Count: 2}); err != nil || !cmp.Equal(got, []int{0, 2}) {
		t.Errorf("after release: %v, %v", got, err)
	}
}

func TestRebuild(t *testing.T) {
	tbl := New([]int{0, 1, 2, 3})
	if _, err := tbl.Allocate(Request{Holder: holder("gone"), Mode: sharing.Exclusive, Count: 4}); err != nil {
		t.Fatal(err)
	}
	// The runtime reports two containers; one is not the plugin's and
	// breaks the rules together with another (both exclusive on GPU 1);
	// one holds a GPU the inventory no longer has.
	hs := []Holding{
		{Holder: holder("a"), Mode: sharing.Exclusive, GPUs: []int{1, 1}},
		{Holder: holder("b"), Mode: sharing.Exclusive, GPUs: []int{1}},
		{Holder: holder("c"), Mode: sharing.Shared, GPUs: []int{3, 2}},
		{Holder: holder("old"), Mode: sharing.Shared, GPUs: []int{7}},
	}
	tbl.Rebuild(hs)
	if got, want := Summary(tbl.State()), "0=free 1=exclusive[default/a/main,default/b/main] 2=shared[default/c/main] 3=shared[default/c/main] 7=shared[default/old/main]"; got != want {
		t.Errorf("after rebuild %q, want %q", got, want)
	}
	if hs[2].GPUs[0] != 3 {
		t.Error("Rebuild modified its argument")
	}
	got := tbl.Holdings()
	if len(got) != 4 || got[0].Holder.ID != "ctr-a" || !cmp.Equal(got[0].GPUs, []int{1}) || !cmp.Equal(got[2].GPUs, []int{2, 3}) {
		t.Errorf("holdings %+v", got)
	}
	if _, err := tbl.Allocate(Request{Holder: holder("x"), Mode: sharing.Shared, GPUs: []int{1}, Source: "s"}); err == nil ||
		err.Error() != "nri-gpu: s: GPU 1 is held exclusively by default/a/main (exclusive), default/b/main (exclusive)" {
		t.Errorf("GPU with two exclusive holders: %v", err)
	}
	if got, err := tbl.Allocate(Request{Holder: holder("y"), Mode: sharing.Exclusive, Count: 1}); err != nil || !cmp.Equal(got, []int{0}) {
		t.Errorf("free GPU after rebuild: %v, %v", got, err)
	}
}

func TestModeAndRecord(t *testing.T) {
	for _, s := range []string{"shared", "exclusive"} {
		m, err := sharing.ParseMode(s)
		if err != nil || m.String() != s {
			t.Errorf("sharing.ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := sharing.ParseMode("sharing.Exclusive"); err == nil || err.Error() != `unknown sharing mode "sharing.Exclusive" (valid: shared, exclusive)` {
		t.Errorf("ParseMode: %v", err)
	}
	r := Record{Mode: "exclusive", GPUs: []string{"GPU-a", "GPU-b"}}
	enc := r.Encode()
	if enc != `{"version":1,"mode":"exclusive","gpus":["GPU-a","GPU-b"]}` {
		t.Errorf("Encode = %s", enc)
	}
	got, m, err := DecodeRecord(enc)
	if want := (Record{Version: 1, Mode: r.Mode, GPUs: r.GPUs}); err != nil || m != sharing.Exclusive || !cmp.Equal(got, want) {
		t.Errorf("DecodeRecord = %+v, %v, %v", got, m, err)
	}
	for in, want := range map[string]string{
		`{"mode":"solo","gpus":[]}`: `annotation nri-gpu.dev/allocation: unknown sharing mode "solo" (valid: shared, exclusive)`,
		`0,1`:                       `annotation nri-gpu.dev/allocation: "0,1": invalid character ',' after top-level value`,
		`{"version":2,"mode":"shared","gpus":["GPU-a"],"lease":"x"}`: "annotation nri-gpu.dev/allocation: record version 2, which this nri-gpu cannot read " +
			"(it reads versions up to 1; a newer nri-gpu wrote it?)",
		`{"version":-1,"mode":"shared","gpus":["GPU-a"]}`: "annotation nri-gpu.dev/allocation: record version -1, which this nri-gpu cannot read " +
			"(it reads versions up to 1; a newer nri-gpu wrote it?)",
	} {
		if _, _, err := DecodeRecord(in); err == nil || err.Error() != want {
			t.Errorf("DecodeRecord(%s) = %v, want %s", in, err, want)
		}
	}
	if s := (Holder{ID: "abc"}).String(); s != "container abc" {
		t.Errorf("unnamed holder: %q", s)
	}
}

// TestConcurrentExclusive fires 200 concurrent count requests at 8 GPUs in
// exclusive mode, with releases mixed in: exactly 8 succeed while nothing
// is released, and no GPU ever has two holders.
func TestConcurrentExclusive(t *testing.T) {
	tbl := New([]int{0, 1, 2, 3, 4, 5, 6, 7})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, failed int
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := tbl.Allocate(Request{Holder: holder(fmt.Sprint(i)), Mode: sharing.Exclusive, Count: 1, Source: "test"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if !strings.Contains(err.Error(), "0 of the node's 8 GPUs are free") {
					t.Errorf("unexpected error %v", err)
				}
				failed++
			} else {
				ok++
			}
		}()
	}
	wg.Wait()
	if ok != 8 || failed != 192 {
		t.Errorf("%d requests met, %d refused; want 8 and 192", ok, failed)
	}
	for _, r := range tbl.State() {
		if len(r.Holders) != 1 || r.Mode != "exclusive" {
			t.Errorf("GPU %d: %+v", r.Index, r)
		}
	}

	// Requests and releases racing: at every moment each GPU has at most
	// one holder.
	tbl = New([]int{0, 1, 2, 3, 4, 5, 6, 7})
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := holder(fmt.Sprint(i))
			if _, err := tbl.Allocate(Request{Holder: h, Mode: sharing.Exclusive, Count: 1 + i%2}); err == nil {
				for _, r := range tbl.State() {
					if len(r.Holders) > 1 {
						t.Errorf("GPU %d has %d holders", r.Index, len(r.Holders))
					}
				}
				tbl.Release(h.ID)
			}
		}()
	}
	wg.Wait()
	if s := Summary(tbl.State()); s != "0=free 1=free 2=free 3=free 4=free 5=free 6=free 7=free" {
		t.Errorf("after all releases: %s", s)
	}
}

// BenchmarkAllocateContention measures an exclusive count request and its
// release on 8 GPUs with 1, 8 and 64 goroutines doing the same at once.
func BenchmarkAllocateContention(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("concurrent=%d", n), func(b *testing.B) {
			tbl := New([]int{0, 1, 2, 3, 4, 5, 6, 7})
			holders := make([]Holder, n)
			for i := range holders {
				holders[i] = holder(fmt.Sprint(i))
			}
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N / n
			for w := range n {
				k := per
				if w == 0 {
					k += b.N % n
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := Request{Holder: holders[w], Mode: sharing.Exclusive, Count: 1}
					for range k {
						if _, err := tbl.Allocate(r); err == nil {
							tbl.Release(r.Holder.ID)
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// TestRecordEncode checks that the fast encoder writes what encoding/json
// writes, and that values needing escapes still round-trip.
func TestRecordEncode(t *testing.T) {
	for _, r := range []Record{
		{Mode: "shared", GPUs: []string{"GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7", "GPU-00000000-1111-2222-3333-444444444444"}},
		{Mode: "exclusive", GPUs: []string{"0", "card_1.x:y"}},
		{Mode: "shared", GPUs: []string{`we"ird\<name>`, "é"}},
		{Mode: "shared"},
	} {
		versioned := r
		versioned.Version = RecordVersion
		want, _ := json.Marshal(versioned)
		if got := r.Encode(); got != string(want) {
			t.Errorf("Encode() = %s, want %s", got, want)
		}
		back, _, err := DecodeRecord(r.Encode())
		if err != nil || !slices.Equal(back.GPUs, r.GPUs) {
			t.Errorf("round trip of %+v: %+v, %v", r, back, err)
		}
	}
}

// TestRecordBeforeVersions: records as nri-gpu wrote them before records
// had a version (copied verbatim from the annotations that commit e1d7dc6
// wrote for a container's and a pod's request) still decode, as version 0
// with the same meaning, so that a node upgraded from there keeps its
// holdings.
func TestRecordBeforeVersions(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Record
	}{
		{`{"mode":"shared","gpus":["GPU-00000001-558d-fb20-8eca-25de8b98f5a7","GPU-00000003-558d-fb20-8eca-25de8b98f5a7"]}`,
			Record{Mode: "shared", GPUs: []string{"GPU-00000001-558d-fb20-8eca-25de8b98f5a7", "GPU-00000003-558d-fb20-8eca-25de8b98f5a7"}}},
		{`{"mode":"shared","gpus":["GPU-00000001-558d-fb20-8eca-25de8b98f5a7","GPU-00000003-558d-fb20-8eca-25de8b98f5a7"],"pod":true}`,
			Record{Mode: "shared", GPUs: []string{"GPU-00000001-558d-fb20-8eca-25de8b98f5a7", "GPU-00000003-558d-fb20-8eca-25de8b98f5a7"}, Pod: true}},
	} {
		got, m, err := DecodeRecord(tc.in)
		if err != nil || m != sharing.Shared {
			t.Errorf("DecodeRecord(%s): mode %v, %v", tc.in, m, err)
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("DecodeRecord(%s) (-want +got):\n%s", tc.in, d)
		}
	}
}

// TestRefusalNamesNoOtherTenant: a refusal, which the runtime shows to the
// pod, names holders of the requester's namespace only; Logged, for
// nri-gpu's own log, names every holder.
func TestRefusalNamesNoOtherTenant(t *testing.T) {
	in := func(ns, name string) Holder {
		return Holder{ID: "ctr-" + name, PodID: "pod-" + name, Namespace: ns, Pod: name, Container: "main"}
	}
	tbl := New([]int{0, 1, 2})
	for _, r := range []Request{
		{Holder: in("team-a", "secret-train"), Mode: sharing.Exclusive, GPUs: []int{0}},
		{Holder: in("team-b", "mine"), Mode: sharing.Shared, GPUs: []int{1}},
		{Holder: in("team-a", "infer-1"), Mode: sharing.Shared, GPUs: []int{1, 2}},
		{Holder: in("team-a", "infer-2"), Mode: sharing.Shared, GPUs: []int{1}},
	} {
		if _, err := tbl.Allocate(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name      string
		r         Request
		pod, full string
	}{
		{"named GPU held exclusively in another namespace",
			Request{Holder: in("team-b", "x"), Mode: sharing.Shared, GPUs: []int{0}, Source: "s"},
			"nri-gpu: s: GPU 0 is held exclusively by a pod in another namespace (exclusive)",
			"nri-gpu: s: GPU 0 is held exclusively by team-a/secret-train/main (exclusive)"},
		{"same namespace: named",
			Request{Holder: in("team-a", "x"), Mode: sharing.Shared, GPUs: []int{0}, Source: "s"},
			"nri-gpu: s: GPU 0 is held exclusively by team-a/secret-train/main (exclusive)",
			"nri-gpu: s: GPU 0 is held exclusively by team-a/secret-train/main (exclusive)"},
		{"exclusive request: own namespace named, others counted",
			Request{Holder: in("team-b", "x"), Mode: sharing.Exclusive, GPUs: []int{1}, Source: "s"},
			"nri-gpu: s: GPU 1 cannot be held exclusively: it is held by team-b/mine/main (shared), 2 pods in other namespaces (shared)",
			"nri-gpu: s: GPU 1 cannot be held exclusively: it is held by team-b/mine/main (shared), team-a/infer-1/main (shared), team-a/infer-2/main (shared)"},
		{"count shortage",
			Request{Holder: in("team-c", "x"), Mode: sharing.Exclusive, Count: 1, Source: "s"},
			"nri-gpu: s: exclusive request for 1 GPU cannot be met: 0 of the node's 3 GPUs are free; held: GPU 0: a pod in another namespace (exclusive); GPU 1: 3 pods in other namespaces (shared); GPU 2: a pod in another namespace (shared)",
			"nri-gpu: s: exclusive request for 1 GPU cannot be met: 0 of the node's 3 GPUs are free; held: GPU 0: team-a/secret-train/main (exclusive); GPU 1: team-b/mine/main (shared), team-a/infer-1/main (shared), team-a/infer-2/main (shared); GPU 2: team-a/infer-1/main (shared)"},
	} {
		_, err := tbl.Allocate(tc.r)
		var ae *Error
		if !errors.As(err, &ae) {
			t.Fatalf("%s: %v, want an *Error", tc.name, err)
		}
		if err.Error() != tc.pod {
			t.Errorf("%s: message to the pod\n%s\nwant\n%s", tc.name, err, tc.pod)
		}
		if ae.Logged() != tc.full {
			t.Errorf("%s: message to the log\n%s\nwant\n%s", tc.name, ae.Logged(), tc.full)
		}
		if cerr := tbl.Check(tc.r); cerr == nil || cerr.Error() != tc.pod {
			t.Errorf("%s: Check = %v, want %s", tc.name, cerr, tc.pod)
		}
	}
}

// TestCheck: Check answers as Allocate would, and books nothing.
func TestCheck(t *testing.T) {
	tbl := New([]int{0, 1})
	if _, err := tbl.Allocate(Request{Holder: holder("a"), Mode: sharing.Exclusive, GPUs: []int{1}}); err != nil {
		t.Fatal(err)
	}
	before := Summary(tbl.State())
	if err := tbl.Check(Request{Holder: holder("m"), Mode: sharing.Shared, GPUs: []int{0}}); err != nil {
		t.Errorf("Check of a free GPU: %v", err)
	}
	if err := tbl.Check(Request{Holder: holder("m"), Mode: sharing.Shared, GPUs: []int{0, 1}, Source: "s"}); err == nil ||
		err.Error() != "nri-gpu: s: GPU 1 is held exclusively by default/a/main (exclusive)" {
		t.Errorf("Check of an exclusively held GPU: %v", err)
	}
	if after := Summary(tbl.State()); after != before {
		t.Errorf("Check changed the table: %s, was %s", after, before)
	}
}

// TestMIGUnits: MIG devices are units of their own: a count picks whole
// GPUs only, booking one MIG device leaves its siblings free, and the
// summary names them <gpu>:<mig>.
func TestMIGUnits(t *testing.T) {
	m00, m01 := inventory.MIGKey(0, 0), inventory.MIGKey(0, 1)
	tb := New([]int{1, m00, m01})
	if _, err := tb.Allocate(Request{Holder: Holder{ID: "a"}, Mode: sharing.Exclusive, GPUs: []int{m00}, Source: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Allocate(Request{Holder: Holder{ID: "b"}, Mode: sharing.Exclusive, GPUs: []int{m01}, Source: "test"}); err != nil {
		t.Fatalf("a sibling: %v", err)
	}
	got, err := tb.Allocate(Request{Holder: Holder{ID: "c"}, Mode: sharing.Exclusive, Count: 1, Source: "test"})
	if err != nil || len(got) != 1 || got[0] != 1 {
		t.Fatalf("count 1 = %v, %v; want GPU 1", got, err)
	}
	_, err = tb.Allocate(Request{Holder: Holder{ID: "d"}, Mode: sharing.Shared, Count: 1, Source: "test"})
	if err == nil || !strings.Contains(err.Error(), "0 of the node's 1 GPUs are free or shared") {
		t.Errorf("count over the whole GPUs: %v", err)
	}
	if s := Summary(tb.State()); s != "1=exclusive[container c] 0:0=exclusive[container a] 0:1=exclusive[container b]" {
		t.Errorf("summary %q", s)
	}
}

// TestUnhealthySkipped: count requests skip unhealthy GPUs, and the
// refusal says why; named requests and the table's rows show them.
func TestUnhealthySkipped(t *testing.T) {
	tb := New([]int{0, 1})
	tb.SetUnhealthy(map[int]string{0: "XID 79"})
	got, err := tb.Allocate(Request{Holder: Holder{ID: "a"}, Mode: sharing.Exclusive, Count: 1, Source: "test"})
	if err != nil || len(got) != 1 || got[0] != 1 {
		t.Fatalf("count 1 = %v, %v; want GPU 1", got, err)
	}
	_, err = tb.Allocate(Request{Holder: Holder{ID: "b"}, Mode: sharing.Shared, Count: 1, Source: "test"})
	if err == nil || !strings.Contains(err.Error(), "; unhealthy: GPU 0: XID 79") {
		t.Errorf("count with only an unhealthy GPU left: %v", err)
	}
	if s := Summary(tb.State()); s != "0=free(unhealthy) 1=exclusive[container a]" {
		t.Errorf("summary %q", s)
	}
}

// TestReplicated: a GPU the device plugin hands out as replicas
// (SetReplicated) is shared by construction. The kubelet's replicas of it
// are booked whatever their request's mode, and share it with each other
// and with what the runtime gave; a count never gets it, whole or
// exclusively; a request that names it of its own (device=, exclusive=)
// is refused, saying what it is shared as; a management container may see
// it; the table's rows show it shared, and every holder of it shared.
func TestReplicated(t *testing.T) {
	const as = "4 time-slicing replicas of nvidia.com/gpu"
	tbl := New([]int{0, 1, 2})
	tbl.SetReplicated(map[int]string{0: as})
	kub := holder
	for _, s := range []struct {
		name string
		req  Request
		want []int
		err  string
	}{
		{"a replica, on a node whose mode is exclusive", Request{Holder: kub("k1"), Mode: sharing.Exclusive, GPUs: []int{0}, Kubelet: true}, []int{0}, ""},
		{"another replica", Request{Holder: kub("k2"), Mode: sharing.Exclusive, GPUs: []int{0}, Kubelet: true}, []int{0}, ""},
		{"a replica and a whole GPU", Request{Holder: kub("k3"), Mode: sharing.Exclusive, GPUs: []int{0, 1}, Kubelet: true}, []int{0, 1}, ""},
		{"the runtime's gift", Request{Holder: kub("r"), Mode: sharing.Shared, GPUs: []int{0}, Runtime: true}, []int{0}, ""},
		{"a count", Request{Holder: kub("c"), Mode: sharing.Shared, Count: 2, Source: "test"}, nil,
			"nri-gpu: test: shared request for 2 GPUs cannot be met: 1 of the node's 3 GPUs are free or shared; held: GPU 1: default/k3/main (exclusive); shared as the device plugin's replicas: GPU 0: " + as},
		{"a count that fits", Request{Holder: kub("c"), Mode: sharing.Exclusive, Count: 1, Source: "test"}, []int{2}, ""},
		{"named", Request{Holder: kub("n"), Mode: sharing.Shared, GPUs: []int{0}, Source: "test"}, nil,
			"nri-gpu: test: GPU 0 is shared as " + as + " (devicePlugin.sharing): it is handed out only as the device plugin's replicas, never whole or exclusively"},
		{"named exclusively", Request{Holder: kub("x"), Mode: sharing.Exclusive, GPUs: []int{0}, Source: "test"}, nil,
			"nri-gpu: test: GPU 0 is shared as " + as + " (devicePlugin.sharing): it is handed out only as the device plugin's replicas, never whole or exclusively"},
	} {
		got, err := tbl.Allocate(s.req)
		if fmt.Sprint(err) != fmt.Sprint(map[bool]any{true: nil, false: s.err}[s.err == ""]) || !slices.Equal(got, s.want) {
			t.Errorf("%s: %v, %v; want %v, %q", s.name, got, err, s.want, s.err)
		}
	}
	if err := tbl.Check(Request{Holder: kub("m"), Mode: sharing.Shared, GPUs: []int{0}, Source: "test"}); err != nil {
		t.Errorf("a management container's view of the replicated GPU: %v", err)
	}
	if _, _, err := tbl.Join(Request{Holder: PodHolder("p", "default", "p"), Member: "m", Mode: sharing.Shared, GPUs: []int{0}, Source: "test"}); err == nil {
		t.Error("a pod-level request named the replicated GPU")
	}
	shared := func(name string, kubelet bool) HolderState {
		return HolderState{Holder: kub(name), Mode: "shared", Kubelet: kubelet, Runtime: true}
	}
	want := []GPUState{
		{Index: 0, Mode: "shared", Replicated: as, Holders: []HolderState{shared("k1", true), shared("k2", true), shared("k3", true), shared("r", false)}},
		{Index: 1, Mode: "exclusive", Holders: []HolderState{{Holder: kub("k3"), Mode: "exclusive", Kubelet: true, Runtime: true}}},
		{Index: 2, Mode: "exclusive", Holders: []HolderState{{Holder: kub("c"), Mode: "exclusive"}}},
	}
	if d := cmp.Diff(want, tbl.State()); d != "" {
		t.Errorf("state (-want +got):\n%s", d)
	}
	if got, want := Summary(tbl.State()), "0=shared(replicas)[kubelet:default/k1/main,kubelet:default/k2/main,kubelet:default/k3/main,default/r/main] 1=exclusive[kubelet:default/k3/main] 2=exclusive[default/c/main]"; got != want {
		t.Errorf("summary %s\nwant    %s", got, want)
	}
}

// TestSyncClaims: prepared claims' holdings are added and released as a
// set, leave every other holding alone, and a claim being prepared is
// first checked as a request: it is refused, naming the holder, where a
// node-local holding has one of its GPUs exclusively (or it is exclusive
// and another holds one), and nothing changes then. A claim's holding is
// no container's: releasing containers and pods leaves it.
func TestSyncClaims(t *testing.T) {
	tbl := New([]int{0, 1, 2, 3})
	if _, err := tbl.Allocate(Request{Holder: holder("x"), Mode: sharing.Exclusive, GPUs: []int{3}, Source: "s"}); err != nil {
		t.Fatal(err)
	}
	a := Holding{Holder: ClaimHolder("uid-a", "ml", "train"), Mode: sharing.Exclusive, GPUs: []int{2, 0, 0}, Runtime: true}
	b := Holding{Holder: ClaimHolder("uid-b", "ml", "probe"), Mode: sharing.Exclusive, GPUs: []int{1}, Runtime: true}
	if err := tbl.SyncClaims([]Holding{a}, "claim:uid-a"); err != nil {
		t.Fatal(err)
	}
	if err := tbl.SyncClaims([]Holding{a, b}, "claim:uid-b"); err != nil {
		t.Fatal(err)
	}
	want := "0=exclusive[claim ml/train] 1=exclusive[claim ml/probe] 2=exclusive[claim ml/train] 3=exclusive[default/x/main]"
	if got := Summary(tbl.State()); got != want {
		t.Errorf("two claims: %s\nwant %s", got, want)
	}
	if a.GPUs[0] != 2 {
		t.Error("SyncClaims modified its argument")
	}
	// A count of a node-local request does not get them; naming one is
	// refused, naming the claim.
	if _, err := tbl.Allocate(Request{Holder: holder("y"), Mode: sharing.Shared, Count: 1, Source: "s"}); err == nil {
		t.Error("a count got a claim's GPU")
	}
	mine := Holder{ID: "ctr-y", PodID: "pod-y", Namespace: "ml", Pod: "y", Container: "main"}
	if _, err := tbl.Allocate(Request{Holder: mine, Mode: sharing.Shared, GPUs: []int{0}, Source: "s"}); err == nil ||
		!strings.Contains(err.Error(), "GPU 0 is held exclusively by claim ml/train") {
		t.Errorf("named GPU of a claim: %v", err)
	}
	// Of another namespace, the claim is not named.
	if _, err := tbl.Allocate(Request{Holder: holder("y"), Mode: sharing.Shared, GPUs: []int{0}, Source: "s"}); err == nil ||
		err.Error() != "nri-gpu: s: GPU 0 is held exclusively by a pod in another namespace (exclusive)" {
		t.Errorf("named GPU of another namespace's claim: %v", err)
	}
	// A claim on the node-local exclusive holder's GPU is refused; the
	// table stays as it was.
	c := Holding{Holder: ClaimHolder("uid-c", "ml", "late"), Mode: sharing.Shared, GPUs: []int{3}, Runtime: true}
	err := tbl.SyncClaims([]Holding{a, b, c}, "claim:uid-c")
	var ae *Error
	if !errors.As(err, &ae) || ae.Error() != "nri-gpu: claim ml/late: GPU 3 is held exclusively by a pod in another namespace (exclusive)" ||
		!strings.Contains(ae.Logged(), "default/x/main") {
		t.Errorf("claim on an exclusive GPU: %v", err)
	}
	if got := Summary(tbl.State()); got != want {
		t.Errorf("after a refused claim: %s\nwant %s", got, want)
	}
	// Containers and pods going leave the claims; a claim that the set
	// lacks is released, whatever else holds.
	tbl.Release("claim:uid-b")
	tbl.ReleasePod("")
	if tbl.Leave("claim:uid-a") {
		t.Error("Leave took a claim's holding")
	}
	if err := tbl.SyncClaims([]Holding{b}, ""); err != nil {
		t.Fatal(err)
	}
	want = "0=free 1=exclusive[claim ml/probe] 2=free 3=exclusive[default/x/main]"
	if got := Summary(tbl.State()); got != want {
		t.Errorf("claim a unprepared: %s\nwant %s", got, want)
	}
	if err := tbl.SyncClaims(nil, ""); err != nil {
		t.Fatal(err)
	}
	if got, want := Summary(tbl.State()), "0=free 1=free 2=free 3=exclusive[default/x/main]"; got != want {
		t.Errorf("no claims: %s\nwant %s", got, want)
	}
}

// TestReviewDefect4ClaimGPUNotJoinable: a GPU that claims hold shared
// (memory shares of it, booked shared whatever the node's mode) is not
// joined by a holder that is not a claim, in shared mode either, nor by
// the runtime's or the kubelet's gift of it; another claim joins it, and
// a management check (which holds nothing) still passes beside it.
func TestReviewDefect4ClaimGPUNotJoinable(t *testing.T) {
	tbl := New([]int{0, 1, 2, 3})
	shareA := Holding{Holder: ClaimHolder("uid-a", "ml", "share-a"), Mode: sharing.Shared, GPUs: []int{2}, Runtime: true}
	if err := tbl.SyncClaims([]Holding{shareA}, "claim:uid-a"); err != nil {
		t.Fatal(err)
	}
	before := Summary(tbl.State())
	intruder := Holder{ID: "ctr-i", PodID: "pod-i", Namespace: "other", Pod: "intruder", Container: "main"}
	for _, r := range []Request{
		{Holder: intruder, Mode: sharing.Shared, GPUs: []int{2}, Source: "annotation gpus.nri-gpu.dev/pod"},
		{Holder: intruder, Mode: sharing.Shared, GPUs: []int{2}, Source: "runtime", Runtime: true},
		{Holder: intruder, Mode: sharing.Shared, GPUs: []int{2}, Source: "kubelet", Kubelet: true},
	} {
		_, err := tbl.Allocate(r)
		if want := "nri-gpu: " + r.Source + ": GPU 2 is held by a pod in another namespace (shared): a GPU that a ResourceClaim holds is reached only through that claim"; err == nil || err.Error() != want {
			t.Errorf("%s: %v\nwant %s", r.Source, err, want)
		}
		if _, _, err := tbl.Join(r); err == nil {
			t.Errorf("%s: joined a claim's GPU", r.Source)
		}
	}
	if got := Summary(tbl.State()); got != before {
		t.Errorf("table %s\nwant %s", got, before)
	}
	if err := tbl.Check(Request{Holder: intruder, Mode: sharing.Shared, GPUs: []int{0, 1, 2, 3}, Source: "management"}); err != nil {
		t.Errorf("management beside a shared claim: %v", err)
	}
	shareB := Request{Holder: ClaimHolder("uid-b", "ml", "share-b"), Mode: sharing.Shared, GPUs: []int{2}, Source: "claim ml/share-b", Runtime: true}
	if _, _, err := tbl.Join(shareB); err != nil {
		t.Errorf("a second claim's share: %v", err)
	}
	if got, want := Summary(tbl.State()), "0=free 1=free 2=shared[claim ml/share-a,claim ml/share-b] 3=free"; got != want {
		t.Errorf("table %s\nwant %s", got, want)
	}
}

// TestSyncClaimsDropsGoneFirst: a claim that the new set lacks (released
// as stale by the DRA driver) no longer counts when the claim being
// prepared is checked; when that claim is refused for another GPU, the
// table keeps the claim it would have dropped.
func TestSyncClaimsDropsGoneFirst(t *testing.T) {
	tbl := New([]int{0, 1, 2})
	old := Holding{Holder: ClaimHolder("uid-old", "ml", "old"), Mode: sharing.Exclusive, GPUs: []int{0}, Runtime: true}
	if err := tbl.SyncClaims([]Holding{old}, "claim:uid-old"); err != nil {
		t.Fatal(err)
	}
	if _, err := tbl.Allocate(Request{Holder: holder("x"), Mode: sharing.Exclusive, GPUs: []int{2}, Source: "s"}); err != nil {
		t.Fatal(err)
	}
	both := Holding{Holder: ClaimHolder("uid-both", "ml", "both"), Mode: sharing.Exclusive, GPUs: []int{0, 2}, Runtime: true}
	if err := tbl.SyncClaims([]Holding{both}, "claim:uid-both"); err == nil || !strings.Contains(err.Error(), "GPU 2 cannot be held exclusively") {
		t.Errorf("a claim of a node-local holder's GPU: %v", err)
	}
	want := "0=exclusive[claim ml/old] 1=free 2=exclusive[default/x/main]"
	if got := Summary(tbl.State()); got != want {
		t.Errorf("after a refused claim: %s\nwant %s", got, want)
	}
	busy := Holding{Holder: ClaimHolder("uid-busy", "ml", "busy"), Mode: sharing.Exclusive, GPUs: []int{0}, Runtime: true}
	if err := tbl.SyncClaims([]Holding{busy}, "claim:uid-busy"); err != nil {
		t.Fatalf("a claim of a GPU whose claim the set drops: %v", err)
	}
	want = "0=exclusive[claim ml/busy] 1=free 2=exclusive[default/x/main]"
	if got := Summary(tbl.State()); got != want {
		t.Errorf("stale claim replaced: %s\nwant %s", got, want)
	}
}
