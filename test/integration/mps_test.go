package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// kubeletStandIn is the kubelet's Registration service in a device plugin
// directory, recording the registrations.
type kubeletStandIn struct {
	pluginapi.UnimplementedRegistrationServer
	dir  string
	reqs chan *pluginapi.RegisterRequest
}

func (k *kubeletStandIn) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

func startKubeletStandIn(t *testing.T, dir string) *kubeletStandIn {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, config.KubeletSocketName))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubeletStandIn{dir: dir, reqs: make(chan *pluginapi.RegisterRequest, 16)}
	s := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(s, k)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return k
}

// plugin waits for the next registration of resource and connects to the
// plugin that made it.
func (k *kubeletStandIn) plugin(t *testing.T, resource string) pluginapi.DevicePluginClient {
	t.Helper()
	select {
	case r := <-k.reqs:
		if r.ResourceName != resource {
			t.Fatalf("registered %s, want %s", r.ResourceName, resource)
		}
		conn, err := grpc.NewClient("unix:"+filepath.Join(k.dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return pluginapi.NewDevicePluginClient(conn)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not register", resource)
	}
	return nil
}

// healthWatch lists the plugin's devices and returns a function that
// waits until the latest list has want, device ID -> Healthy or not, for
// every device it names, and fails the test after timeout.
func healthWatch(t *testing.T, c pluginapi.DevicePluginClient) func(what string, want func(id string) bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	lists := make(chan []*pluginapi.Device, 64)
	go func() {
		for {
			r, err := s.Recv()
			if err != nil {
				close(lists)
				return
			}
			lists <- r.Devices
		}
	}()
	var last []*pluginapi.Device
	return func(what string, want func(id string) bool) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			ok := len(last) > 0
			for _, d := range last {
				ok = ok && (d.Health == pluginapi.Healthy) == want(d.ID)
			}
			if ok {
				return
			}
			select {
			case l, open := <-lists:
				if !open {
					t.Fatalf("ListAndWatch ended waiting for %s", what)
				}
				last = l
			case <-deadline:
				t.Fatalf("timed out waiting for %s; last list %v", what, last)
			}
		}
	}
}

// daemonPID reads the PID file of the stand-in MPS daemon in pipe.
func daemonPID(t *testing.T, pipe string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(pipe, simnode.MPSControlPID))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func allocate(c pluginapi.DevicePluginClient, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	r, err := c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	return r.ContainerResponses[0], nil
}

