package suite

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// NVIDIA's k8s-device-plugin constants (internal/plugin/server.go).
const (
	nvidiaDeviceListEnvVar = "NVIDIA_VISIBLE_DEVICES"
	// DEVICE_LIST_STRATEGY=volume-mounts: one /dev/null mount per GPU
	// under this root, and NVIDIA_VISIBLE_DEVICES set to the root.
	nvidiaVolumeMountsHostPath = "/dev/null"
	nvidiaVolumeMountsRoot     = "/var/run/nvidia-container-devices"
)

// standInNVIDIAPlugin is a STAND-IN for NVIDIA's k8s-device-plugin: a
// kubelet device plugin (v1beta1) whose Allocate answers exactly what the
// real plugin's getAllocateResponse answers for full GPUs with
// DEVICE_ID_STRATEGY=uuid, PASS_DEVICE_SPECS=true (false: noDeviceSpecs) and
// DEVICE_LIST_STRATEGY=envvar or volume-mounts (no CDI, MPS, GDS, MOFED or
// IMEX channels). The real plugin is not used because it needs NVML: built
// from its source it fails at start with "nvml init failed:
// ERROR_LIBRARY_NOT_FOUND" on a node without the driver, and against the
// simulated node's libnvidia-ml.so.1 (which implements only the few calls
// nri-gpu's tests make) with "undefined symbol: nvmlShutdown"; it
// enumerates GPUs, minors and UUIDs through NVML. Options, ListAndWatch and
// registration follow the real plugin in what the kubelet uses (device
// ID = GPU UUID, all Healthy, no PreStartContainer); GetPreferredAllocation
// is not offered.
type standInNVIDIAPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	resource string
	strategy string // "envvar" or "volume-mounts"
	gpus     []simnode.GPU
	// devRoot is the plugin's NVIDIA_DEV_ROOT (its --dev-root): where the
	// device nodes are on the host, here the simulated node's root.
	devRoot string
	socket  string
	server  *grpc.Server
	// noDeviceSpecs answers as PASS_DEVICE_SPECS=false (NVIDIA's
	// default): no DeviceSpecs, the list of GPUs alone.
	noDeviceSpecs atomic.Bool
}

func (p *standInNVIDIAPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *standInNVIDIAPlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	var devs []*pluginapi.Device
	for _, g := range p.gpus {
		devs = append(devs, &pluginapi.Device{ID: g.UUID, Health: pluginapi.Healthy})
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// Allocate is getAllocateResponse, per container request.
func (p *standInNVIDIAPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		r, err := p.allocateResponse(cr.DevicesIds)
		if err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, r)
	}
	return resp, nil
}

func (p *standInNVIDIAPlugin) allocateResponse(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	// uniqueDeviceIDsFromAnnotatedDeviceIDs (no replicas: the IDs as given).
	var deviceIDs []string
	for _, id := range ids {
		if !slices.Contains(deviceIDs, id) {
			deviceIDs = append(deviceIDs, id)
		}
	}
	response := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	switch p.strategy {
	case "envvar": // updateResponseForDeviceListEnvVar
		response.Envs[nvidiaDeviceListEnvVar] = strings.Join(deviceIDs, ",")
	case "volume-mounts": // updateResponseForDeviceMounts
		response.Envs[nvidiaDeviceListEnvVar] = nvidiaVolumeMountsRoot
		for _, id := range deviceIDs {
			response.Mounts = append(response.Mounts, &pluginapi.Mount{
				HostPath:      nvidiaVolumeMountsHostPath,
				ContainerPath: filepath.Join(nvidiaVolumeMountsRoot, id),
			})
		}
	}
	if p.noDeviceSpecs.Load() {
		return response, nil
	}
	// PASS_DEVICE_SPECS=true: apiDeviceSpecs(devRoot, requestIds) over
	// GetDevicePaths: the control nodes (each only where it exists),
	// then each GPU's /dev/nvidia<minor>.
	optional := map[string]bool{"/dev/nvidiactl": true, "/dev/nvidia-uvm": true, "/dev/nvidia-uvm-tools": true, "/dev/nvidia-modeset": true}
	paths := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
	for _, id := range ids {
		i := slices.IndexFunc(p.gpus, func(g simnode.GPU) bool { return g.UUID == id })
		if i < 0 {
			return nil, fmt.Errorf("unknown device %q", id)
		}
		paths = append(paths, fmt.Sprintf("/dev/nvidia%d", p.gpus[i].Minor))
	}
	for _, path := range paths {
		if optional[path] {
			if _, err := os.Stat(filepath.Join(p.devRoot, path)); err != nil {
				continue
			}
		}
		response.Devices = append(response.Devices, &pluginapi.DeviceSpec{
			ContainerPath: path,
			HostPath:      filepath.Join(p.devRoot, path),
			Permissions:   "rw",
		})
	}
	return response, nil
}

