package doctor

import (
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/nri-gpu/nri-gpu/config"
)

// checkDevicePlugin checks the kubelet device plugin's registration when
// the configuration turns it on (devicePlugin.enabled): the kubelet's
// Registration socket (kubelet.sock in devicePlugin.socketDir) exists and
// accepts connections, and nri-gpu's own socket is in that directory (the
// kubelet removes every socket there when it starts; nri-gpu serves again
// and registers again). Off, it is skipped and says so.
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
	dir = o.host(dir)
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
		add(out, Injection, name, Pass, "nri-gpu serves "+resource+" on "+own, "")
	}
}

// errText says "not found" for a missing file, else the error.
func errText(err error) string {
	if os.IsNotExist(err) {
		return "not found"
	}
	return err.Error()
}
