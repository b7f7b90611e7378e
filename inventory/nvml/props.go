package nvml

import "fmt"

// The properties NVIDIA's DRA driver publishes of a GPU and a MIG device
// beyond what the kernel module says: brand, architecture, CUDA compute
// capability, the CUDA version the driver supports, the addressing mode,
// and a MIG device's GPU instance profile, placement and engines. Each
// comes from a function an older library may lack or a GPU may not
// support: then it is left unknown, and nothing else fails.

// Struct layouts of nvml.h (sizes asserted in layout_test.go and by the
// simulated library's C source).

// gpuInstanceProfileInfo is nvmlGpuInstanceProfileInfo_t (the
// unversioned layout nvmlDeviceGetGpuInstanceProfileInfo fills, as
// NVIDIA's DRA driver reads it): 48 bytes.
type gpuInstanceProfileInfo struct {
	ID                  uint32
	IsP2PSupported      uint32
	SliceCount          uint32
	InstanceCount       uint32
	MultiprocessorCount uint32
	CopyEngineCount     uint32
	DecoderCount        uint32
	EncoderCount        uint32
	JpegCount           uint32
	OfaCount            uint32
	MemorySizeMB        uint64
}

// gpuInstanceInfo is nvmlGpuInstanceInfo_t: 24 bytes.
type gpuInstanceInfo struct {
	Device    uintptr
	ID        uint32
	ProfileID uint32
	Start     uint32 // nvmlGpuInstancePlacement_t
	Size      uint32
}

// addressingMode is nvmlDeviceAddressingMode_v1_t: 8 bytes.
type addressingMode struct {
	Version uint32
	Value   uint32
}

// addressingModeV1 is nvmlDeviceAddressingMode_v1: NVML_STRUCT_VERSION,
// the struct's size with the version in the top byte.
const addressingModeV1 = 8 | 1<<24

// GPU instance profiles (NVML_GPU_INSTANCE_PROFILE_*): the index that
// nvmlDeviceGetGpuInstanceProfileInfo takes; the profile's id, which a
// GPU instance reports, is another number (19 for an H100's 1g.10gb).
const (
	giProfile1SliceRev1  = 0x7 // 1 slice with media extensions: "+me"
	giProfile2SliceRev1  = 0x8
	giProfile1SliceGfx   = 0x0A // graphics: "+gfx"
	giProfile2SliceGfx   = 0x0B
	giProfile4SliceGfx   = 0x0C
	giProfile1SliceNoME  = 0x0D // without decoders, encoders, JPEG, OFA: "-me"
	giProfile2SliceNoME  = 0x0E
	giProfile1SliceAllME = 0x0F // with all of them: "+me.all"
	giProfile2SliceAllME = 0x10
	// giProfileCount is NVML_GPU_INSTANCE_PROFILE_COUNT of nvml.h.
	giProfileCount = 0x12
)

// propFuncs are the functions of the properties, each optional.
type propFuncs struct {
	getBrand             func(uintptr, *uint32) Return
	getArchitecture      func(uintptr, *uint32) Return
	getComputeCapability func(uintptr, *int32, *int32) Return
	getAddressingMode    func(uintptr, *addressingMode) Return
	getCudaDriverVersion func(*int32) Return
	getGIProfileInfo     func(uintptr, uint32, *gpuInstanceProfileInfo) Return
	getGIByID            func(uintptr, uint32, *uintptr) Return
	getGIInfo            func(uintptr, *gpuInstanceInfo) Return
}

// bindProps binds the property functions the library has.
func (l *dl) bindProps() {
	p := &l.props
	for _, f := range []struct {
		ptr  any
		name string
	}{
		{&p.getBrand, "nvmlDeviceGetBrand"},
		{&p.getArchitecture, "nvmlDeviceGetArchitecture"},
		{&p.getComputeCapability, "nvmlDeviceGetCudaComputeCapability"},
		{&p.getAddressingMode, "nvmlDeviceGetAddressingMode"},
		// NVIDIA's DRA driver reads the unversioned function (go-nvml's
		// SystemGetCudaDriverVersion): the CUDA version of the installed
		// libcuda, or the one the driver supports when this process
		// cannot load libcuda (as nri-gpu's container cannot). _v2
		// fails instead.
		{&p.getCudaDriverVersion, "nvmlSystemGetCudaDriverVersion"},
		{&p.getGIProfileInfo, "nvmlDeviceGetGpuInstanceProfileInfo"},
		{&p.getGIByID, "nvmlDeviceGetGpuInstanceById"},
		{&p.getGIInfo, "nvmlGpuInstanceGetInfo"},
	} {
		_ = l.sym(f.ptr, f.name, false)
	}
}

// brandNames are nvmlBrandType_t's values as NVIDIA's go-nvlib names
// them (device.GetBrandAsString), which its DRA driver publishes.
var brandNames = map[uint32]string{
	0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
	7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming",
	12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX",
}

// architectureNames are nvmlDeviceArchitecture_t's values as go-nvlib
// names them (device.GetArchitectureAsString).
var architectureNames = map[uint32]string{
	2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
	8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin", 0xffffffff: "Unknown",
}

// addressingModeNames are nvmlDeviceAddressingModeType_t's values as
// go-nvlib names them (device.GetAddressingModeAsString).
var addressingModeNames = map[uint32]string{0: "None", 1: "HMM", 2: "ATS"}

