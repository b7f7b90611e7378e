package dra

import (
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// NVIDIADomain is the domain of the attributes and capacities that
// NVIDIA's DRA driver publishes unqualified under its driver name
// gpu.nvidia.com. nri-gpu publishes them fully qualified in that domain,
// so that a selector reading device.attributes['gpu.nvidia.com'] selects
// the same devices whatever nri-gpu's driver name (CEL qualifies an
// unqualified name with device.driver, and leaves a qualified one in its
// own domain).
const NVIDIADomain = "gpu.nvidia.com"

// Device types, NVIDIA's values of the type attribute.
const (
	TypeGPU = "gpu"
	TypeMIG = "mig"
)

// Taint keys, NVIDIA's: a critical XID (value: its number) and a GPU
// NVML lost or that needs a reset.
const (
	TaintXID     = NVIDIADomain + "/xid"
	TaintGPULost = NVIDIADomain + "/gpu-lost"
)

// unit is one device DRA publishes: a GPU without MIG, or a MIG device
// (a unit of the snapshot, inventory.Snapshot.Units) with its GPU.
type unit struct {
	name   string
	gpu    inventory.GPU
	parent inventory.GPU
}

// units returns the devices of st that DRA publishes, by name: every
// usable GPU without MIG and every MIG device, of the GPUs dra.devices
// lists (all without it) and, with the device plugin on, not listed in
// devicePlugin.devices: a GPU is offered by one allocator only. A node
// whose driver cannot serve requests (Source.Problem) publishes none.
func units(st *node.State) []unit {
	if st == nil || st.Source.Problem() != "" {
		return nil
	}
	snap := st.Snapshot()
	cfg := st.Config
	dra := config.DeviceList(cfg.DRA.Devices)
	var dp config.DeviceList
	if cfg.DevicePlugin.Enabled {
		dp = config.DeviceList(cfg.DevicePlugin.Devices)
	}
	parents := make(map[int]inventory.GPU, len(snap.GPUs))
	for _, g := range snap.GPUs {
		parents[g.Index] = g
	}
	var out []unit
	for _, g := range st.Source.Devices() {
		parent := g
		if g.MIG != nil {
			parent = parents[g.MIG.Parent]
		}
		if !dra.Matches(g, parent) || dp != nil && dp.Matches(g, parent) || g.UUID == "" {
			continue
		}
		out = append(out, unit{name: deviceName(g, parent), gpu: g, parent: parent})
	}
	return out
}

// Offered returns the UUIDs of the GPUs and MIG devices the driver
// publishes in st: those a prepared claim may hold. While the checkpoint
// cannot be read, the NRI side holds them all (plugin.Plugin.ClaimsUnknown).
func Offered(st *node.State) []string {
	us := units(st)
	out := make([]string, 0, len(us))
	for _, u := range us {
		out = append(out, u.gpu.UUID)
	}
	return out
}

// deviceName is NVIDIA's name of a device in the pool: gpu-<minor> for a
// GPU, gpu-<minor>-mig-<profile without dots>-<profile id>-<placement
// start> for a MIG device. Without NVML's placement, a MIG device is
// named gpu-<minor>-mig-<profile>-gi<gi>-ci<ci>, which NVIDIA's names
// never are.
func deviceName(g, parent inventory.GPU) string {
	if g.MIG == nil {
		return fmt.Sprintf("gpu-%d", g.Minor)
	}
	prof := migNamePart(g.MIG.Profile)
	if p := g.MIG.Placement; p != nil {
		return fmt.Sprintf("gpu-%d-mig-%s-%d-%d", parent.Minor, prof, p.ProfileID, p.Start)
	}
	return fmt.Sprintf("gpu-%d-mig-%s-gi%d-ci%d", parent.Minor, prof, g.MIG.GI, g.MIG.CI)
}

// migNamePart is NVIDIA's form of a profile in a device name: dots
// dropped, lower case, any other character but letters, digits and '-'
// as '-', trimmed of '-' ("1g.10gb+me" -> "1g10gb-me").
func migNamePart(profile string) string {
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

// attrs are the attributes and capacities of a device, by qualified name.
type attrs struct {
	a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	c map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
}

func (x attrs) str(name, v string) {
	if v != "" {
		x.a[resourceapi.QualifiedName(NVIDIADomain+"/"+name)] = resourceapi.DeviceAttribute{StringValue: &v}
	}
}

func (x attrs) version(name, v string) {
	if s, ok := semver(v); ok {
		x.a[resourceapi.QualifiedName(NVIDIADomain+"/"+name)] = resourceapi.DeviceAttribute{VersionValue: &s}
	}
}

func (x attrs) capacity(name string, v int64) {
	if v > 0 {
		x.c[resourceapi.QualifiedName(NVIDIADomain+"/"+name)] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(v, resource.BinarySI)}
	}
}

// topology is what sysfs tells of a GPU's place on the node: the PCIe
// root complex ("pci0000:00"), "" when unknown. It is read once per bus
// id (runner.pcieRoot).
type topology func(busID string) string

// sliceDevice returns u as a ResourceSlice device: NVIDIA's name,
// attributes and capacities, and taints.
func sliceDevice(u unit, snap *inventory.Snapshot, root topology, taints []resourceapi.DeviceTaint) resourceapi.Device {
	x := attrs{a: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}, c: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}}
	p := u.parent
	x.str("uuid", u.gpu.UUID)
	x.str("productName", productName(p))
	if pr := p.Props; pr != nil {
		x.str("brand", pr.Brand)
		x.str("architecture", pr.Architecture)
		x.version("cudaComputeCapability", pr.ComputeCapability)
		x.str("addressingMode", pr.AddressingMode)
	}
	x.version("driverVersion", snap.DriverVersion)
	x.version("cudaDriverVersion", cudaDriverVersion(p, snap))
	if p.BusID != "" {
		bus := p.BusID
		x.a["resource.kubernetes.io/pciBusID"] = resourceapi.DeviceAttribute{StringValue: &bus}
		if r := root(bus); r != "" {
			x.a["resource.kubernetes.io/pcieRoot"] = resourceapi.DeviceAttribute{StringValue: &r}
		}
	}
	if p.NUMANode >= 0 {
		n := int64(p.NUMANode)
		x.a["resource.kubernetes.io/numaNode"] = resourceapi.DeviceAttribute{IntValue: &n}
	}
	if m := u.gpu.MIG; m != nil {
		x.str("type", TypeMIG)
		x.str("parentUUID", m.ParentUUID)
		x.str("profile", m.Profile)
		x.capacity("memory", int64(m.MemoryMiB)<<20)
		if e := m.Engines; e != (inventory.MIGEngines{}) {
			for _, c := range []struct {
				name string
				v    uint32
			}{{"multiprocessors", e.Multiprocessors}, {"copyEngines", e.CopyEngines}, {"decoders", e.Decoders}, {"encoders", e.Encoders}, {"jpegEngines", e.JPEGs}, {"ofaEngines", e.OFAs}} {
				// NVIDIA publishes every engine count, zero ones too.
				x.c[resourceapi.QualifiedName(NVIDIADomain+"/"+c.name)] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(c.v), resource.BinarySI)}
			}
		}
		if pl := m.Placement; pl != nil {
			for i := pl.Start; i < pl.Start+pl.Size; i++ {
				x.capacity("memorySlice"+strconv.Itoa(i), 1)
			}
		}
	} else {
		x.str("type", TypeGPU)
		if p.Props != nil {
			x.capacity("memory", int64(p.Props.MemoryBytes))
		}
	}
	d := resourceapi.Device{Name: u.name, Attributes: x.a, Taints: taints}
	if len(x.c) > 0 {
		d.Capacity = x.c
	}
	return d
}

