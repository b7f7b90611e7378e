package deviceplugin_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/kubelet/deviceplugin"
	"github.com/nri-gpu/nri-gpu/internal/kubelet/socket"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// wait bounds every wait for the plugin: generous, since nothing here is a
// time requirement; a test only fails on it when the plugin never answers.
const wait = 30 * time.Second

// kubelet plays the kubelet's side of the device plugin API: its
// Registration service on <dir>/kubelet.sock, recording every Register
// call, and a client of the plugins it registered.
type kubelet struct {
	t      *testing.T
	dir    string
	server *grpc.Server
	reqs   chan *pluginapi.RegisterRequest
	pluginapi.UnimplementedRegistrationServer
}

func (k *kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

// startKubelet serves the Registration service in dir, as the kubelet does
// at start after emptying the directory of other sockets.
func startKubelet(t *testing.T, dir string, emptyDir bool) *kubelet {
	t.Helper()
	if emptyDir {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	l, err := net.Listen("unix", filepath.Join(dir, deviceplugin.KubeletSocket))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{t: t, dir: dir, server: grpc.NewServer(), reqs: make(chan *pluginapi.RegisterRequest, 16)}
	pluginapi.RegisterRegistrationServer(k.server, k)
	go k.server.Serve(l)
	t.Cleanup(k.stop)
	return k
}

// stop stops the kubelet and removes its socket, as a kubelet that exits.
func (k *kubelet) stop() {
	k.server.Stop()
	os.Remove(filepath.Join(k.dir, deviceplugin.KubeletSocket))
}

// registered waits for the next Register call and checks it.
func (k *kubelet) registered(resource string) *pluginapi.RegisterRequest {
	k.t.Helper()
	select {
	case r := <-k.reqs:
		if r.Version != pluginapi.Version || r.ResourceName != resource || r.Endpoint != deviceplugin.SocketName(resource) ||
			!r.GetOptions().GetGetPreferredAllocationAvailable() || r.GetOptions().GetPreStartRequired() {
			k.t.Fatalf("Register(%v), want version %s, resource %s, endpoint %s, preferred allocation and no pre-start", r, pluginapi.Version, resource, deviceplugin.SocketName(resource))
		}
		return r
	case <-time.After(wait):
		k.t.Fatalf("the plugin did not register within %s", wait)
	}
	return nil
}

// dial connects to the plugin that registered r, as the kubelet does.
func (k *kubelet) dial(r *pluginapi.RegisterRequest) pluginapi.DevicePluginClient {
	k.t.Helper()
	conn, err := grpc.NewClient("unix:"+filepath.Join(k.dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// watch calls ListAndWatch and returns a function that waits for the next
// list.
func watch(t *testing.T, c pluginapi.DevicePluginClient) func() []*pluginapi.Device {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	lists := make(chan []*pluginapi.Device, 16)
	go func() {
		defer close(lists)
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			lists <- r.Devices
		}
	}()
	return func() []*pluginapi.Device {
		t.Helper()
		select {
		case l, ok := <-lists:
			if !ok {
				t.Fatal("ListAndWatch ended")
			}
			return l
		case <-time.After(wait):
			t.Fatalf("no device list within %s", wait)
		}
		return nil
	}
}

// twoNUMA is simnode.MemorySnapshot's 8-GPU node with GPUs 0-3 on NUMA
// node 0 and 4-7 on NUMA node 1 (bus ids 18, 28, ... 88).
func twoNUMA() *inventory.Snapshot {
	s := simnode.MemorySnapshot()
	for i := range s.GPUs {
		s.GPUs[i].NUMANode = i / 4
	}
	return s
}

func stateOf(s *inventory.Snapshot) *node.State {
	return &node.State{Config: config.Default(), Source: adjust.Prepare(s, adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib"})}
}

func quietLog() *logrus.Logger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	if os.Getenv("DP_LOG") != "" {
		log.SetOutput(os.Stderr)
		log.SetLevel(logrus.DebugLevel)
	}
	return log
}

// serveTwoNUMA serves the 2-NUMA node of twoNUMA through the plugin,
// registered with a stand-in kubelet, and returns the snapshot, the node
// (to swap its state) and the kubelet's client of the plugin.
func serveTwoNUMA(t *testing.T) (*inventory.Snapshot, *node.Node, pluginapi.DevicePluginClient) {
	t.Helper()
	dir := socketDir(t)
	k := startKubelet(t, dir, false)
	snap := twoNUMA()
	n := node.Fixed(stateOf(snap), quietLog())
	runPlugin(t, n, deviceplugin.Options{SocketDir: dir})
	return snap, n, k.dial(k.registered("nvidia.com/gpu"))
}

// socketDir is a short temporary directory (unix socket paths are limited
// to 108 bytes).
func socketDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// runPlugin runs the device plugin of n in dir until the test ends (or
// the returned stop is called), failing the test if Run fails.
func runPlugin(t *testing.T, n *node.Node, o deviceplugin.Options) (*deviceplugin.Plugin, func()) {
	t.Helper()
	p := deviceplugin.New(n, o, quietLog())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return within %s of its context's end", wait)
		}
	}
	t.Cleanup(stop)
	return p, stop
}

func ids(devs []*pluginapi.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.ID)
	}
	return out
}

func uuids(s *inventory.Snapshot, idx ...int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, s.GPUs[i].UUID)
	}
	return out
}

