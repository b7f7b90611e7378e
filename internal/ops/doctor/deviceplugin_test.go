package doctor

import (
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestDevicePluginRegistration: with devicePlugin.enabled, doctor checks
// the kubelet's socket (present, accepting) and nri-gpu's own socket in
// the kubelet's directory, with a fix for each failure.
func TestDevicePluginRegistration(t *testing.T) {
	f := newFixture(t, simnode.Options{})
	f.o.Config.DevicePlugin.Enabled = true
	// socketDir as the device plugin serves it (the DaemonSet's mount),
	// not a path under hostRoot.
	dir := f.n.HostPath(config.DefaultDevicePluginDir)
	f.o.Config.DevicePlugin.SocketDir = dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	kubelet := filepath.Join(dir, config.KubeletSocketName)
	own := filepath.Join(dir, config.DevicePluginSocketName(config.DefaultResourceName))
	if filepath.Base(own) != "nri-gpu-nvidia.com-gpu.sock" {
		t.Errorf("own socket %s", own)
	}
	listen := func(path string) *net.UnixListener {
		t.Helper()
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}

	// No kubelet, no plugin socket.
	results := Run(f.o)
	expect(t, results, "kubelet socket", Fail, kubelet+": not found")
	expect(t, results, "device plugin", Fail, "nri-gpu's device plugin socket "+own+": not found")
	if OK(results) {
		t.Error("OK without the kubelet")
	}

	// A stale kubelet socket: nobody accepts.
	l := listen(kubelet)
	l.SetUnlinkOnClose(false)
	l.Close()
	expect(t, Run(f.o), "kubelet socket", Fail, "refuses connections")
	os.Remove(kubelet)

	// The kubelet serves; a socket is there that answers nothing.
	listen(kubelet)
	mute := listen(own)
	results = Run(f.o)
	expect(t, results, "kubelet socket", Pass, "accepts connections")
	expect(t, results, "device plugin", Fail, own+": does not answer the kubelet's ListAndWatch")
	mute.Close()

	// nri-gpu's device plugin serves: its devices, as the kubelet gets
	// them.
	lw := &listWatch{devs: []*pluginapi.Device{{ID: "GPU-a", Health: pluginapi.Healthy}, {ID: "GPU-b", Health: pluginapi.Unhealthy}}}
	serveDevicePlugin(t, own, lw)
	results = Run(f.o)
	expect(t, results, "device plugin", Pass, "nri-gpu serves nvidia.com/gpu on "+own+": 2 devices advertised, 1 healthy")
	lw.mu.Lock()
	lw.devs = []*pluginapi.Device{{ID: "GPU-a", Health: pluginapi.Unhealthy}, {ID: "GPU-b", Health: pluginapi.Unhealthy}}
	lw.mu.Unlock()
	expect(t, Run(f.o), "device plugin", Warn, "with 2 devices, 0 healthy: the scheduler sees no GPU here")

	// A file where nri-gpu's socket should be.
	lw.stop()
	os.Remove(own)
	os.WriteFile(own, nil, 0o600)
	expect(t, Run(f.o), "device plugin", Fail, "exists and is not a socket")

	// Another directory and resource, from the configuration: the
	// directory as nri-gpu sees it, never under hostRoot (the DaemonSet
	// mounts the kubelet's directory at socketDir, not under /host).
	other := f.n.HostPath("/srv/dp")
	f.o.Config.DevicePlugin.SocketDir, f.o.Config.DevicePlugin.ResourceName = other, "example.com/gpu"
	expect(t, Run(f.o), "kubelet socket", Fail, other+"/kubelet.sock: not found")
}

// listWatch answers ListAndWatch with devs, as a device plugin answers
// the kubelet, and waits.
type listWatch struct {
	pluginapi.UnimplementedDevicePluginServer
	mu   sync.Mutex
	devs []*pluginapi.Device
	stop func()
}

func (l *listWatch) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	l.mu.Lock()
	devs := l.devs
	l.mu.Unlock()
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// serveDevicePlugin serves l's DevicePlugin service on socket until the
// test ends or l.stop.
func serveDevicePlugin(t *testing.T, socket string, l *listWatch) {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, l)
	go s.Serve(ln)
	l.stop = s.Stop
	t.Cleanup(s.Stop)
}
