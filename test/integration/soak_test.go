package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// soakCase is one kind of container of the soak mix.
type soakCase struct {
	ann  map[string]string
	env  []string
	want string // NVIDIA_VISIBLE_DEVICES of the answer; "" for untouched; "error" for a refusal; "one" for any one GPU
}

// rssKiB returns the resident set size of process pid.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	return statusKiB(t, pid, "VmRSS")
}

// statusKiB returns the field key (VmRSS, VmHWM, ...) of process pid's
// /proc/<pid>/status, in KiB; the test fails if it is missing.
func statusKiB(t *testing.T, pid int, key string) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatalf("%s of pid %d: %v", key, pid, err)
			}
			return n
		}
	}
	t.Fatalf("no %s for pid %d", key, pid)
	return 0
}

// TestSoak sends many CreateContainer requests through the real protocol
// to the built plugin, from 16 goroutines: a mix of valid, invalid and
// request-free containers, each a new container removed after its answer. Every answer is checked; the plugin's RSS is
// sampled after a warm-up and at the end. NRI_GPU_SOAK_N sets the number
// of requests (default 5000; `make soak` sends 100 000). The runtime side
// (pkg/adaptation) serializes CreateContainer calls to plugins with a
// mutex, so the concurrency is on the client side: the plugin sees one
// request at a time, as with containerd.
func TestSoak(t *testing.T) {
	needRoot(t)
	total := 5000
	if v := os.Getenv("NRI_GPU_SOAK_N"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 {
			t.Fatalf("NRI_GPU_SOAK_N=%q: want a number of at least 100", v)
		}
		total = n
	}
	const workers = 16
	dir := shortTempDir(t)
	n, cfg := simNode(t, dir, simnode.LayoutDebian)
	r := startRuntime(t, dir)
	defer r.stop()
	p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--log-level", "error")
	r.waitSynced(20 * time.Second)

	uuids := func(idx ...int) string {
		var u []string
		for _, i := range idx {
			u = append(u, n.GPUs[i].UUID)
		}
		return strings.Join(u, ",")
	}
	cases := []soakCase{
		// A count: the allocator picks the least shared GPU.
		{map[string]string{"gpus.nri-gpu.dev/container.c": "1"}, nil, "one"},
		{map[string]string{"gpus.nri-gpu.dev/container.c": `"device=1,3"`}, nil, uuids(1, 3)},
		{map[string]string{"gpus.nri-gpu.dev/pod": "all,capabilities=all"}, nil, uuids(0, 1, 2, 3)},
		{map[string]string{"nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=2"}, nil, uuids(2)},
		{nil, []string{"NVIDIA_VISIBLE_DEVICES=all"}, uuids(0, 1, 2, 3)},
		{nil, []string{"NVIDIA_VISIBLE_DEVICES= 3, " + n.GPUs[1].UUID + ",3"}, uuids(3, 1)},
		{map[string]string{"gpus.nri-gpu.dev/container.c": "device=7"}, nil, "error"},
		{map[string]string{"gpus.nri-gpu.dev/pod": "9"}, nil, "error"},
		{map[string]string{"nvidia.cdi.k8s.io/pod": "amd.com/gpu=0"}, nil, "error"},
		{nil, []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=warp"}, "error"},
		{nil, []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"}, "error"},
		{nil, nil, ""},
		{nil, []string{"NVIDIA_VISIBLE_DEVICES=void"}, ""},
		{map[string]string{"unrelated": "x"}, []string{"HOME=/root"}, ""},
	}

	nodeUUIDs := strings.Split(uuids(0, 1, 2, 3), ",")
	var next, wrong, refused, invalid atomic.Int64
	lat := make([][]time.Duration, workers)
	run := func(count int64) {
		var wg sync.WaitGroup
		start := next.Load()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= start+count {
						return
					}
					c := cases[i%int64(len(cases))]
					if c.want == "error" {
						invalid.Add(1)
					}
					// Each request is a new container of a new pod,
					// removed after its answer as containerd does when a
					// container ends (or its creation failed), so that
					// the plugin's allocation table sees the churn of a
					// real node.
					pod := &api.PodSandbox{Id: fmt.Sprintf("pod-%d", i), Name: fmt.Sprintf("pod-%d", i), Namespace: "default", Uid: fmt.Sprintf("uid-%d", i), Annotations: c.ann}
					ctr := &api.Container{Id: fmt.Sprintf("ctr-%d", i), PodSandboxId: pod.Id, Name: "c", Env: append([]string{"PATH=/usr/bin:/bin"}, c.env...)}
					t0 := time.Now()
					rpl, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
					lat[w] = append(lat[w], time.Since(t0))
					adj := rpl.GetAdjust()
					r.nri.RemoveContainer(context.Background(), &api.RemoveContainerRequest{Pod: pod, Container: ctr})
					got := ""
					for _, e := range adj.GetEnv() {
						if e.Key == "NVIDIA_VISIBLE_DEVICES" {
							got = e.Value
						}
					}
					switch {
					case err != nil:
						refused.Add(1)
						if c.want != "error" || !strings.Contains(err.Error(), "nri-gpu: ") {
							wrong.Add(1)
							t.Errorf("request %d (%v %v): %v", i, c.ann, c.env, err)
						}
					case c.want == "one" && slices.Contains(nodeUUIDs, got) && len(adj.GetLinux().GetDevices()) >= 2:
					case c.want == "error" || got != c.want ||
						c.want == "" && (len(adj.GetMounts()) > 0 || len(adj.GetLinux().GetDevices()) > 0) ||
						c.want != "" && len(adj.GetLinux().GetDevices()) < strings.Count(c.want, ",")+2:
						wrong.Add(1)
						t.Errorf("request %d (%v %v): NVIDIA_VISIBLE_DEVICES %q, %d devices; want %q", i, c.ann, c.env, got, len(adj.GetLinux().GetDevices()), c.want)
					}
				}
			}(w)
		}
		wg.Wait()
	}

	warm := int64(total / 10)
	run(warm)
	rss0 := rssKiB(t, p.cmd.Process.Pid)
	for i := range lat {
		lat[i] = lat[i][:0]
	}
	refused.Store(0)
	invalid.Store(0)
	start := time.Now()
	run(int64(total) - warm)
	elapsed := time.Since(start)
	rss1 := rssKiB(t, p.cmd.Process.Pid)

	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	pct := func(q float64) time.Duration { return all[int(q*float64(len(all)-1))] }
	t.Logf("soak: %d requests after %d warm-up, %d workers, %.0f req/s; latency p50 %v p99 %v max %v; refused %d (expected %d), wrong %d; plugin RSS %d KiB -> %d KiB (%+d KiB)",
		len(all), warm, workers, float64(len(all))/elapsed.Seconds(), pct(0.50), pct(0.99), all[len(all)-1],
		refused.Load(), invalid.Load(), wrong.Load(), rss0, rss1, rss1-rss0)
	if refused.Load() != invalid.Load() || wrong.Load() != 0 {
		t.Errorf("refused %d of %d invalid requests, %d wrong answers", refused.Load(), invalid.Load(), wrong.Load())
	}
	// Bound: the plugin keeps nothing per request; what the Go heap and
	// the race detector (in the test build) settle on after the warm-up
	// may grow a little, not with the number of requests.
	if growth := rss1 - rss0; growth > 32*1024 {
		t.Errorf("plugin RSS grew by %d KiB (bound 32 MiB)", growth)
	}
}
