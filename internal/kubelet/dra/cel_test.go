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
	const nv = "device.attributes['gpu.nvidia.com']"
	checkSelectors(t, ours, []selectorCase{
		{"class gpu", nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}, ""},
		{"class mig", nv + ".type == 'mig'", []string{"gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}, ""},
		{"product name", nv + ".productName == 'NVIDIA H100 80GB HBM3' && " + nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}, ""},
		{"memory at least 40Gi", "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0", []string{"gpu-0", "gpu-2"}, ""},
		{"memory below 20Gi", "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('20Gi')) < 0", []string{"gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}, ""},
		{"uuid", nv + ".uuid == 'GPU-cccccccc'", []string{"gpu-2"}, ""},
		{"architecture", nv + ".architecture == 'Hopper' && " + nv + ".brand == 'Nvidia'", []string{"gpu-0", "gpu-2", "gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}, ""},
		{"compute capability", nv + ".cudaComputeCapability.compareTo(semver('9.0.0')) >= 0 && " + nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}, ""},
		{"driver version", nv + ".driverVersion.isGreaterThan(semver('580.126.8')) && " + nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}, ""},
		{"driver too old", nv + ".driverVersion.isLessThan(semver('570.0.0'))", nil, ""},
		{"CUDA driver version", nv + ".cudaDriverVersion.compareTo(semver('13.0.0')) == 0 && " + nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}, ""},
		{"parent and profile", nv + ".type == 'mig' && " + nv + ".parentUUID == 'GPU-bbbbbbbb' && " + nv + ".profile == '1g.10gb'", []string{"gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}, ""},
		{"memory slice", "'memorySlice5' in device.capacity['gpu.nvidia.com']", []string{"gpu-1-mig-1g10gb-19-5"}, ""},
		{"pci bus id", "device.attributes['resource.kubernetes.io'].pciBusID == '0000:3a:00.0'", []string{"gpu-2"}, ""},
		{"numa node", "device.attributes['resource.kubernetes.io'].numaNode == 1", []string{"gpu-2"}, ""},
		{"product name prefix", nv + ".productName.startsWith('NVIDIA H100') && " + nv + ".type == 'mig'", []string{"gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}, ""},
		{"architecture not older", nv + ".architecture in ['Hopper', 'Blackwell'] && " + nv + ".type == 'gpu'", []string{"gpu-0", "gpu-2"}, ""},
		{"compute capability below 10", nv + ".cudaComputeCapability.isLessThan(semver('10.0.0')) && " + nv + ".type == 'mig'", []string{"gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"}, ""},
		{"compute capability 10 or newer", nv + ".cudaComputeCapability.compareTo(semver('10.0.0')) >= 0", nil, ""},
	})
	// The DeviceClasses: NVIDIA's expression with device.driver changed.
	class := "device.driver == 'gpu.nri-gpu.dev' && " + nv + ".type == 'gpu'"
	if got, _ := selectNames(t, class, DefaultDriver, ours); !cmp.Equal(got, []string{"gpu-0", "gpu-2"}) {
		t.Errorf("DeviceClass gpu.nri-gpu.dev selects %v", got)
	}
}

// TestNVIDIASelectorsSimulated: selectors written for NVIDIA's driver on
// the devices of a simulated H100 node with MIG, discovered through the
// simulated NVML (simulatedDevices: gpu-0 whole; gpu-2's 1g.10gb+me,
// 1g.20gb and 3g.40gb; gpu-1's 7g.80gb) select what they select on the
// same devices as NVIDIA's driver publishes them.
func TestNVIDIASelectorsSimulated(t *testing.T) {
	n, ours := simulatedDevices(t)
	const nv = "device.attributes['gpu.nvidia.com']"
	const capacity = "device.capacity['gpu.nvidia.com']"
	const me, twenty, three, seven = "gpu-2-mig-1g10gb-me-20-0", "gpu-2-mig-1g20gb-15-2", "gpu-2-mig-3g40gb-9-4", "gpu-1-mig-7g80gb-0-0"
	const mig = nv + ".type == 'mig' && "
	all := []string{"gpu-0", me, twenty, three, seven}
	checkSelectors(t, ours, []selectorCase{
		{"product name", nv + ".productName == 'NVIDIA H100 80GB HBM3'", all, ""},
		{"product name prefix", nv + ".productName.startsWith('NVIDIA H100')", all, ""},
		{"another product", nv + ".productName.startsWith('NVIDIA A100')", nil, ""},
		{"architecture", nv + ".architecture == 'Hopper' && " + nv + ".brand == 'Nvidia'", all, ""},
		{"architecture not older", nv + ".architecture in ['Hopper', 'Blackwell']", all, ""},
		{"compute capability", nv + ".cudaComputeCapability.compareTo(semver('9.0.0')) == 0", all, ""},
		{"compute capability at least 8.0", nv + ".cudaComputeCapability.isGreaterThan(semver('8.0.0'))", all, ""},
		{"compute capability 10 or newer", nv + ".cudaComputeCapability.compareTo(semver('10.0.0')) >= 0", nil, ""},
		{"CUDA 13", nv + ".cudaDriverVersion.compareTo(semver('13.0.0')) >= 0 && " + nv + ".type == 'gpu'", []string{"gpu-0"}, ""},
		// An H100's 81559 MiB are 79.6 GiB: an 80Gi selector selects none.
		{"whole GPU of 79Gi", nv + ".type == 'gpu' && " + capacity + ".memory.compareTo(quantity('79Gi')) >= 0", []string{"gpu-0"}, ""},
		{"whole GPU of 80Gi", nv + ".type == 'gpu' && " + capacity + ".memory.compareTo(quantity('80Gi')) >= 0", nil, ""},
		// A 3g.40gb has 39.5 GiB.
		{"MIG of 39Gi", nv + ".type == 'mig' && " + capacity + ".memory.compareTo(quantity('39Gi')) >= 0", []string{three, seven}, ""},
		{"MIG below 10Gi", capacity + ".memory.compareTo(quantity('10Gi')) < 0", []string{me}, ""},
		{"profile", mig + nv + ".profile == '3g.40gb'", []string{three}, ""},
		{"profile with media extensions", mig + nv + ".profile == '1g.10gb+me'", []string{me}, ""},
		{"profiles of one slice", mig + nv + ".profile.startsWith('1g.')", []string{me, twenty}, ""},
		{"parent", mig + nv + ".parentUUID == '" + n.GPUs[1].UUID + "'", []string{seven}, ""},
		{"multiprocessors", mig + capacity + ".multiprocessors.compareTo(quantity('60')) >= 0", []string{three, seven}, ""},
		{"an OFA engine", mig + capacity + ".ofaEngines.compareTo(quantity('1')) >= 0", []string{me, seven}, ""},
		{"memory slice 0", "'memorySlice0' in " + capacity, []string{me, seven}, ""},
		{"no addressing mode on x86", "!('addressingMode' in " + nv + ")", all, ""},
		// Reading an attribute a device lacks is a CEL runtime error,
		// which fails the claim's allocation, on NVIDIA's driver alike:
		// the MIG DeviceClass's type test comes first.
		{"profile of a whole GPU", nv + ".profile == '3g.40gb'", []string{three}, "gpu-0"},
	})
}

// selectorCase is a CEL selector, the devices it selects and the one it
// fails on (a CEL runtime error), by name.
type selectorCase struct {
	name, expr string
	want       []string
	fails      string
}

// checkSelectors evaluates each case's selector on ours (nri-gpu's
// devices) and on the same devices as NVIDIA's driver publishes them:
// both must select what the case says.
func checkSelectors(t *testing.T, ours []resourceapi.Device, cases []selectorCase) {
	t.Helper()
	theirs := nvidiaPublished(ours)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, fails := selectNames(t, tc.expr, DefaultDriver, ours)
			if diff := cmp.Diff(tc.want, got); diff != "" || fails != tc.fails {
				t.Errorf("on nri-gpu (-want +got):\n%s\nfails on %q, want %q", diff, fails, tc.fails)
			}
			theirsGot, theirsFail := selectNames(t, tc.expr, NVIDIADomain, theirs)
			if diff := cmp.Diff(theirsGot, got); diff != "" || theirsFail != fails {
				t.Errorf("NVIDIA's driver selects otherwise (-nvidia +nri-gpu):\n%s\nfails on %q, nri-gpu on %q", diff, theirsFail, fails)
			}
		})
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

// selectNames returns the devices expr selects, and the first it fails
// on with a runtime error ("" for none).
func selectNames(t *testing.T, expr, driver string, devs []resourceapi.Device) (names []string, fails string) {
	t.Helper()
	prog := cel.GetCompiler(cel.Features{}).CompileCELExpression(expr, cel.Options{})
	if prog.Error != nil {
		t.Fatalf("compile %s: %v", expr, prog.Error)
	}
	for _, d := range devs {
		ok, _, err := prog.DeviceMatches(context.Background(), cel.Device{Driver: driver, Attributes: d.Attributes, Capacity: d.Capacity})
		if err != nil && fails == "" {
			fails = d.Name
		}
		if ok {
			names = append(names, d.Name)
		}
	}
	return names, fails
}
