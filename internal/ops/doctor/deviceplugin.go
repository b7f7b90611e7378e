package doctor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
)

// checkDevicePlugin checks the kubelet device plugin's registration when
// the configuration turns it on (devicePlugin.enabled): the kubelet's
// Registration socket (kubelet.sock in devicePlugin.socketDir) exists and
// accepts connections, and nri-gpu's own socket is in that directory (the
// kubelet removes every socket there when it starts; nri-gpu serves again
// and registers again) and answers ListAndWatch as it answers the kubelet:
// the devices advertised, and how many are healthy. Off, it is skipped
// and says so.
func checkDevicePlugin(o *Options, out *[]Result) {
	const name = "device plugin"
	dp := o.Config.DevicePlugin
	if !dp.Enabled {
		add(out, Injection, name, Skip, "not checked: devicePlugin.enabled is off in nri-gpu's configuration (GPUs are not advertised to the kubelet)",
			"to advertise the GPUs as "+config.DefaultResourceName+", set devicePlugin.enabled: true (the Kubernetes deployment does)")
		return
	}
	dir, resource := dp.SocketDir, dp.ResourceName
	if dir == "" {
		dir = config.DefaultDevicePluginDir
	}
	if resource == "" {
		resource = config.DefaultResourceName
	}
	// socketDir is a path in nri-gpu's own file system, where its device
	// plugin serves (the DaemonSet mounts the kubelet's directory there),
	// not one under hostRoot.
	mount := "(the DaemonSet must mount the kubelet's " + config.DefaultDevicePluginDir + "; devicePlugin.socketDir says where)"
	kubelet := filepath.Join(dir, config.KubeletSocketName)
	fi, err := os.Lstat(kubelet)
	switch {
	case err != nil:
		add(out, Injection, "kubelet socket", Fail, kubelet+": "+errText(err),
			"start the kubelet on this node, or set devicePlugin.socketDir to the directory where it serves "+config.KubeletSocketName+" "+mount)
	case fi.Mode()&os.ModeSocket == 0:
		add(out, Injection, "kubelet socket", Fail, kubelet+": exists and is not a socket", "remove it and restart the kubelet, which makes its socket there")
	default:
		c, err := net.DialTimeout("unix", kubelet, 2*time.Second)
		if err != nil {
			add(out, Injection, "kubelet socket", Fail, kubelet+": refuses connections (a socket left by a kubelet that is not running?): "+err.Error(),
				"start (or restart) the kubelet; nri-gpu registers again when the kubelet makes its socket anew")
		} else {
			c.Close()
			add(out, Injection, "kubelet socket", Pass, kubelet+" accepts connections", "")
		}
	}
	own := filepath.Join(dir, config.DevicePluginSocketName(resource))
	fi, err = os.Lstat(own)
	switch {
	case err != nil:
		add(out, Injection, name, Fail, "nri-gpu's device plugin socket "+own+": "+errText(err)+": "+resource+" is not served to the kubelet",
			"run nri-gpu run with devicePlugin.enabled: true and look in its log for \"device plugin\" "+mount+
				"; after a kubelet restart nri-gpu serves its socket again within seconds")
	case fi.Mode()&os.ModeSocket == 0:
		add(out, Injection, name, Fail, own+": exists and is not a socket", "remove it; nri-gpu run makes its socket there")
	default:
		n, healthy, err := advertised(own)
		switch {
		case err != nil:
			add(out, Injection, name, Fail, own+": does not answer the kubelet's ListAndWatch (a socket left by an nri-gpu that stopped?): "+err.Error(),
				"restart nri-gpu run with devicePlugin.enabled: true; it replaces the socket and registers again")
		case n == 0 || healthy == 0:
			add(out, Injection, name, Warn, fmt.Sprintf("nri-gpu serves %s on %s, with %d devices, %d healthy: the scheduler sees no GPU here", resource, own, n, healthy),
				"run nri-gpu inventory: discovery finds no GPU, or the driver is not loaded")
		default:
			add(out, Injection, name, Pass, fmt.Sprintf("nri-gpu serves %s on %s: %d devices advertised, %d healthy", resource, own, n, healthy), "")
		}
	}
}

// advertised asks the device plugin serving socket for its devices, as
// the kubelet does (ListAndWatch, first answer), within listTimeout, and
// counts them and the healthy ones.
func advertised(socket string) (n, healthy int, err error) {
	conn, err := grpc.NewClient("unix:"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
	defer cancel()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return 0, 0, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return 0, 0, err
	}
	for _, d := range resp.GetDevices() {
		n++
		if d.GetHealth() == pluginapi.Healthy {
			healthy++
		}
	}
	return n, healthy, nil
}

// listTimeout bounds doctor's ListAndWatch call to the device plugin.
const listTimeout = 2 * time.Second

// errText says "not found" for a missing file, else the error.
func errText(err error) string {
	if os.IsNotExist(err) {
		return "not found"
	}
	return err.Error()
}