// cudaVersion is NVIDIA's form of an nvmlSystemGetCudaDriverVersion
// answer, major.minor: 12080 is "12.8", 13000 "13.0".
func cudaVersion(v int32) string {
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// cudaDriverVersion asks NVML for the CUDA version; "" when it cannot
// tell.
func (l *dl) cudaDriverVersion() string {
	var v int32
	if f := l.props.getCudaDriverVersion; f == nil || f(&v) != Success {
		return ""
	}
	return cudaVersion(v)
}

// addProps fills g's properties from GPU handle h; each one NVML does not
// answer stays unknown.
func (l *dl) addProps(h uintptr, g *GPU) {
	p := &l.props
	var v uint32
	if p.getBrand != nil && p.getBrand(h, &v) == Success {
		g.Brand = brandNames[v]
	}
	if p.getArchitecture != nil && p.getArchitecture(h, &v) == Success {
		g.Architecture = architectureNames[v]
	}
	var major, minor int32
	if p.getComputeCapability != nil && p.getComputeCapability(h, &major, &minor) == Success && major > 0 && minor >= 0 {
		g.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}
	// NOT_SUPPORTED on a platform without coherent memory (an x86 PCIe
	// node): no addressing mode, as NVIDIA's driver publishes none.
	m := addressingMode{Version: addressingModeV1}
	if p.getAddressingMode != nil && p.getAddressingMode(h, &m) == Success {
		g.AddressingMode = addressingModeNames[m.Value]
	}
}

// giProfile is one GPU instance profile a GPU supports.
type giProfile struct {
	index int // NVML_GPU_INSTANCE_PROFILE_*
	info  gpuInstanceProfileInfo
}

// giProfiles returns the GPU instance profiles GPU h supports, as NVIDIA's
// driver walks them (every profile index, skipping those NVML refuses);
// nil when the library cannot tell.
func (l *dl) giProfiles(h uintptr) []giProfile {
	f := l.props.getGIProfileInfo
	if f == nil || l.props.getGIByID == nil || l.props.getGIInfo == nil {
		return nil
	}
	var out []giProfile
	for i := 0; i < giProfileCount; i++ {
		var info gpuInstanceProfileInfo
		if f(h, uint32(i), &info) == Success {
			out = append(out, giProfile{index: i, info: info})
		}
	}
	return out
}

// addPlacement fills m's GPU instance profile, placement and engines from
// its GPU instance (m.GI of GPU parent, whose total memory is parentMiB),
// when NVML tells them: nvmlDeviceGetGpuInstanceById (which NVML may
// refuse to an unprivileged process without the MIG monitor capability),
// nvmlGpuInstanceGetInfo, and the profile of profiles with the instance's
// profile id. Where it cannot, m keeps what its device attributes said.
func (l *dl) addPlacement(parent uintptr, parentMiB uint64, profiles []giProfile, a attributes, m *MIG) {
	if len(profiles) == 0 {
		return
	}
	var gi uintptr
	if l.props.getGIByID(parent, uint32(m.GI), &gi) != Success {
		return
	}
	var info gpuInstanceInfo
	if l.props.getGIInfo(gi, &info) != Success {
		return
	}
	m.Placement = &Placement{ProfileID: int(info.ProfileID), Start: int(info.Start), Size: int(info.Size)}
	for _, p := range profiles {
		if p.info.ID != info.ProfileID {
			continue
		}
		// NVIDIA's driver publishes the GPU instance profile's engines
		// and memory. A compute instance of part of its GPU instance
		// (which NVIDIA's driver does not publish) has the
		// multiprocessors of its own slices, its attributes'.
		pi := p.info
		sm := pi.MultiprocessorCount
		if m.CISlices > 0 && m.CISlices < int(pi.SliceCount) {
			sm = a.MultiprocessorCount
		}
		m.Engines = Engines{Multiprocessors: sm, CopyEngines: pi.CopyEngineCount, Decoders: pi.DecoderCount,
			Encoders: pi.EncoderCount, JPEGs: pi.JpegCount, OFAs: pi.OfaCount}
		m.MemoryMiB = pi.MemorySizeMB
		m.GISlices = int(pi.SliceCount)
		m.Profile = profileName(p.index, m.GISlices, m.CISlices, pi.MemorySizeMB, parentMiB)
		return
	}
}

// profileName is go-nvlib's name of a MIG profile (MigProfileInfo.String,
// which NVIDIA's DRA driver publishes): ProfileName, with the suffix of
// the GPU instance profile index ("+me", "-me", "+gfx", "+me.all").
func profileName(index, giSlices, ciSlices int, memMiB, parentMiB uint64) string {
	name := ProfileName(giSlices, ciSlices, memMiB, parentMiB)
	switch index {
	case giProfile1SliceRev1, giProfile2SliceRev1:
		name += "+me"
	case giProfile1SliceAllME, giProfile2SliceAllME:
		name += "+me.all"
	case giProfile1SliceGfx, giProfile2SliceGfx, giProfile4SliceGfx:
		name += "+gfx"
	case giProfile1SliceNoME, giProfile2SliceNoME:
		name += "-me"
	}
	return name
}

// enginesOf are a MIG device's engines as its device attributes give
// them: what is known without its GPU instance profile.
func enginesOf(a attributes) Engines {
	return Engines{Multiprocessors: a.MultiprocessorCount, CopyEngines: a.SharedCopyEngineCount, Decoders: a.SharedDecoderCount,
		Encoders: a.SharedEncoderCount, JPEGs: a.SharedJpegCount, OFAs: a.SharedOfaCount}
}
