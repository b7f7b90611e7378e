package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/bench"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// scaleOptIn is the env var that runs TestSchedulerScale: the node
// counts, ascending ("100 500 1000"; make bench-scale sets it).
const scaleOptIn = "NRI_GPU_SCALE"

// Its other settings: rounds (default 3), and a directory the results
// (results.json) and the table (table.md) are written to.
const (
	scaleRoundsEnv = "NRI_GPU_SCALE_ROUNDS"
	scaleOutEnv    = "NRI_GPU_SCALE_OUT"
)

// scaleCaptureEnv set to 0 keeps NVIDIA's shape as its source publishes
// it; else TestSchedulerScale captures NVIDIA's real driver's slices
// first (captureNVIDIA), unless CapturedEnv names captured ones.
const scaleCaptureEnv = "NRI_GPU_SCALE_NVIDIA_CAPTURE"

// scaleBudgetEnv, Go durations ("25m"), ends a node count's rounds early
// where another would pass its budget (Plan.Budget): as many rounds as
// fit. One duration is every node count's; several are one a node count
// in order, 0 for none ("0 14m": every round at the first count, 14
// minutes' worth at the second).
const scaleBudgetEnv = "NRI_GPU_SCALE_BUDGET"

// scaleBudgets reads scaleBudgetEnv for n node counts.
func scaleBudgets(t *testing.T, n int) []time.Duration {
	t.Helper()
	out := make([]time.Duration, n)
	f := strings.Fields(os.Getenv(scaleBudgetEnv))
	if len(f) == 0 {
		return out
	}
	if len(f) != 1 && len(f) != n {
		t.Fatalf("%s=%q: one duration, or one for each of the %d node counts", scaleBudgetEnv, os.Getenv(scaleBudgetEnv), n)
	}
	for i := range out {
		v := f[min(i, len(f)-1)]
		d, err := time.ParseDuration(v)
		if v == "0" {
			d, err = 0, nil
		}
		if err != nil || d < 0 {
			t.Fatalf("%s=%q: %q is not a duration (25m)", scaleBudgetEnv, os.Getenv(scaleBudgetEnv), v)
		}
		out[i] = d
	}
	return out
}

// scaleFeaturesEnv and scaleFillsEnv narrow a run (a big node count on a
// loaded machine): the claim kinds by key (plain cel share mig; default
// all) and the fills in percent (default "0 50 90").
const (
	scaleFeaturesEnv = "NRI_GPU_SCALE_FEATURES"
	scaleFillsEnv    = "NRI_GPU_SCALE_FILLS"
)

// featureKeys are the keys of scaleFeaturesEnv.
var featureKeys = map[string]Feature{"plain": Plain, "cel": CEL, "share": Share, "mig": MIGDevice}

// scalePlan reads scaleFeaturesEnv and scaleFillsEnv.
func scalePlan(t *testing.T) (feats []Feature, fills []float64) {
	t.Helper()
	feats = allFeatures
	if v := strings.Fields(os.Getenv(scaleFeaturesEnv)); len(v) > 0 {
		feats = nil
		for _, k := range v {
			f, ok := featureKeys[k]
			if !ok {
				t.Fatalf("%s=%q: %q is not one of plain, cel, share, mig", scaleFeaturesEnv, os.Getenv(scaleFeaturesEnv), k)
			}
			feats = append(feats, f)
		}
	}
	fills = []float64{0, 0.5, 0.9}
	if v := strings.Fields(os.Getenv(scaleFillsEnv)); len(v) > 0 {
		fills = nil
		for _, k := range v {
			p, err := strconv.Atoi(k)
			if err != nil || p < 0 || p > 90 {
				t.Fatalf("%s=%q: %q is not a fill in percent, 0 to 90", scaleFillsEnv, os.Getenv(scaleFillsEnv), k)
			}
			fills = append(fills, float64(p)/100)
		}
	}
	return feats, fills
}

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a control plane in a network namespace of its own, and simulated nodes with real device nodes (CI runs as root)")
	}
}