// TestRegisterAndList checks the registration (version, resource,
// endpoint, options), GetDevicePluginOptions and the first list: one
// Healthy device per GPU, ID = UUID, with its NUMA node.
func TestRegisterAndList(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir, false)
	snap := twoNUMA()
	snap.GPUs[7].NUMANode = inventory.NoNUMANode
	n := node.Fixed(stateOf(snap), quietLog())
	runPlugin(t, n, deviceplugin.Options{SocketDir: dir})
	c := k.dial(k.registered("nvidia.com/gpu"))

	opts, err := c.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable || opts.PreStartRequired {
		t.Errorf("GetDevicePluginOptions = %v, %v; want preferred allocation, no pre-start", opts, err)
	}
	devs := watch(t, c)()
	if got, want := ids(devs), uuids(snap, 0, 1, 2, 3, 4, 5, 6, 7); !slices.Equal(got, want) {
		t.Fatalf("devices %q, want %q", got, want)
	}
	for i, d := range devs {
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s: %s, want Healthy", d.ID, d.Health)
		}
		switch {
		case i == 7 && d.Topology != nil:
			t.Errorf("device %s of unknown NUMA node: topology %v, want none", d.ID, d.Topology)
		case i < 7 && (len(d.GetTopology().GetNodes()) != 1 || d.Topology.Nodes[0].ID != int64(i/4)):
			t.Errorf("device %s: topology %v, want NUMA node %d", d.ID, d.Topology, i/4)
		}
	}
}

// TestResourceName checks a configured resource name and its socket.
func TestResourceName(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir, false)
	n := node.Fixed(stateOf(twoNUMA()), quietLog())
	p, _ := runPlugin(t, n, deviceplugin.Options{SocketDir: dir, ResourceName: "example.com/accel"})
	k.registered("example.com/accel")
	if p.Socket() != filepath.Join(dir, "nri-gpu-example.com-accel.sock") {
		t.Errorf("socket %s", p.Socket())
	}
}

