package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDeviceSharing checks devicePlugin.sharing in NVIDIA's device
// plugin's shape: the defaults of failRequestsGreaterThanOne (false under
// timeSlicing, true under mps), renameByDefault's <name>.shared, the
// three forms of devices, and the allocation policy and MPS root.
func TestDeviceSharing(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       DevicePlugin
	}{
		{"time-slicing", `
devicePlugin:
  enabled: true
  sharing:
    timeSlicing:
      resources:
      - name: nvidia.com/gpu
        replicas: 4
`, DevicePlugin{Sharing: DeviceSharing{TimeSlicing: &ReplicatedResources{FailRequestsGreaterThanOne: ptr(false),
			Resources: []ReplicatedResource{{Name: "nvidia.com/gpu", Devices: ReplicatedDevices{All: true}, Replicas: 4}}}}}},
		{"renamed, a count, packed", `
devicePlugin:
  enabled: true
  sharedDevicesAllocationPolicy: packed
  sharing:
    timeSlicing:
      renameByDefault: true
      failRequestsGreaterThanOne: true
      resources:
      - name: nvidia.com/gpu
        replicas: 2
        devices: 2
`, DevicePlugin{SharedDevicesAllocationPolicy: "packed", Sharing: DeviceSharing{TimeSlicing: &ReplicatedResources{RenameByDefault: true, FailRequestsGreaterThanOne: ptr(true),
			Resources: []ReplicatedResource{{Name: "nvidia.com/gpu", Rename: "nvidia.com/gpu.shared", Devices: ReplicatedDevices{Count: 2}, Replicas: 2}}}}}},
		{"mps, a list, an own rename", `
devicePlugin:
  enabled: true
  mpsRoot: /run/mps
  sharing:
    mps:
      renameByDefault: true
      resources:
      - name: nvidia.com/gpu
        rename: example.com/mps-gpu
        replicas: 8
        devices: [0, "2", "GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7"]
`, DevicePlugin{MPSRoot: "/run/mps", Sharing: DeviceSharing{MPS: &ReplicatedResources{RenameByDefault: true, FailRequestsGreaterThanOne: ptr(true),
			Resources: []ReplicatedResource{{Name: "nvidia.com/gpu", Rename: "example.com/mps-gpu", Replicas: 8,
				Devices: ReplicatedDevices{List: []string{"0", "2", "GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7"}}}}}}}},
		{"mps relaxed, MIG profile under time-slicing", `
devicePlugin:
  enabled: true
  migStrategy: mixed
  sharing:
    timeSlicing:
      resources:
      - name: nvidia.com/mig-1g.10gb
        replicas: 3
        devices: all
`, DevicePlugin{MIGStrategy: "mixed", Sharing: DeviceSharing{TimeSlicing: &ReplicatedResources{FailRequestsGreaterThanOne: ptr(false),
			Resources: []ReplicatedResource{{Name: "nvidia.com/mig-1g.10gb", Devices: ReplicatedDevices{All: true}, Replicas: 3}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			want.Enabled = true
			want.ResourceName, want.SocketDir, want.DevRoot = DefaultResourceName, DefaultDevicePluginDir, DefaultDevRoot
			if want.MIGStrategy == "" {
				want.MIGStrategy = MIGStrategyNone
			}
			if want.SharedDevicesAllocationPolicy == "" {
				want.SharedDevicesAllocationPolicy = PolicyDistributed
			}
			if want.MPSRoot == "" {
				want.MPSRoot = DefaultMPSRoot
			}
			if d := cmp.Diff(want, c.DevicePlugin); d != "" {
				t.Errorf("devicePlugin (-want +got):\n%s", d)
			}
		})
	}
	c, err := Parse([]byte("devicePlugin:\n  enabled: true\n  sharing:\n    mps:\n      failRequestsGreaterThanOne: false\n      resources: [{name: nvidia.com/gpu, replicas: 2}]\n"))
	if err != nil || c.DevicePlugin.Sharing.MPS.FailGreaterThanOne() {
		t.Errorf("mps with failRequestsGreaterThanOne: false: %+v, %v", c.DevicePlugin.Sharing.MPS, err)
	}
	if s, rr := c.DevicePlugin.Sharing.Strategy(); s != StrategyMPS || rr != c.DevicePlugin.Sharing.MPS {
		t.Errorf("Strategy() = %q, %p", s, rr)
	}
}

// TestDeviceSharingErrors checks that each bad sharing key is refused with
// its key, the bad value and what is valid.
func TestDeviceSharingErrors(t *testing.T) {
	const on = "devicePlugin:\n  enabled: true\n"
	ts := func(res string) string { return on + "  sharing:\n    timeSlicing:\n      resources:\n" + res }
	for _, tc := range []struct{ name, yaml, want string }{
		{"both strategies", on + "  sharing:\n    timeSlicing:\n      resources: [{name: nvidia.com/gpu, replicas: 2}]\n    mps:\n      resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
			"keys devicePlugin.sharing.timeSlicing and devicePlugin.sharing.mps: a node shares its GPUs one way"},
		{"device plugin off", "devicePlugin:\n  sharing:\n    timeSlicing:\n      resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
			"key devicePlugin.sharing.timeSlicing: replicas are handed out by the device plugin, which is off; set devicePlugin.enabled: true"},
		{"no resources", on + "  sharing:\n    timeSlicing:\n      renameByDefault: true\n", "key devicePlugin.sharing.timeSlicing.resources: no resources"},
		{"unknown key", ts("      - name: nvidia.com/gpu\n        replica: 2\n"), `key devicePlugin.sharing.timeSlicing.resources[0]: unknown field "replica" (valid keys: name, rename, devices, replicas)`},
		{"one replica", ts("      - name: nvidia.com/gpu\n        replicas: 1\n"), "key devicePlugin.sharing.timeSlicing.resources[0].replicas: 1 (valid: 2 to 1024 under time-slicing)"},
		{"too many MPS clients", on + "  sharing:\n    mps:\n      resources: [{name: nvidia.com/gpu, replicas: 49}]\n", "key devicePlugin.sharing.mps.resources[0].replicas: 49 (valid: 2 to 48 under mps)"},
		{"not served", ts("      - name: nvidia.com/gpu.shared\n        replicas: 2\n"), `key devicePlugin.sharing.timeSlicing.resources[0].name: "nvidia.com/gpu.shared" is not a resource the device plugin serves (valid: nvidia.com/gpu)`},
		{"MIG without mixed", ts("      - name: nvidia.com/mig-1g.10gb\n        replicas: 2\n"), "key devicePlugin.sharing.timeSlicing.resources[0].name: nvidia.com/mig-1g.10gb is a MIG profile's resource, which only migStrategy mixed advertises (devicePlugin.migStrategy is none)"},
		{"twice", ts("      - {name: nvidia.com/gpu, replicas: 2}\n      - {name: nvidia.com/gpu, replicas: 3}\n"), "key devicePlugin.sharing.timeSlicing.resources[1].name: nvidia.com/gpu is replicated twice (also devicePlugin.sharing.timeSlicing.resources[0])"},
		{"bad rename", ts("      - {name: nvidia.com/gpu, rename: shared-gpu, replicas: 2}\n"), `key devicePlugin.sharing.timeSlicing.resources[0].rename: "shared-gpu" is not an extended resource name such as nvidia.com/gpu.shared: it must be <domain>/<name>`},
		{"rename to a served resource", "devicePlugin:\n  enabled: true\n  migStrategy: mixed\n  sharing:\n    timeSlicing:\n      resources:\n      - {name: nvidia.com/gpu, rename: nvidia.com/mig-1g.10gb, replicas: 2}\n",
			"key devicePlugin.sharing.timeSlicing.resources[0].rename: nvidia.com/mig-1g.10gb is a resource the device plugin serves itself"},
		{"two renames alike", "devicePlugin:\n  enabled: true\n  migStrategy: mixed\n  sharing:\n    timeSlicing:\n      resources:\n      - {name: nvidia.com/gpu, rename: example.com/shared, replicas: 2}\n      - {name: nvidia.com/mig-1g.10gb, rename: example.com/shared, replicas: 2}\n",
			"key devicePlugin.sharing.timeSlicing.resources[1].rename: example.com/shared is also devicePlugin.sharing.timeSlicing.resources[0].rename"},
		{"devices word", ts("      - {name: nvidia.com/gpu, replicas: 2, devices: some}\n"), `key devicePlugin.sharing.timeSlicing.resources[0].devices: "some" (valid: all, a count such as 2, or a list`},
		{"devices zero", ts("      - {name: nvidia.com/gpu, replicas: 2, devices: 0}\n"), "key devicePlugin.sharing.timeSlicing.resources[0].devices: 0 is not a count of devices (valid: 1 to 256)"},
		{"devices bad entry", ts("      - {name: nvidia.com/gpu, replicas: 2, devices: [0, /dev/nvidia1]}\n"), `key devicePlugin.sharing.timeSlicing.resources[0].devices[1]: "/dev/nvidia1" is not a GPU index, a <gpu>:<mig> MIG index or a GPU or MIG UUID`},
		{"devices twice", ts("      - {name: nvidia.com/gpu, replicas: 2, devices: [1, 1]}\n"), "key devicePlugin.sharing.timeSlicing.resources[0].devices[1]: 1 is listed twice"},
		{"devices empty list", ts("      - {name: nvidia.com/gpu, replicas: 2, devices: []}\n"), "key devicePlugin.sharing.timeSlicing.resources[0].devices: a list of 0 devices (valid: 1 to 256)"},
		{"mps with MIG", "devicePlugin:\n  enabled: true\n  migStrategy: single\n  sharing:\n    mps:\n      resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
			"key devicePlugin.sharing.mps: MPS does not share MIG devices, and devicePlugin.migStrategy single advertises them; use migStrategy: none, or sharing.timeSlicing"},
		{"policy", on + "  sharedDevicesAllocationPolicy: spread\n", `key devicePlugin.sharedDevicesAllocationPolicy: unknown policy "spread" (valid: distributed, packed)`},
		{"mps root relative", on + "  mpsRoot: run/mps\n", `key devicePlugin.mpsRoot: "run/mps" must be an absolute, clean path`},
		{"mps root system", on + "  mpsRoot: /var/lib/kubelet/mps\n", `key devicePlugin.mpsRoot: "/var/lib/kubelet/mps" is in the system directory /var/lib/kubelet`},
		{"mps root long", on + "  mpsRoot: /run/" + strings.Repeat("m", 60) + "\n", "must be at most 53 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v\nwant %q", err, tc.want)
			}
		})
	}
}
