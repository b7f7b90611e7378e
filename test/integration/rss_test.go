package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestMeasureRSS measures the plugin's memory on an 8-GPU simulated node
// while it answers CreateContainer requests, for the DaemonSet's requests
// and limits. It runs only when asked, against a non-race build:
//
//	make build && cd test/integration && NRI_GPU_MEASURE_RSS=1 NRI_GPU_BIN=$PWD/../../bin/nri-gpu go test -run TestMeasureRSS -v .
func TestMeasureRSS(t *testing.T) {
	if os.Getenv("NRI_GPU_MEASURE_RSS") == "" {
		t.Skip("set NRI_GPU_MEASURE_RSS=1 (and NRI_GPU_BIN to a non-race build) to measure")
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
	status := func() (rss, hwm string) {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
		for _, l := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				rss = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
				hwm = strings.TrimSpace(v)
			}
		}
		return
	}
	rss, _ := status()
	t.Logf("idle after sync: VmRSS %s", rss)
	const n1 = 20000
	start := time.Now()
	for i := 0; i < n1; i++ {
		ann := map[string]string{"gpus.nri-gpu.dev/pod": "all,capabilities=all"}
		if _, err := r.create(ann, fmt.Sprintf("c%d", i%100)); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			httpGet(t, url+"/metrics")
		}
	}
	rss, hwm := status()
	t.Logf("after %d CreateContainer (8 GPUs, every capability) and %d scrapes in %s: VmRSS %s, VmHWM %s", n1, n1/1000, time.Since(start).Round(time.Millisecond), rss, hwm)
}