// startStandIn serves p on a socket in the kubelet's device plugin
// directory and registers it with the kubelet; it stops when the test ends.
func startStandIn(t *testing.T, p *standInNVIDIAPlugin) {
	t.Helper()
	startStandInAt(t, p, harness.DevicePluginDir)
}

// startStandInAt is startStandIn for the kubelet whose device plugin
// directory is dir (a cluster node's, seen from the host).
func startStandInAt(t *testing.T, p *standInNVIDIAPlugin, dir string) {
	t.Helper()
	name := "nri-gpu-e2e-standin-" + strings.NewReplacer("/", "-", ".", "-").Replace(p.resource) + ".sock"
	// The kubelet's device manager starts after /pods answers: it empties
	// the directory, then serves kubelet.sock. A socket made before that
	// would be removed under us.
	kubeletSock := filepath.Join(dir, "kubelet.sock")
	waitFor(t, 30*time.Second, "the kubelet's "+kubeletSock, func() (bool, string) {
		c, err := net.Dial("unix", kubeletSock)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	p.socket = filepath.Join(dir, name)
	os.Remove(p.socket)
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	p.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func() { _ = p.server.Serve(l) }()
	t.Cleanup(func() {
		p.server.Stop()
		os.Remove(p.socket)
	})
	var last error
	waitFor(t, 30*time.Second, "registering "+p.resource+" with the kubelet", func() (bool, string) {
		last = register(p, dir, name)
		return last == nil, fmt.Sprint(last)
	})
}

// register registers p, served on endpoint (a socket name in the device
// plugin directory dir), with the kubelet.
func register(p *standInNVIDIAPlugin, dir, endpoint string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	return err
}

// TestKubeletNVIDIAPluginShapes runs static pods under a real kubelet whose
// GPUs come from stand-ins of NVIDIA's device plugin (nri-gpu's own device
// plugin off), one per device list strategy: nvidia.com/gpu (envvar, GPUs 0
// and 1) and nvidia.com/gpu-vm (volume-mounts, GPUs 2 and 3; a resource of
// its own only so that both shapes run against one kubelet). Each pod must
// run with exactly the kubelet's GPUs, the driver files injected once, the
// GPUs booked in nri-gpu's table; a second pod of the resource and a pod of
// nri-gpu's own count request get other GPUs.
func TestKubeletNVIDIAPluginShapes(t *testing.T) {
	if os.Getenv(kubeletOptIn) != "1" {
		t.Skipf("runs only with %s=1", kubeletOptIn)
	}
	c := startRuntime(t, harness.RuntimeOptions{})
	// exclusive: a GPU held by one container is nobody else's, so a
	// second holder of a kubelet-given GPU would fail, not go unnoticed.
	n := newNode(t, simnode.LayoutRHEL, "sharing: exclusive\n")
	k := startKubelet(t, c)
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: context.Background()}
	socket := filepath.Join(t.TempDir(), "status.sock")
	w.plugin = startPlugin(t, c, n, "--status-socket", socket)
	startStandIn(t, &standInNVIDIAPlugin{resource: "nvidia.com/gpu", strategy: "envvar", gpus: n.GPUs[:2], devRoot: n.Root})
	startStandIn(t, &standInNVIDIAPlugin{resource: "nvidia.com/gpu-vm", strategy: "volume-mounts", gpus: n.GPUs[2:], devRoot: n.Root})
	for _, r := range []struct {
		res  string
		gpus []simnode.GPU
	}{{"nvidia.com/gpu", n.GPUs[:2]}, {"nvidia.com/gpu-vm", n.GPUs[2:]}} {
		var want []string
		for _, g := range r.gpus {
			want = append(want, g.UUID)
		}
		want = sorted(want)
		waitFor(t, 30*time.Second, "kubelet checkpoint lists "+r.res, func() (bool, string) {
			cp, err := harness.ReadDeviceCheckpoint()
			if err != nil {
				return false, err.Error()
			}
			return slices.Equal(sorted(cp.Registered[r.res]), want), fmt.Sprintf("%v", cp.Registered)
		})
	}

	held := map[string]string{} // UUID -> pod
	check := func(t *testing.T, c *ctr, assigned []string) {
		t.Helper()
		checkKubeletGPUs(t, c, assigned)
		if out, code := c.sh("gpucheck cuda nvml"); code != 0 || !strings.Contains(out, fmt.Sprintf("devices=%d", len(assigned))) {
			t.Errorf("gpucheck cuda nvml: exit %d\n%s\n%s", code, out, c.view())
		}
		spec, err := w.cri.RuntimeSpec(w.ctx, c.id)
		if err != nil {
			t.Fatal(err)
		}
		// Injected once: no mount destination and no device node twice.
		seen := map[string]int{}
		for _, m := range spec.Mounts {
			seen["mount "+m.Destination]++
		}
		if spec.Linux != nil {
			for _, d := range spec.Linux.Devices {
				seen["device "+d.Path]++
			}
		}
		for what, k := range seen {
			if k > 1 {
				t.Errorf("%s: %s %d times in the OCI spec", c.name, what, k)
			}
		}
		driver := 0
		for _, m := range spec.Mounts {
			if strings.HasPrefix(m.Source, n.Root) {
				driver++
			}
		}
		if driver == 0 {
			t.Errorf("%s: no driver file mounted from the node", c.name)
		}
		for _, l := range strings.Split(w.plugin.log.String(), "\n") {
			if strings.Contains(l, "pod="+c.name+"-"+k.Opts.NodeName) {
				t.Logf("nri-gpu: %s", l)
			}
		}
		// Booked in nri-gpu's table for this container alone.
		rows := readStatus(t, socket)
		for _, u := range assigned {
			i := slices.IndexFunc(n.GPUs, func(g simnode.GPU) bool { return g.UUID == u })
			hs := holdersOf(rows, n.GPUs[i].Index)
			if len(hs) != 1 || hs[0].Pod != c.name+"-"+k.Opts.NodeName {
				t.Errorf("GPU %d (%s) holders %+v, want %s alone", n.GPUs[i].Index, u, hs, c.name)
			} else {
				t.Logf("GPU %d booked for %s (mode %s, kubelet %v)", n.GPUs[i].Index, hs[0], hs[0].Mode, hs[0].Kubelet)
			}
			if p, ok := held[u]; ok {
				t.Errorf("%s got GPU %s, held by %s", c.name, u, p)
			}
			held[u] = c.name
		}
	}
	// source is the request source nri-gpu names in its log line.
	for _, tc := range []struct{ name, res, source string }{
		{"envvar", "nvidia.com/gpu", "env NVIDIA_VISIBLE_DEVICES: the runtime already gives"},
		{"volume-mounts", "nvidia.com/gpu-vm", "mounts " + nvidiaVolumeMountsRoot + ": the runtime already gives"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, "-", "")
			c, assigned := runStaticPod(t, w, k, name, podManifest(name, nil, map[string]int{tc.res: 1}, nil), tc.res, 1)
			check(t, c, assigned)
			if !strings.Contains(w.plugin.log.String(), tc.source) {
				t.Errorf("nri-gpu's log has no %q", tc.source)
			}
			if tc.name == "volume-mounts" {
				// The device list mounts stay as the kubelet made them.
				if out, code := c.sh("ls " + nvidiaVolumeMountsRoot); code != 0 || strings.TrimSpace(out) != assigned[0] {
					t.Errorf("ls %s: %q (exit %d), want %s", nvidiaVolumeMountsRoot, out, code, assigned[0])
				}
			}
		})
	}
	t.Run("a second pod does not get them", func(t *testing.T) {
		c, assigned := runStaticPod(t, w, k, "envvar2", podManifest("envvar2", nil, map[string]int{"nvidia.com/gpu": 1}, nil), "nvidia.com/gpu", 1)
		check(t, c, assigned)
		// nri-gpu's own count request: the one GPU nobody holds.
		if err := k.AddStaticPod("own", podManifest("own", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, nil, nil)); err != nil {
			t.Fatal(err)
		}
		var free string
		for _, g := range n.GPUs {
			if _, ok := held[g.UUID]; !ok {
				free = g.UUID
			}
		}
		var own *ctr
		waitFor(t, 60*time.Second, "pod own running", func() (bool, string) {
			p, err := k.Pod(w.ctx, "own")
			if err != nil {
				return false, err.Error()
			}
			if p.Status.Phase != "Running" || len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
				return false, p.Status.Phase + " " + p.Status.Message
			}
			own = &ctr{w: w, id: strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://"), name: "own"}
			return true, ""
		})
		if got := envOf(own, "NVIDIA_VISIBLE_DEVICES"); got != free {
			t.Errorf("nri-gpu's count request got %q, want the free %s (held: %v)", got, free, held)
		}
		if got := gpuNodes(own); len(got) != 1 {
			t.Errorf("nri-gpu's count request: GPU nodes %q, want one", got)
		}
	})
}
