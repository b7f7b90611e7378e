package dra

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
)

// TestNVIDIASelectors evaluates selectors written for NVIDIA's DRA driver
// with the scheduler's own CEL library: on nri-gpu's devices (driver
// gpu.nri-gpu.dev, attributes qualified gpu.nvidia.com/...) each selects
// exactly what it selects on the same devices as NVIDIA's driver
// publishes them (driver gpu.nvidia.com, attributes unqualified), and what
// the case says. Only a DeviceClass's device.driver test changes.
func TestNVIDIASelectors(t *testing.T) {
	st := stateOf(testSnapshot(), draConfig())
	var ours []resourceapi.Device
	for _, u := range units(st) {
		ours = append(ours, sliceDevice(u, st.Snapshot(), func(string) string { return "pci0000:10" }, nil))
	}
	theirs := nvidiaPublished(ours)
	const nv = "device.attributes['gpu.nvidia.com']"
	for _, tc := range []struct {
		name, expr string
		want       []string
	}{
		{"class gpu", nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}},
		{"class mig", nv + ".type == 'mig'", []string{"gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}},
		{"product name", nv + ".productName == 'NVIDIA H100 80GB HBM3' && " + nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}},
		{"memory at least 40Gi", "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0", []string{"gpu-0", "gpu-2"}},
		{"memory below 20Gi", "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('20Gi')) < 0", []string{"gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}},
		{"uuid", nv + ".uuid == 'GPU-cccccccc'", []string{"gpu-2"}},
		{"architecture", nv + ".architecture == 'Hopper' && " + nv + ".brand == 'Nvidia'", []string{"gpu-0", "gpu-2", "gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}},
		{"compute capability", nv + ".cudaComputeCapability.compareTo(semver('9.0.0')) >= 0 && " + nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}},
		{"driver version", nv + ".driverVersion.isGreaterThan(semver('580.126.8')) && " + nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}},
		{"driver too old", nv + ".driverVersion.isLessThan(semver('570.0.0'))", nil},
		{"CUDA driver version", nv + ".cudaDriverVersion.compareTo(semver('13.0.0')) == 0 && " + nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}},
		{"parent and profile", nv + ".type == 'mig' && " + nv + ".parentUUID == 'GPU-bbbbbbbb' && " + nv + ".profile == '1g.10gb'", []string{"gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}},
		{"memory slice", "'memorySlice5' in device.capacity['gpu.nvidia.com']", []string{"gpu-1-mig-1g10gb-19-5"}},
		{"pci bus id", "device.attributes['resource.kubernetes.io'].pciBusID == '0000:3a:00.0'", []string{"gpu-2"}},
		{"numa node", "device.attributes['resource.kubernetes.io'].numaNode == 1", []string{"gpu-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := selectNames(t, tc.expr, DefaultDriver, ours)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("on nri-gpu (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(selectNames(t, tc.expr, NVIDIADomain, theirs), got); diff != "" {
				t.Errorf("NVIDIA's driver selects otherwise (-nvidia +nri-gpu):\n%s", diff)
			}
		})
	}
	// The DeviceClasses: NVIDIA's expression with device.driver changed.
	class := "device.driver == 'gpu.nri-gpu.dev' && " + nv + ".type == 'gpu'"
	if got := selectNames(t, class, DefaultDriver, ours); !cmp.Equal(got, []string{"gpu-0", "gpu-2"}) {
		t.Errorf("DeviceClass gpu.nri-gpu.dev selects %v", got)
	}
}

// DefaultDriver is the driver name the tests publish under.
const DefaultDriver = testDriver

// nvidiaPublished returns devs as NVIDIA's driver publishes them: the
// attributes and capacities of its domain unqualified.
func nvidiaPublished(devs []resourceapi.Device) []resourceapi.Device {
	out := make([]resourceapi.Device, 0, len(devs))
	for _, d := range devs {
		n := resourceapi.Device{Name: d.Name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}}
		for k, v := range d.Attributes {
			n.Attributes[resourceapi.QualifiedName(strings.TrimPrefix(string(k), NVIDIADomain+"/"))] = v
		}
		for k, v := range d.Capacity {
			n.Capacity[resourceapi.QualifiedName(strings.TrimPrefix(string(k), NVIDIADomain+"/"))] = v
		}
		out = append(out, n)
	}
	return out
}

func selectNames(t *testing.T, expr, driver string, devs []resourceapi.Device) []string {
	t.Helper()
	prog := cel.GetCompiler(cel.Features{}).CompileCELExpression(expr, cel.Options{})
	if prog.Error != nil {
		t.Fatalf("compile %s: %v", expr, prog.Error)
	}
	var out []string
	for _, d := range devs {
		ok, _, err := prog.DeviceMatches(context.Background(), cel.Device{Driver: driver, Attributes: d.Attributes, Capacity: d.Capacity})
		if err != nil {
			t.Fatalf("%s on %s: %v", expr, d.Name, err)
		}
		if ok {
			out = append(out, d.Name)
		}
	}
	return out
}