// TestMPSOverNRI runs the built nri-gpu run (NRI plugin and device plugin,
// against NRI's runtime side and a stand-in kubelet) and nri-gpu mps on a
// simulated 2-GPU node whose GPUs are shared with MPS, 4 replicas each,
// with the simulated node's stand-in nvidia-cuda-mps-control and NVML:
//
//   - nri-gpu mps puts both GPUs in Exclusive_Process (NVML), starts one
//     daemon per GPU with its CUDA_VISIBLE_DEVICES and sets the limits of
//     one replica (25%, memory/4); the device plugin's eight replicas turn
//     Healthy, and a replica's Allocate carries the mps annotation;
//   - the daemon of GPU 0 is killed: its replicas turn Unhealthy and
//     Allocate refuses them with the reason (the node state's MPS
//     readiness), GPU 1's serve on; nri-gpu mps starts the daemon again
//     and they turn Healthy;
//   - nri-gpu run is killed and started again: the daemons run on (same
//     PIDs, same pipe directories) and its replicas are Healthy again;
//   - nri-gpu mps is killed and started again: it adopts the running
//     daemons (no new daemon starts) and they stay ready.
func TestMPSOverNRI(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	dpDir, mpsRoot := filepath.Join(dir, "dp"), filepath.Join(dir, "mps")
	if err := os.Mkdir(dpDir, 0o755); err != nil {
		t.Fatal(err)
	}
	n, cfg := simNodeN(t, dir, 2, fmt.Sprintf("devicePlugin:\n  enabled: true\n  socketDir: %s\n  devRoot: %s\n  mpsRoot: %s\n  sharing:\n    mps:\n      resources: [{name: nvidia.com/gpu, replicas: 4}]\n",
		dpDir, filepath.Join(dir, "node", "dev"), mpsRoot))
	pipe := func(g int) string { return filepath.Join(mpsRoot, n.GPUs[g].UUID, "pipe") }
	logOf := func(g int) string {
		data, _ := os.ReadFile(filepath.Join(mpsRoot, n.GPUs[g].UUID, "log", simnode.MPSControlLog))
		return string(data)
	}
	t.Cleanup(func() {
		for g := range n.GPUs {
			if data, err := os.ReadFile(filepath.Join(pipe(g), simnode.MPSControlPID)); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
					syscall.Kill(pid, syscall.SIGTERM)
				}
			}
		}
	})
	k := startKubeletStandIn(t, dpDir)
	r := startRuntime(t, dir)
	defer r.stop()
	runArgs := []string{"run", "--config", cfg, "--socket", r.socket, "--status-socket", filepath.Join(dir, "status.sock")}
	run := startPlugin(t, runArgs...)
	r.waitSynced(20 * time.Second)
	dp := k.plugin(t, "nvidia.com/gpu")
	health := healthWatch(t, dp)
	health("every replica Unhealthy before nri-gpu mps", func(string) bool { return false })

	mpsArgs := []string{"mps", "--config", cfg}
	mps := startPlugin(t, mpsArgs...)
	health("every replica Healthy", func(string) bool { return true })
	modes, err := n.ComputeModes()
	if err != nil || len(modes) != 2 || modes[n.GPUs[0].UUID] != simnode.ComputeModeExclusiveProcess || modes[n.GPUs[1].UUID] != simnode.ComputeModeExclusiveProcess {
		t.Errorf("compute modes %v, %v: want both Exclusive_Process", modes, err)
	}
	for g := range n.GPUs {
		log := logOf(g)
		for _, want := range []string{"CUDA_VISIBLE_DEVICES=" + n.GPUs[g].UUID, "Cmd:set_default_active_thread_percentage 25", "Cmd:set_default_device_pinned_mem_limit 0 20389M"} {
			if !strings.Contains(log, want) {
				t.Errorf("GPU %d: control.log lacks %q:\n%s", g, want, log)
			}
		}
	}
	g0, g1 := n.GPUs[0].UUID, n.GPUs[1].UUID
	resp, err := allocate(dp, g0+"::2")
	if err != nil || resp.Annotations[alloc.KubeletSharedAnnotation("nvidia.com/gpu")] != "mps:"+g0+"=1/4" || resp.Annotations[alloc.KubeletAnnotationFor("nvidia.com/gpu")] != g0 {
		t.Errorf("Allocate %s::2: %v, %v", g0, resp, err)
	}
	if _, err := allocate(dp, g0+"::0", g0+"::1"); err == nil || !strings.Contains(err.Error(), "maximum request size for shared resources is 1; found 2") {
		t.Errorf("two MPS replicas: %v", err)
	}
	// The container the kubelet makes of that answer: a client of GPU 0's
	// daemon with one replica's limits.
	adj, err := r.runShaped("client", nil, resp.Annotations, n.GPUs[0])
	checkMPSClientAnswer(t, adj, err, pipe(0), filepath.Join(mpsRoot, "shm"))

	// The daemon of GPU 0 dies.
	first := daemonPID(t, pipe(0))
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	health("GPU 0's replicas Unhealthy, GPU 1's Healthy", func(id string) bool { return strings.HasPrefix(id, g1) })
	if _, err := allocate(dp, g0+"::1"); err == nil || !strings.Contains(err.Error(), "its MPS control daemon is not ready") {
		t.Errorf("a replica of GPU 0 while its daemon is down: %v", err)
	}
	if _, err := allocate(dp, g1+"::1"); err != nil {
		t.Errorf("a replica of GPU 1 while GPU 0's daemon is down: %v", err)
	}
	health("GPU 0's replicas Healthy again", func(string) bool { return true })
	if second := daemonPID(t, pipe(0)); second == first || strings.Count(logOf(0), "Starting control daemon") != 2 {
		t.Errorf("GPU 0's daemon %d after %d; control.log:\n%s", second, first, logOf(0))
	}

	// nri-gpu run restarts: the daemons run on.
	pids := []int{daemonPID(t, pipe(0)), daemonPID(t, pipe(1))}
	run.cmd.Process.Kill()
	<-run.done
	run.done <- nil
	startPlugin(t, runArgs...)
	dp = k.plugin(t, "nvidia.com/gpu")
	healthWatch(t, dp)("every replica Healthy after nri-gpu run restarted", func(string) bool { return true })
	for g, pid := range pids {
		if got := daemonPID(t, pipe(g)); got != pid || syscall.Kill(pid, 0) != nil {
			t.Errorf("GPU %d: daemon %d after nri-gpu run restarted, was %d", g, got, pid)
		}
	}

	// nri-gpu mps restarts: it adopts the daemons. While it is away
	// (its ready files stale), a new client of GPU 0 is refused.
	mps.cmd.Process.Kill()
	<-mps.done
	mps.done <- nil
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		_, err := r.runShaped(fmt.Sprint("late", i), nil, resp.Annotations, n.GPUs[0])
		if err != nil && strings.Contains(err.Error(), "its MPS control daemon is not ready") && strings.Contains(err.Error(), "new containers on it are refused until nri-gpu mps reports it ready") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a client of GPU 0 with nri-gpu mps away: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	mps = startPlugin(t, mpsArgs...)
	deadline = time.Now().Add(30 * time.Second)
	for !strings.Contains(mps.log.String(), "MPS control daemon adopted: ready") || strings.Count(mps.log.String(), "adopted: ready") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("nri-gpu mps did not adopt both daemons:\n%s", mps.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for g, pid := range pids {
		if got := daemonPID(t, pipe(g)); got != pid {
			t.Errorf("GPU %d: daemon %d after nri-gpu mps restarted, was %d", g, got, pid)
		}
	}
	if c0, c1 := strings.Count(logOf(0), "Starting control daemon"), strings.Count(logOf(1), "Starting control daemon"); c0 != 2 || c1 != 1 {
		t.Errorf("daemon starts: GPU 0 %d (want 2), GPU 1 %d (want 1)", c0, c1)
	}
	// Its daemons were counted not ready while it was away: healthy again
	// once nri-gpu run reads the adopted daemons' ready files.
	healthWatch(t, dp)("every replica Healthy after nri-gpu mps came back", func(string) bool { return true })
	if _, err := allocate(dp, g1+"::3"); err != nil {
		t.Errorf("a replica after nri-gpu mps restarted: %v", err)
	}
}

// checkMPSClientAnswer checks the answer to an MPS client container: the
// GPU's pipe directory at /tmp/nvidia-mps, the daemons' shm at /dev/shm,
// and CUDA_MPS_* one replica's of a simulated H100 80GB shared 4 ways.
func checkMPSClientAnswer(t *testing.T, adj *api.ContainerAdjustment, err error, pipe, shm string) {
	t.Helper()
	if err != nil {
		t.Fatalf("an MPS client: %v", err)
	}
	mounts := map[string]string{}
	for _, m := range adj.GetMounts() {
		mounts[m.Destination] = m.Source
	}
	env := map[string]string{}
	for _, e := range adj.GetEnv() {
		env[e.Key] = e.Value
	}
	if mounts["/tmp/nvidia-mps"] != pipe || mounts["/dev/shm"] != shm || env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" ||
		env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" || env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=20389M" {
		t.Errorf("an MPS client's answer: mounts %v, env %v", mounts, env)
	}
}
