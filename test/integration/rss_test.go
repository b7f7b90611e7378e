package integration

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// peakAnonBoundKiB bounds the plugin's anonymous resident memory (RssAnon:
// the Go heap, stacks and runtime, what GOMEMLIMIT governs), sampled over
// TestMeasureRSS: the DaemonSet's GOMEMLIMIT (48MiB). A plugin above it
// keeps Go's GC running flat out.
const peakAnonBoundKiB = 48 * 1024

// peakRSSBoundKiB bounds the plugin's peak resident memory (VmHWM), the
// binary's file pages included (about 30 MiB of them since the Kubernetes
// client libraries of the DRA driver are linked in, used or not): three
// quarters of the DaemonSet's memory limit (128Mi, the OOM kill; also the
// systemd unit's MemoryMax), so that page cache and a DRA driver's
// informers keep headroom. Measured figures are in docs/operations.md,
// "Resources"; the bounds are about memory, never about speed.
const peakRSSBoundKiB = 96 * 1024

// TestMeasureRSS measures the plugin's memory on an 8-GPU simulated node
// while it answers CreateContainer requests, for the DaemonSet's requests
// and limits, and fails if the peak goes over peakRSSBoundKiB. It runs
// only when asked, against a non-race build (`make e2e` runs it so):
//
//	make build && cd test/integration && NRI_GPU_MEASURE_RSS=1 NRI_GPU_BIN=$PWD/../../bin/nri-gpu go test -run TestMeasureRSS -v .
func TestMeasureRSS(t *testing.T) {
	if os.Getenv("NRI_GPU_MEASURE_RSS") == "" {
		t.Skip("measures only when asked: set NRI_GPU_MEASURE_RSS=1 (and NRI_GPU_BIN to a non-race build)")
	}
	if race, err := isRaceBuild(binary); err != nil || race {
		t.Skipf("needs NRI_GPU_BIN, a build without the race detector (which multiplies memory); %s is not (race %v, %v)", binary, race, err)
	}
	needRoot(t)
	dir := shortTempDir(t)
	n, err := simnode.Generate(filepath.Join(dir, "node"), simnode.Options{NumGPUs: 8, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\n", n.Root, n.Root)), 0o644)
	r := startRuntime(t, dir)
	defer r.stop()
	p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--status-socket", "", "--metrics-addr", "127.0.0.1:0")
	url := metricsURL(t, p)
	r.waitSynced(20 * time.Second)
	pid := p.cmd.Process.Pid
	idle := statusKiB(t, pid, "VmRSS")
	t.Logf("idle after sync: VmRSS %d kB", idle)
	const n1 = 20000
	start := time.Now()
	peakAnon := statusKiB(t, pid, "RssAnon")
	for i := 0; i < n1; i++ {
		if i%100 == 0 {
			peakAnon = max(peakAnon, statusKiB(t, pid, "RssAnon"))
		}
		ann := map[string]string{"gpus.nri-gpu.dev/pod": "all,capabilities=all"}
		if _, err := r.create(ann, fmt.Sprintf("c%d", i%100)); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			httpGet(t, url+"/metrics")
		}
	}
	rss, hwm := statusKiB(t, pid, "VmRSS"), statusKiB(t, pid, "VmHWM")
	peakAnon = max(peakAnon, statusKiB(t, pid, "RssAnon"))
	t.Logf("after %d CreateContainer (8 GPUs, every capability) and %d scrapes in %s: VmRSS %d kB, VmHWM %d kB, RssAnon at most %d kB (sampled every 100 requests)",
		n1, n1/1000, time.Since(start).Round(time.Millisecond), rss, hwm, peakAnon)
	// The plugin process itself was measured: alive, resident, its peak
	// at least what it holds now.
	if idle <= 0 || rss <= 0 || hwm < rss || hwm < idle || peakAnon <= 0 || peakAnon > hwm {
		t.Fatalf("implausible measurement of pid %d: idle VmRSS %d kB, VmRSS %d kB, VmHWM %d kB, RssAnon %d kB", pid, idle, rss, hwm, peakAnon)
	}
	if peakAnon > peakAnonBoundKiB {
		t.Errorf("anonymous memory %d kB over the bound of %d kB (the DaemonSet's GOMEMLIMIT)", peakAnon, peakAnonBoundKiB)
	}
	if hwm > peakRSSBoundKiB {
		t.Errorf("peak RSS %d kB over the bound of %d kB (three quarters of the DaemonSet's memory limit)", hwm, peakRSSBoundKiB)
	}
}

// isRaceBuild reports whether the Go binary at path was built with the
// race detector.
func isRaceBuild(path string) (bool, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return false, err
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true", nil
		}
	}
	return false, nil
}
