package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// TestDRA checks the dra key: off by default, its defaults (the plugin
// directory follows the driver name), and the errors that name its bad
// keys and values.
func TestDRA(t *testing.T) {
	c, err := Parse([]byte("dra:\n  enabled: true\n  driverName: gpu.example.com\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := DRA{Enabled: true, DriverName: "gpu.example.com", PluginDir: "/var/lib/kubelet/plugins/gpu.example.com",
		RegistrationDir: "/var/lib/kubelet/plugins_registry", CDIDir: "/var/run/cdi", MemoryShares: DRAMemoryShares{Minimum: "1Gi"}}
	if diff := cmp.Diff(want, c.DRA); diff != "" {
		t.Errorf("dra (-want +got):\n%s", diff)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"dra:\n  driverName: GPU.example.com\n", `key dra.driverName: "GPU.example.com" is not a DNS subdomain such as gpu.nri-gpu.dev: the label "GPU" is not lower-case`},
		{"dra:\n  driverName: gpu\n", `key dra.driverName: "gpu" is not a DNS subdomain such as gpu.nri-gpu.dev: it must contain a domain`},
		{"dra:\n  cdiDir: run/cdi\n", `key dra.cdiDir: "run/cdi" must be an absolute, clean path`},
		{"dra:\n  pluginDir: /" + strings.Repeat("x", 100) + "\n", `key dra.pluginDir: "/xxx`},
		{"dra:\n  devices: [\"0\", banana]\n", `key dra.devices: "banana" is not a GPU (valid: a GPU index such as 0, a GPU UUID such as GPU-<uuid>, a PCI bus id such as 0000:38:00.0)`},
		{"dra:\n  devices: [\"0000:38:00.0\", \"0000:38:00.0\"]\n", `key dra.devices: "0000:38:00.0" is listed twice`},
		{"dra:\n  devices: [\"0000:38:00.9\"]\n", `key dra.devices: "0000:38:00.9": bad PCI bus id`},
		{"devicePlugin:\n  devices: [\"01\"]\n", `key devicePlugin.devices: "01" is not a GPU`},
		{"dra:\n  enable: true\n", `key dra: unknown field "enable" (valid keys: enabled, driverName, pluginDir, registrationDir, cdiDir, kubeconfig, devices, memoryShares, dynamicMIG)`},
		// One allocator: both on needs both lists, disjoint.
		{"dra:\n  enabled: true\ndevicePlugin:\n  enabled: true\n", `keys dra.enabled and devicePlugin.enabled are both true, and dra.devices and devicePlugin.devices (empty) offers every GPU`},
		{"dra:\n  enabled: true\n  devices: [\"0\"]\ndevicePlugin:\n  enabled: true\n", `and devicePlugin.devices (empty) offers every GPU: a GPU is offered by one allocator only`},
		{"dra:\n  enabled: true\n  devices: [\"0\", GPU-abc]\ndevicePlugin:\n  enabled: true\n  devices: [\"1\", gpu-ABC]\n", `keys dra.devices and devicePlugin.devices both list "GPU-abc" (dra.devices) = "gpu-ABC" (devicePlugin.devices)`},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
	if _, err := Parse([]byte("dra:\n  enabled: true\n  devices: [\"0\", \"1\"]\ndevicePlugin:\n  enabled: true\n  devices: [\"2\", \"3\"]\n")); err != nil {
		t.Errorf("disjoint lists: %v", err)
	}
}

// TestOverlapOn checks the one-allocator check against a node's GPUs: a
// GPU named by index in one list and by UUID or bus id in the other is
// refused, naming both keys and the GPU; MIG devices go with their GPU.
func TestOverlapOn(t *testing.T) {
	gpus := []inventory.GPU{
		{Index: 0, UUID: "GPU-aaaa", BusID: "0000:38:00.0"},
		{Index: 1, UUID: "GPU-bbbb", BusID: "0000:3b:00.0"},
	}
	for _, tc := range []struct {
		name, dra, dp, want string
	}{
		{"disjoint", `["0"]`, `["1"]`, ""},
		{"index and UUID", `["0"]`, "[GPU-AAAA]", "keys dra.devices and devicePlugin.devices both name GPU 0 (GPU-aaaa, 0000:38:00.0)"},
		{"bus id and index", "[\"00000000:3B:00.0\"]", `["0", "1"]`, "both name GPU 1 (GPU-bbbb, 0000:3b:00.0)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte("dra:\n  enabled: true\n  devices: " + tc.dra + "\ndevicePlugin:\n  enabled: true\n  devices: " + tc.dp + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			err = c.OverlapOn(gpus)
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("OverlapOn = %v, want %q", err, tc.want)
			}
		})
	}
	mig := inventory.MIGDevice{UUID: "MIG-x", Parent: 1, ParentUUID: "GPU-bbbb"}
	unit := mig.Unit(gpus[1])
	if l := DeviceList([]string{"1"}); !l.Matches(unit, gpus[1]) {
		t.Error("a MIG device does not go with its GPU")
	}
	if l := DeviceList([]string{"0"}); l.Matches(unit, gpus[1]) {
		t.Error("a MIG device goes with another GPU")
	}
	if l := DeviceList(nil); !l.Matches(gpus[0], gpus[0]) {
		t.Error("an empty list does not offer every GPU")
	}
}