// TestReregister checks that the plugin registers again when the kubelet
// restarts (it empties the directory, removing the plugin's socket, and
// makes its own socket anew) and that the kubelet then reaches the plugin
// on its new socket; when the kubelet only recreates its socket; when
// nri-gpu restarts; and when the kubelet comes after the plugin. Each
// kubelet is a new server, so that each registration it records was made
// to it; a plugin may register twice with one kubelet (the kubelet takes
// the last), so extra registrations are not errors.
func TestReregister(t *testing.T) {
	dir := socketDir(t)
	snap := twoNUMA()
	n := node.Fixed(stateOf(snap), quietLog())

	// The kubelet comes after the plugin.
	p, stop := runPlugin(t, n, deviceplugin.Options{SocketDir: dir})
	if _, err := os.Stat(p.Socket()); err != nil {
		// Run serves before registering; wait for the socket.
		deadline := time.Now().Add(wait)
		for err != nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			_, err = os.Stat(p.Socket())
		}
	}
	k := startKubelet(t, dir, false)
	r := k.registered("nvidia.com/gpu")
	old := watch(t, k.dial(r))
	old()

	// The kubelet restarts: it empties the directory, then serves.
	k.stop()
	k = startKubelet(t, dir, true)
	r = k.registered("nvidia.com/gpu")
	if got := ids(watch(t, k.dial(r))()); len(got) != 8 {
		t.Errorf("after the kubelet's restart: %d devices, want 8", len(got))
	}

	// The kubelet's socket alone is made anew.
	k.stop()
	k = startKubelet(t, dir, false)
	r = k.registered("nvidia.com/gpu")
	if got := ids(watch(t, k.dial(r))()); len(got) != 8 {
		t.Errorf("after the kubelet's socket was recreated: %d devices, want 8", len(got))
	}

	// nri-gpu restarts: its socket goes with it, and the new one
	// registers at start. (A kubelet of its own, so that a registration
	// the last one may still get does not count.)
	stop()
	if _, err := os.Stat(p.Socket()); err == nil {
		t.Error("the plugin's socket is still there after Run returned")
	}
	k.stop()
	k = startKubelet(t, dir, false)
	runPlugin(t, n, deviceplugin.Options{SocketDir: dir})
	r = k.registered("nvidia.com/gpu")
	if got := ids(watch(t, k.dial(r))()); len(got) != 8 {
		t.Errorf("after nri-gpu's restart: %d devices, want 8", len(got))
	}
}

// TestOverlap: a newer nri-gpu starting while the older one still runs
// (an overlapping reinstall) takes the socket and registers; the older
// one leaves it to the newer one instead of taking it back (no two
// plugins replacing each other's socket), and its exit does not remove
// the newer one's socket: the kubelet keeps reaching the newer one.
func TestOverlap(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir, false)
	n := node.Fixed(stateOf(twoNUMA()), quietLog())
	older, stopOlder := runPlugin(t, n, deviceplugin.Options{SocketDir: dir})
	k.registered("nvidia.com/gpu")
	before, err := os.Stat(older.Socket())
	if err != nil {
		t.Fatal(err)
	}
	runPlugin(t, n, deviceplugin.Options{SocketDir: dir})
	r := k.registered("nvidia.com/gpu")
	newer, err := os.Stat(older.Socket())
	if err != nil || socket.Same(newer, before) {
		t.Fatalf("after the newer plugin registered, its socket: %v, %v; want a new file", newer, err)
	}
	// Well past the plugin's settle time (100 ms): neither takes the
	// socket back.
	time.Sleep(2 * time.Second)
	select {
	case extra := <-k.reqs:
		t.Errorf("a registration after the newer one's: %v (the older plugin took the socket back)", extra)
	default:
	}
	stopOlder()
	now, err := os.Stat(older.Socket())
	if err != nil || !socket.Same(now, newer) {
		t.Fatalf("after the older plugin stopped, the socket: %v, %v; want the newer plugin's, untouched", now, err)
	}
	if got := ids(watch(t, k.dial(r))()); len(got) != 8 {
		t.Errorf("the newer plugin lists %d devices, want 8", len(got))
	}
}

