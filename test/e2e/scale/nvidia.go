package scale

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// NVIDIA's DRA driver for GPUs (kubernetes-sigs/dra-driver-nvidia-gpu,
// served by the Go module proxy as github.com/NVIDIA/k8s-dra-driver-gpu
// v0.5.0), as its cmd/gpu-kubelet-plugin publishes a node without its
// alpha DynamicMIG gate (the static path of driver.go publishResources):
//
//   - one pool named after the node, in ONE ResourceSlice holding every
//     device (whole GPUs and static MIG devices alike);
//   - a whole GPU (deviceinfo.go GpuInfo.GetDevice) named gpu-<minor>,
//     attributes unqualified (the driver's domain gpu.nvidia.com): type
//     "gpu", uuid, productName, brand, architecture, and as versions
//     cudaComputeCapability, driverVersion, cudaDriverVersion (Masterminds
//     semver: "9.0.0", "580.126.9"), addressingMode where NVML reports one,
//     and the standard resource.kubernetes.io/pciBusID, pcieRoot and
//     numaNode where sysfs has them; capacity memory in bytes;
//   - a MIG device (MigDeviceInfo.GetDevice, mig.go CommonAttributesMig,
//     CommonCapacitiesMig) named gpu-<parent minor>-mig-<profile without
//     dots>-<GPU instance profile id>-<placement start>: type "mig",
//     parentUUID, profile, the parent's productName, brand, architecture
//     and versions, addressingMode, the parent's PCI attributes, its own
//     uuid; capacities multiprocessors, copyEngines, decoders, encoders,
//     jpegEngines, ofaEngines, memory (the profile's MiB in bytes) and
//     memorySlice<i> = 1 for each memory slice it occupies; no counters;
//   - with --consumable-shares=memory (alpha gate ConsumableShares,
//     consumable_shares.go applyConsumableShares): allowMultipleAllocations,
//     memory rounded down to a whole Mi with request policy default the
//     whole memory, validRange 1Mi to the whole memory in 1Mi steps;
//   - its DeviceClasses gpu.nvidia.com (with extendedResourceName
//     nvidia.com/gpu on resource.k8s.io/v1) and mig.nvidia.com, from its
//     Helm chart.
//
// This is read from NVIDIA's source, not copied from it; Captured replaces
// it with slices NVIDIA's real driver published.

// NVIDIADriver is NVIDIA's driver name.
const NVIDIADriver = "gpu.nvidia.com"

// NVIDIA is NVIDIA's shape of the inventory's nodes, as its driver's
// source publishes them (above).
func NVIDIA(inv *Inventory) *Shape {
	s := &Shape{Name: "nvidia", Driver: NVIDIADriver, GPUClass: "gpu.nvidia.com", MIGClass: "mig.nvidia.com",
		MemoryCapacity: "memory", devices: map[Variant][]resourceapi.Device{},
		Source: "NVIDIA's DRA driver v0.5.0's shape as its source publishes it (test/e2e/scale/nvidia.go) over the same discovered node"}
	s.Classes = classes(s.Driver, s.GPUClass, s.MIGClass, "nvidia.com/gpu")
	for _, v := range Variants {
		s.devices[v] = nvidiaDevices(inv.state(v).Snapshot(), inv.sysRoot(v), v == Shares)
	}
	return s
}

// nvidiaDevices are the snapshot's devices as NVIDIA's driver publishes
// them, by name (its static path's order is a map's; sorted here).
func nvidiaDevices(snap *inventory.Snapshot, sysRoot string, shares bool) []resourceapi.Device {
	var out []resourceapi.Device
	for _, g := range snap.GPUs {
		if g.MIGEnabled || g.Props == nil {
			continue
		}
		d := resourceapi.Device{Name: fmt.Sprintf("gpu-%d", g.Minor), Attributes: nvidiaAttrs(g, snap, sysRoot, "gpu"),
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: quantity(int64(g.Props.MemoryBytes))}}}
		d.Attributes["uuid"] = str(g.UUID)
		if shares {
			nvidiaShares(&d)
		}
		out = append(out, d)
	}
	for _, m := range snap.MIG {
		p, ok := gpuOf(snap, m.Parent)
		if !ok || m.Placement == nil || p.Props == nil {
			continue
		}
		d := resourceapi.Device{Name: fmt.Sprintf("gpu-%d-mig-%s-%d-%d", p.Minor, nvidiaProfileName(m.Profile), m.Placement.ProfileID, m.Placement.Start),
			Attributes: nvidiaAttrs(p, snap, sysRoot, "mig")}
		d.Attributes["parentUUID"], d.Attributes["profile"], d.Attributes["uuid"] = str(p.UUID), str(m.Profile), str(m.UUID)
		e := m.Engines
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"multiprocessors": count(e.Multiprocessors), "copyEngines": count(e.CopyEngines), "decoders": count(e.Decoders),
			"encoders": count(e.Encoders), "jpegEngines": count(e.JPEGs), "ofaEngines": count(e.OFAs),
			"memory": {Value: quantity(int64(m.MemoryMiB) << 20)},
		}
		for i := m.Placement.Start; i < m.Placement.Start+m.Placement.Size; i++ {
			d.Capacity[resourceapi.QualifiedName("memorySlice"+strconv.Itoa(i))] = count(1)
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// nvidiaAttrs are the attributes a whole GPU and its MIG devices share
// (uuid aside), typ being "gpu" or "mig"; the PCIe root from sysRoot's
// sysfs, as its nvlib.go reads it through the same library.
func nvidiaAttrs(g inventory.GPU, snap *inventory.Snapshot, sysRoot, typ string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	p := g.Props
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"type": str(typ), "productName": str(p.ProductName), "brand": str(p.Brand), "architecture": str(p.Architecture),
	}
	for name, v := range map[resourceapi.QualifiedName]string{"cudaComputeCapability": p.ComputeCapability,
		"driverVersion": snap.DriverVersion, "cudaDriverVersion": p.CUDADriverVersion} {
		if s, ok := semverOf(v); ok {
			a[name] = resourceapi.DeviceAttribute{VersionValue: &s}
		}
	}
	if p.AddressingMode != "" {
		a["addressingMode"] = str(p.AddressingMode)
	}
	if g.BusID != "" {
		a["resource.kubernetes.io/pciBusID"] = str(g.BusID)
	}
	if g.BusID != "" && sysRoot != "" {
		if r, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(g.BusID, deviceattribute.WithFSFromRoot(sysRoot)); err == nil && r.Value.StringValue != nil {
			a["resource.kubernetes.io/pcieRoot"] = str(*r.Value.StringValue)
		}
	}
	if g.NUMANode >= 0 {
		n := int64(g.NUMANode)
		a["resource.kubernetes.io/numaNode"] = resourceapi.DeviceAttribute{IntValue: &n}
	}
	return a
}

