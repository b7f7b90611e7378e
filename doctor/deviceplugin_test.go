package doctor

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/nri-gpu/nri-gpu/config"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestDevicePluginRegistration: with devicePlugin.enabled, doctor checks
// the kubelet's socket (present, accepting) and nri-gpu's own socket in
// the kubelet's directory, with a fix for each failure.
func TestDevicePluginRegistration(t *testing.T) {
	f := newFixture(t, simnode.Options{})
	f.o.Config.DevicePlugin.Enabled = true
	dir := f.n.HostPath(config.DefaultDevicePluginDir)
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

	// The kubelet serves; nri-gpu's socket is there.
	listen(kubelet)
	listen(own)
	results = Run(f.o)
	expect(t, results, "kubelet socket", Pass, "accepts connections")
	expect(t, results, "device plugin", Pass, "nri-gpu serves nvidia.com/gpu on "+own)

	// A file where nri-gpu's socket should be.
	os.Remove(own)
	os.WriteFile(own, nil, 0o600)
	expect(t, Run(f.o), "device plugin", Fail, "exists and is not a socket")

	// Another directory and resource, from the configuration.
	f.o.Config.DevicePlugin.SocketDir, f.o.Config.DevicePlugin.ResourceName = "/srv/dp", "example.com/gpu"
	expect(t, Run(f.o), "kubelet socket", Fail, f.n.HostPath("/srv/dp/kubelet.sock")+": not found")
}
