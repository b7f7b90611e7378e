package dra

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/mps"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// computeModes stands in for NVML's compute modes (the simulated node
// has no GPU to set them on).
type computeModes struct {
	mu sync.Mutex
	m  map[string]nvml.ComputeMode
}

func (c *computeModes) ComputeMode(uuid string) (nvml.ComputeMode, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[uuid], nil
}

func (c *computeModes) SetComputeMode(uuid string, m nvml.ComputeMode) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[uuid] = m
	return nil
}

// handshake is the DRA driver and nri-gpu mps's supervisor of its
// claims' daemons (SuperviseClaims) on one node: the simulated node's
// nvidia-cuda-mps-control, a short MPS root (the daemon's control socket
// must fit in a unix socket address).
type handshake struct {
	e    *testEnv
	root string
}

// newHandshake starts both sides; poll makes both wake as before the
// handshake was watched: nri-gpu mps reading the checkpoint every second,
// the driver its ready files every 250 ms.
func newHandshake(tb testing.TB, poll bool) *handshake {
	tb.Helper()
	if e := os.Getenv("NRI_GPU_TEST_EMULATED"); e != "" {
		tb.Skipf("under %s (make test-arm64): nri-gpu mps's supervisor knows its daemon by the program name in /proc/<pid>/cmdline, which for an emulated daemon is the emulator's", e)
	}
	n, err := simnode.Generate(tb.TempDir(), simnode.Options{NumGPUs: 1})
	if err != nil {
		tb.Fatal(err)
	}
	mpsRoot, err := os.MkdirTemp("", "mps-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(mpsRoot) })
	root := tb.TempDir()
	opts := Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"), RegistrationDir: filepath.Join(root, "r"),
		CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev", MPSRoot: mpsRoot}
	e := newEnv(tb, draConfig(), testSnapshot(), &opts)
	if poll {
		e.d.watchReady = func(ctx context.Context, _ ...string) <-chan struct{} { return mps.Watch(ctx, 250*time.Millisecond) }
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	if os.Getenv("MPS_LOG") != "" {
		log.SetOutput(os.Stderr)
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05.000"})
	}
	sup := mps.NewSupervisor(mps.Options{Binary: n.HostPath("/usr/bin/nvidia-cuda-mps-control"), LibraryDirs: []string{n.HostPath(n.LibDir)},
		ComputeModes: &computeModes{m: map[string]nvml.ComputeMode{}}}, log)
	ctx, cancel := context.WithCancel(context.Background())
	wake := WatchCheckpoint(ctx, opts.PluginDir)
	if poll {
		wake = mps.Watch(ctx, time.Second)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		SuperviseClaims(ctx, opts.PluginDir, mpsRoot, wake, sup, nil, log)
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
		// A daemon that a failed round left running.
		if data, err := os.ReadFile(filepath.Join(mpsRoot, "GPU-aaaaaaaa", "pipe", mps.PIDFile)); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGTERM)
			}
		}
	})
	return &handshake{e: e, root: mpsRoot}
}

// round prepares an MPS claim of gpu-0 and returns how long the prepare
// took (the checkpoint written, nri-gpu mps woken, the daemon started
// with the claim's limits, its ready file written, the driver woken);
// then it unprepares the claim and waits until nri-gpu mps has retired
// the daemon (its ready file gone).
func (h *handshake) round(tb testing.TB, c *resourceapi.ResourceClaim) time.Duration {
	tb.Helper()
	start := time.Now()
	res, err := h.e.d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	took := time.Since(start)
	if err != nil || res[c.UID].Err != nil {
		tb.Fatalf("prepare: %v %v", err, res[c.UID].Err)
	}
	obj := kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}
	if _, err := h.e.d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{obj}); err != nil {
		tb.Fatal(err)
	}
	ready := filepath.Join(h.root, "GPU-aaaaaaaa", mps.ReadyFile)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(ready); os.IsNotExist(err) {
			return took
		}
		if time.Now().After(deadline) {
			tb.Fatal("nri-gpu mps did not retire the daemon of an unprepared claim")
		}
	}
}

// TestMPSHandshake: the DRA driver and nri-gpu mps's supervisor of its
// claims, run side by side on the simulated node's MPS control daemon,
// prepare an MPS claim through the checkpoint and the ready file alone,
// again and again: each prepare returns with the daemon ready with the
// claim's limits, each unprepare retires it. It logs each round's time.
func TestMPSHandshake(t *testing.T) {
	h := newHandshake(t, false)
	raw := gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}}`
	for i := range 3 {
		c := h.e.mpsClaim(t, "infer-"+itoa(i), "uid-"+itoa(i), raw, "gpu-0")
		t.Logf("round %d: prepared with its daemon ready in %s", i, h.round(t, c).Round(time.Millisecond))
	}
}

// BenchmarkMPSHandshake measures a prepare of an MPS claim until its
// daemon is ready (ns/op; the unprepare and the daemon's retirement are
// not counted), woken by inotify (notify) and by the polling it replaced
// (poll: nri-gpu mps reading the checkpoint every second, the driver the
// ready files every 250 ms), side by side: go test -run '^$' -bench
// MPSHandshake -benchtime 10x ./internal/kubelet/dra/.
func BenchmarkMPSHandshake(b *testing.B) {
	for _, mode := range []string{"notify", "poll"} {
		b.Run(mode, func(b *testing.B) {
			h := newHandshake(b, mode == "poll")
			raw := gpuConfigHead + `, "sharing": {"strategy": "MPS"}}`
			var claims []*resourceapi.ResourceClaim
			for i := range b.N {
				claims = append(claims, h.e.mpsClaim(b, "infer-"+itoa(i), "uid-"+itoa(i), raw, "gpu-0"))
			}
			b.ResetTimer()
			var total time.Duration
			for i := range b.N {
				total += h.round(b, claims[i])
			}
			b.StopTimer()
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/op")
		})
	}
}