// shapes are nri-gpu's and NVIDIA's shapes of a fresh inventory, NVIDIA's
// from captured slices where CapturedEnv names them.
func shapes(t *testing.T) []*Shape {
	t.Helper()
	inv := discover(t)
	nri, err := NRIGPU(inv)
	if err != nil {
		t.Fatal(err)
	}
	nv := NVIDIA(inv)
	if dir := os.Getenv(CapturedEnv); dir != "" {
		if err := Captured(nv, dir); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*Shape{nri, nv} {
		t.Logf("shape %s: %s", s.Name, s.Source)
	}
	return []*Shape{nri, nv}
}

// podsFor is how many pods one measurement on n nodes creates: 30% of
// the nodes, at least 50 and at most 300 (a 90% fill of whole GPUs
// leaves 80% of the node count free); $NRI_GPU_SCALE_PODS, when set, for
// every node count.
func podsFor(t *testing.T, n int) int {
	v := os.Getenv(scalePodsEnv)
	if v == "" {
		return min(max(50, n*3/10), 300)
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < 1 {
		t.Fatalf("%s=%q: not a number of pods", scalePodsEnv, v)
	}
	return p
}

// scalePodsEnv sets how many pods a measurement creates (podsFor). Whole
// GPUs at a 90% fill leave 80% of the node count free: more pods than
// that would wait for devices, and the measurement fails at its timeout.
const scalePodsEnv = "NRI_GPU_SCALE_PODS"

// allFeatures are the claim kinds measured.
var allFeatures = []Feature{Plain, CEL, Share, MIGDevice}

// TestSchedulerScale is make bench-scale: for each node count of
// $NRI_GPU_SCALE (ascending, on one cluster that grows), the scheduler's
// claim pods a second at 0, 50 and 90% fill for each feature, nri-gpu's
// published devices and NVIDIA's side by side, the rounds interleaved,
// and pods without GPUs on a GPU-less cluster as the baseline; then a
// table of them.
func TestSchedulerScale(t *testing.T) {
	var counts []int
	for _, f := range strings.Fields(os.Getenv(scaleOptIn)) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: %q is not a node count", scaleOptIn, os.Getenv(scaleOptIn), f)
		}
		counts = append(counts, n)
	}
	if len(counts) == 0 {
		t.Skipf("runs only with %s=<node counts> (make bench-scale: \"100 500 1000\")", scaleOptIn)
	}
	needRoot(t)
	rounds := 4
	if v := os.Getenv(scaleRoundsEnv); v != "" {
		var err error
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			t.Fatalf("%s=%q: not a number of rounds", scaleRoundsEnv, v)
		}
	}
	feats, fills := scalePlan(t)
	budgets := scaleBudgets(t, len(counts))
	sh := shapes(t)
	ctx := context.Background()
	c := startCluster(t, ctx, counts[0], sh, true)
	if os.Getenv(scaleCaptureEnv) != "0" && os.Getenv(CapturedEnv) == "" {
		captureNVIDIA(t, ctx, c, sh[1])
	}
	var all []Result
	for i, n := range counts {
		if err := c.AddNodes(ctx, n); err != nil {
			t.Fatal(err)
		}
		start, load := time.Now(), LoadAvg()
		rs, err := c.Run(ctx, Plan{Fills: fills, Features: feats, Rounds: rounds, Pods: podsFor(t, n), Budget: budgets[i]}, sh)
		all = append(all, rs...)
		writeResults(t, all, sh)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d nodes: %s, load average %s before, %s after", n, time.Since(start).Round(time.Second), load, LoadAvg())
	}
	t.Logf("\n%s", Table(all, sh[0].Name, sh[1].Name))
}