// TestHealthFollowsNode checks that ListAndWatch follows the node's
// state: a GPU that a rediscovery no longer finds goes Unhealthy (and
// Allocate refuses it), and Healthy again when it is found again; a
// driver that is unloaded makes every GPU Unhealthy.
func TestHealthFollowsNode(t *testing.T) {
	snap, n, c := serveTwoNUMA(t)
	next := watch(t, c)
	health := func(devs []*pluginapi.Device) map[string]string {
		out := map[string]string{}
		for _, d := range devs {
			out[d.ID] = d.Health
		}
		return out
	}
	if h := health(next()); len(h) != 8 {
		t.Fatalf("devices %v", h)
	}

	// GPU 3 is gone: its device node or driver entry disappeared.
	gone := twoNUMA()
	gone.GPUs = slices.Delete(gone.GPUs, 3, 4)
	n.Swap(stateOf(gone))
	h := health(next())
	for i, g := range snap.GPUs {
		want := pluginapi.Healthy
		if i == 3 {
			want = pluginapi.Unhealthy
		}
		if h[g.UUID] != want {
			t.Errorf("GPU %d gone from discovery: %s is %q, want %s", 3, g.UUID, h[g.UUID], want)
		}
	}
	_, err := c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: uuids(snap, 3)}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), snap.GPUs[3].UUID) || !strings.Contains(err.Error(), "unhealthy") {
		t.Errorf("Allocate of the gone GPU: %v, want InvalidArgument naming it unhealthy", err)
	}

	// GPU 3 is back.
	n.Swap(stateOf(twoNUMA()))
	for id, hl := range health(next()) {
		if hl != pluginapi.Healthy {
			t.Errorf("GPU back: %s is %s", id, hl)
		}
	}

	// The driver is unloaded.
	unloaded := twoNUMA()
	unloaded.DriverVersion, unloaded.Control = "", inventory.ControlNodes{}
	n.Swap(stateOf(unloaded))
	h = health(next())
	if len(h) != 8 {
		t.Errorf("driver unloaded: %d devices, want 8", len(h))
	}
	for id, hl := range h {
		if hl != pluginapi.Unhealthy {
			t.Errorf("driver unloaded: %s is %s, want Unhealthy", id, hl)
		}
	}

	// A state whose devices did not change sends nothing new; the next
	// change does.
	n.Swap(stateOf(unloaded))
	n.Swap(stateOf(twoNUMA()))
	for id, hl := range health(next()) {
		if hl != pluginapi.Healthy {
			t.Errorf("driver back: %s is %s", id, hl)
		}
	}
}

// TestPreferredAllocation checks the preferred allocation on a 2-NUMA
// 8-GPU node (GPUs 0-3 on node 0, 4-7 on node 1, bus ids 18 to 88 in
// steps of 10): one NUMA node first, the tightest that fits, then the
// nearest bus ids.
func TestPreferredAllocation(t *testing.T) {
	snap, _, c := serveTwoNUMA(t)
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	for _, tc := range []struct {
		name            string
		available, must []int
		size            int
		want            []int
	}{
		{"one GPU of a free node", all, nil, 1, []int{0}},
		{"two GPUs, nearest on node 0", all, nil, 2, []int{0, 1}},
		{"four GPUs: a whole node", all, nil, 4, []int{0, 1, 2, 3}},
		{"the nearest two of the free ones", []int{0, 2, 3, 4, 5, 6}, nil, 2, []int{2, 3}},
		{"the node that fits tightest, however far apart", []int{0, 3, 4, 5, 6, 7}, nil, 2, []int{0, 3}},
		{"the only node that fits", []int{0, 3, 4, 5, 6, 7}, nil, 3, []int{4, 5, 6}},
		{"more than a node: the fuller node whole, then the nearest", all, nil, 6, []int{0, 1, 2, 3, 4, 5}},
		{"more than a node, uneven", []int{0, 1, 2, 4, 5, 6, 7}, nil, 5, []int{4, 5, 6, 7, 0}},
		{"must include: its node first, nearest it", all, []int{6}, 2, []int{6, 5}},
		{"must include on both nodes", all, []int{1, 6}, 3, []int{1, 6, 0}},
		{"fewer available than asked", []int{2, 5}, nil, 3, []int{2, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			avail := uuids(snap, tc.available...)
			avail = append(avail, "GPU-not-on-this-node")
			r, err := c.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs:   avail,
				MustIncludeDeviceIDs: uuids(snap, tc.must...),
				AllocationSize:       int32(tc.size),
			}}})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := r.ContainerResponses[0].DeviceIDs, uuids(snap, tc.want...); !slices.Equal(got, want) {
				t.Errorf("preferred %q, want GPUs %v %q", got, tc.want, want)
			}
		})
	}
}

