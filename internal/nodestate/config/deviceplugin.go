package config

import "strings"

// DevicePluginSocketName is the file name of the device plugin's socket
// for a resource, in devicePlugin.socketDir:
// nri-gpu-<resource, with / as ->.sock ("nri-gpu-nvidia.com-gpu.sock").
// The device plugin serves it; nri-gpu doctor looks for it.
func DevicePluginSocketName(resource string) string {
	return "nri-gpu-" + strings.ReplaceAll(resource, "/", "-") + ".sock"
}

// KubeletSocketName is the name of the kubelet's Registration socket in
// devicePlugin.socketDir.
const KubeletSocketName = "kubelet.sock"