// captureNVIDIA runs NVIDIA's real driver on the simulated nodes against
// c (Cluster.CaptureInto) and makes its slices nv's devices, logging how
// they differ from the source-read shape; the slices and the comparison
// go to $NRI_GPU_SCALE_OUT/nvidia-slices (or a temporary directory).
func captureNVIDIA(t *testing.T, ctx context.Context, c *Cluster, nv *Shape) {
	t.Helper()
	bin, err := harness.InstallNVIDIADRA(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if out := os.Getenv(scaleOutEnv); out != "" {
		dir = filepath.Join(out, "nvidia-slices")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Only written into the CDI specs of prepares, which the capture
	// makes none of.
	hook := filepath.Join(harness.DefaultCacheDir(), "nvidia-container-toolkit-"+bench.ToolkitVersion, "nvidia-cdi-hook")
	diffs, err := c.CaptureInto(ctx, nv, discover(t), bin, hook, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range Variants {
		t.Logf("NVIDIA's captured %s devices against the source-read shape: %d differences", v, len(diffs[v]))
		for _, d := range diffs[v] {
			t.Logf("  %s", d)
		}
	}
	t.Logf("shape %s: %s", nv.Name, nv.Source)
}

// startCluster starts the bench's cluster of n nodes, kwok's or kept
// Ready by the bench, with the shapes' DeviceClasses, stopped when the
// test ends.
func startCluster(t *testing.T, ctx context.Context, n int, sh []*Shape, kwok bool) *Cluster {
	t.Helper()
	start := time.Now()
	startFn := StartClusterBound
	if kwok {
		startFn = StartCluster
	}
	c, err := startFn(ctx, n, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok"} {
				t.Logf("--- tail of %s ---\n%s", name, c.LogTail(name, 2000))
			}
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	if err := c.Classes(ctx, sh...); err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane and %d nodes (kwok %v) in %s", n, kwok, time.Since(start).Round(time.Millisecond))
	return c
}

// writeResults writes rs and their table to $NRI_GPU_SCALE_OUT, if set.
func writeResults(t *testing.T, rs []Result, sh []*Shape) {
	dir := os.Getenv(scaleOutEnv)
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(rs, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	for _, s := range sh {
		fmt.Fprintf(&src, "Source, %s: %s\n", s.Name, s.Source)
	}
	if err := os.WriteFile(filepath.Join(dir, "table.md"), []byte(src.String()+"\n"+Table(rs, sh[0].Name, sh[1].Name)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// smokeKwokEnv set to 1 makes TestScaleSmoke run with kwok and measure
// Running too (make bench-scale-smoke); without it the smoke needs no
// kwok (CI's: make e2e-scale).
const smokeKwokEnv = "NRI_GPU_SCALE_KWOK"

// TestScaleSmoke is the bench's smoke, 20 nodes and one round. Without
// kwok (CI: make e2e-scale), the nodes kept Ready by the test itself and
// pods only bound: every claim kind at 90% fill on both shapes and the
// baseline. With kwok ($NRI_GPU_SCALE_KWOK=1, make bench-scale-smoke):
// every kind at 0 and 90% fill, and every pod Running too. Either checks
// what the bench checks (every pod bound, no device allocated twice or
// over the fill, no share past its GPU's memory) and that every
// measurement has a rate; it asserts no speed.
func TestScaleSmoke(t *testing.T) {
	needRoot(t)
	kwok := os.Getenv(smokeKwokEnv) == "1"
	sh := shapes(t)
	ctx := context.Background()
	c := startCluster(t, ctx, 20, sh, kwok)
	start := time.Now()
	fills := []float64{0.9}
	if kwok {
		fills = []float64{0, 0.9}
	}
	rs, err := c.Run(ctx, Plan{Fills: fills, Features: allFeatures, Rounds: 1, Pods: 12}, sh)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + len(sh)*len(allFeatures)*len(fills); len(rs) != want {
		t.Errorf("%d measurements, want %d", len(rs), want)
	}
	for _, r := range rs {
		if !(r.PodsPerSec > 0) || r.BoundP99 <= 0 || kwok && r.RunningP99 < r.BoundP50 {
			t.Errorf("%s: no rate or latencies", r)
		}
	}
	t.Logf("smoke (kwok %v): %s\n%s", kwok, time.Since(start).Round(time.Second), Table(rs, sh[0].Name, sh[1].Name))
}