// productName is the GPU's product name: NVML's, as NVIDIA's driver
// publishes it, or without NVML /proc's Model, the same string ("NVIDIA
// H100 80GB HBM3").
func productName(g inventory.GPU) string {
	if g.Props != nil && g.Props.ProductName != "" {
		return g.Props.ProductName
	}
	return g.Model
}

// cudaDriverVersion is the CUDA version the driver supports: NVML's
// (nvmlSystemGetCudaDriverVersion, as NVIDIA's driver reads it), or
// without NVML the CUDA version of the driver's branch.
func cudaDriverVersion(g inventory.GPU, snap *inventory.Snapshot) string {
	if g.Props != nil && g.Props.CUDADriverVersion != "" {
		return g.Props.CUDADriverVersion
	}
	v, _ := inventory.CUDAVersion(snap.DriverVersion)
	return v
}

// semver returns v ("580.126.09", "13.0", "9.0") as the semantic version
// NVIDIA's driver publishes: three numbers without leading zeros
// ("580.126.9", "13.0.0", "9.0.0"), as Masterminds' semver, which it
// parses them with, prints them. ok is false for anything else.
func semver(v string) (string, bool) {
	parts := strings.Split(v, ".")
	if v == "" || len(parts) > 3 {
		return "", false
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil || p == "" {
			return "", false
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(parts, "."), true
}

// taintsFor returns the taints of an unhealthy device (why is the node
// state's reason: "XID <n>..." or "NVML: ..."), NVIDIA's keys, with
// effect NoSchedule as NVIDIA's driver sets them: no new claim gets the
// device; pods that hold it keep running.
func taintsFor(why string) []resourceapi.DeviceTaint {
	if why == "" {
		return nil
	}
	t := resourceapi.DeviceTaint{Key: TaintGPULost, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	if rest, ok := strings.CutPrefix(why, "XID "); ok {
		num, _, _ := strings.Cut(rest, " ")
		t.Key, t.Value = TaintXID, num
	}
	return []resourceapi.DeviceTaint{t}
}