// nvidiaShares makes d shareable by memory as NVIDIA's
// --consumable-shares=memory does.
func nvidiaShares(d *resourceapi.Device) {
	yes := true
	d.AllowMultipleAllocations = &yes
	mem := d.Capacity["memory"]
	whole := quantity(mem.Value.Value() >> 20 << 20)
	step := quantity(1 << 20)
	mem.Value = whole
	mem.RequestPolicy = &resourceapi.CapacityRequestPolicy{Default: ptr(whole),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr(step), Max: ptr(whole), Step: ptr(step)}}
	d.Capacity["memory"] = mem
}

// nvidiaProfileName is a profile as NVIDIA's device names hold it: dots
// dropped, lower case, other characters than letters, digits, '-' and
// '.' as '-', trimmed of '-' (mig.go toRFC1123Compliant).
func nvidiaProfileName(profile string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.ReplaceAll(profile, ".", "")) {
		if 'a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String(), "-")
}

// semverOf is v ("580.126.09", "9.0") as Masterminds' semver prints it
// ("580.126.9", "9.0.0"); ok is false for anything else.
func semverOf(v string) (string, bool) {
	parts := strings.Split(v, ".")
	if v == "" || len(parts) > 3 {
		return "", false
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return "", false
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(parts, "."), true
}

func str(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &v} }

func count(v uint32) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(v), resource.BinarySI)}
}

func ptr[T any](v T) *T { return &v }

// CapturedEnv names a directory of ResourceSlices captured from NVIDIA's
// real driver (`kubectl get resourceslices -o json` on a node it serves):
// gpu.json (whole GPUs), shares.json (--consumable-shares=memory) and
// mig.json (static MIG), each a ResourceSliceList or one ResourceSlice.
// The devices of the slices whose driver is gpu.nvidia.com replace that
// variant's devices in NVIDIA's shape, for every node; a missing file
// leaves the variant as NVIDIA's source publishes it.
const CapturedEnv = "NRI_GPU_SCALE_NVIDIA_SLICES"

// Captured replaces the variants of s that dir holds slices of (see
// CapturedEnv) with their devices, and says which in s.Source.
func Captured(s *Shape, dir string) error {
	got := map[Variant][]resourceapi.Device{}
	for _, v := range Variants {
		p := filepath.Join(dir, string(v)+".json")
		data, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		devs, err := capturedDevices(data, s.Driver)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if len(devs) == 0 {
			return fmt.Errorf("%s: no device of driver %s", p, s.Driver)
		}
		got[v] = devs
	}
	UseCaptured(s, got, "captured in "+dir)
	return nil
}

// UseCaptured replaces the variants of s that got holds with got's
// devices (NVIDIA's real driver's, captured as how says) and says in
// s.Source which variants are real captures and which remain as
// NVIDIA's source publishes them.
func UseCaptured(s *Shape, got map[Variant][]resourceapi.Device, how string) {
	var used, rest []string
	for _, v := range Variants {
		devs, ok := got[v]
		if !ok {
			rest = append(rest, string(v))
			continue
		}
		s.devices[v] = devs
		used = append(used, fmt.Sprintf("%s (%d devices)", v, len(devs)))
	}
	if len(used) == 0 {
		return
	}
	s.Source = fmt.Sprintf("NVIDIA's real driver's slices (%s) for %s", how, strings.Join(used, ", "))
	if len(rest) > 0 {
		s.Source += fmt.Sprintf("; %s as its source publishes it (test/e2e/scale/nvidia.go)", strings.Join(rest, ", "))
	}
}

// capturedDevices are the devices of driver in data: a ResourceSliceList
// or one ResourceSlice, as kubectl writes them in JSON; the slices of the
// first node's pool only.
func capturedDevices(data []byte, driver string) ([]resourceapi.Device, error) {
	var list resourceapi.ResourceSliceList
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, err
	}
	if len(list.Items) == 0 {
		var one resourceapi.ResourceSlice
		if err := json.Unmarshal(data, &one); err != nil {
			return nil, err
		}
		list.Items = []resourceapi.ResourceSlice{one}
	}
	var out []resourceapi.Device
	pool := ""
	for _, sl := range list.Items {
		if sl.Spec.Driver != driver {
			continue
		}
		if pool == "" {
			pool = sl.Spec.Pool.Name
		}
		if sl.Spec.Pool.Name == pool {
			out = append(out, sl.Spec.Devices...)
		}
	}
	return out, nil
}