// TestAllocate checks Allocate's answer: for each container, the device
// nodes of its GPUs (same path on host and in the container, rw) and the
// annotation naming them; nothing else (no mounts, no env). An unknown
// device ID fails the call with an error naming it and the node's
// devices.
func TestAllocate(t *testing.T) {
	snap, _, c := serveTwoNUMA(t)

	r, err := c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: uuids(snap, 5, 2)},
		{DevicesIds: uuids(snap, 7)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.ContainerResponses) != 2 {
		t.Fatalf("%d container responses, want 2", len(r.ContainerResponses))
	}
	for i, want := range [][]int{{2, 5}, {7}} {
		cr := r.ContainerResponses[i]
		var paths []string
		for _, d := range cr.Devices {
			if d.HostPath != d.ContainerPath || d.Permissions != "rw" {
				t.Errorf("container %d: device spec %v, want the same path on both sides, rw", i, d)
			}
			paths = append(paths, d.HostPath)
		}
		var wantPaths []string
		for _, g := range want {
			wantPaths = append(wantPaths, snap.GPUs[g].Node.Path)
		}
		if !slices.Equal(paths, wantPaths) {
			t.Errorf("container %d: device nodes %q, want %q", i, paths, wantPaths)
		}
		key := "gpus.nri-gpu.dev/kubelet.nvidia.com_gpu"
		if got, w := cr.Annotations, strings.Join(uuids(snap, want...), ","); len(got) != 1 || got[key] != w {
			t.Errorf("container %d: annotations %v, want %s=%s", i, got, key, w)
		}
		if len(cr.Mounts) != 0 || len(cr.Envs) != 0 || len(cr.CdiDevices) != 0 {
			t.Errorf("container %d: mounts %v, env %v, CDI devices %v; want none (NRI injects them)", i, cr.Mounts, cr.Envs, cr.CdiDevices)
		}
	}

	_, err = c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{snap.GPUs[0].UUID, "GPU-forged\x00" + strings.Repeat("x", 1000)}},
	}})
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, `unknown device "GPU-forged\x00xxx`) ||
		!strings.Contains(msg, "devices of the node: "+snap.GPUs[0].UUID) || !strings.Contains(msg, "nvidia.com/gpu") || len(msg) > 1000 {
		t.Errorf("Allocate of an unknown device: %v; want InvalidArgument naming the resource, the device (cut short) and the node's devices", err)
	}
}

// TestXIDUnhealthy: a GPU the node's XID health made unhealthy is
// reported Unhealthy, and Healthy again when it recovers.
func TestXIDUnhealthy(t *testing.T) {
	snap, n, c := serveTwoNUMA(t)
	next := watch(t, c)
	next()
	bad := stateOf(twoNUMA())
	bad.Unhealthy = map[string]string{snap.GPUs[5].UUID: "XID 79"}
	n.Swap(bad)
	for _, d := range next() {
		want := pluginapi.Healthy
		if d.ID == snap.GPUs[5].UUID {
			want = pluginapi.Unhealthy
		}
		if d.Health != want {
			t.Errorf("after XID 79 on GPU 5: %s is %s, want %s", d.ID, d.Health, want)
		}
	}
	n.Swap(stateOf(twoNUMA()))
	for _, d := range next() {
		if d.Health != pluginapi.Healthy {
			t.Errorf("recovered: %s is %s", d.ID, d.Health)
		}
	}
}
