package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestDevicePlugin checks the devicePlugin key: off by default, its
// defaults, and the errors that name its bad keys and values.
func TestDevicePlugin(t *testing.T) {
	c, err := Parse(nil)
	if err != nil || !reflect.DeepEqual(c.DevicePlugin, DevicePlugin{ResourceName: "nvidia.com/gpu", SocketDir: "/var/lib/kubelet/device-plugins", DevRoot: "/dev", MIGStrategy: "none", SharedDevicesAllocationPolicy: "distributed", MPSRoot: "/run/nri-gpu/mps"}) {
		t.Errorf("default devicePlugin: %+v, %v; want off, nvidia.com/gpu, /var/lib/kubelet/device-plugins, /dev, MIG strategy none", c.DevicePlugin, err)
	}
	c, err = Parse([]byte("devicePlugin:\n  enabled: true\n  resourceName: example.com/Accel_1\n  socketDir: /run/kubelet/dp\n  devRoot: /srv/node/dev\n  migStrategy: mixed\n"))
	if err != nil || !reflect.DeepEqual(c.DevicePlugin, DevicePlugin{Enabled: true, ResourceName: "example.com/Accel_1", SocketDir: "/run/kubelet/dp", DevRoot: "/srv/node/dev", MIGStrategy: "mixed", SharedDevicesAllocationPolicy: "distributed", MPSRoot: "/run/nri-gpu/mps"}) {
		t.Errorf("devicePlugin set: %+v, %v", c.DevicePlugin, err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"devicePlugin:\n  enable: true\n", `key devicePlugin: unknown field "enable" (valid keys: enabled, resourceName, socketDir, devRoot, migStrategy, devices, sharing, sharedDevicesAllocationPolicy, mpsRoot)`},
		{"devicePlugin:\n  devRoot: dev\n", `key devicePlugin.devRoot: "dev" must be an absolute, clean path`},
		{"devicePlugin:\n  migStrategy: Mixed\n", `key devicePlugin.migStrategy: unknown strategy "Mixed" (valid: none, single, mixed)`},
		{"devicePlugin:\n  SocketDir: /x\n", `did you mean "socketDir"?`},
		{"devicePlugin:\n  enabled: yes please\n", `devicePlugin.enabled`},
		{"devicePlugin:\n  socketDir: var/lib/kubelet\n", `key devicePlugin.socketDir: "var/lib/kubelet" must be an absolute, clean path`},
		{"devicePlugin:\n  socketDir: /var/lib/kubelet/device-plugins/\n", `key devicePlugin.socketDir: "/var/lib/kubelet/device-plugins/" must be an absolute, clean path`},
		{"devicePlugin:\n  socketDir: /" + strings.Repeat("d", 100) + "\n", `more than a unix socket allows`},
		{"devicePlugin:\n  resourceName: gpu\n", `key devicePlugin.resourceName: "gpu" is not an extended resource name such as nvidia.com/gpu: it must be <domain>/<name>`},
		{"devicePlugin:\n  resourceName: kubernetes.io/gpu\n", `Kubernetes' own`},
		{"devicePlugin:\n  resourceName: Nvidia.com/gpu\n", `the domain's label "Nvidia"`},
		{"devicePlugin:\n  resourceName: nvidia.com/gpu-\n", `the name "gpu-" after '/'`},
		{"devicePlugin:\n  resourceName: nvidia.com/a/b\n", `more than one '/'`},
		{"devicePlugin:\n  resourceName: nvidia..com/gpu\n", `the domain's label ""`},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
