package simnode

import (
	"fmt"
	"strings"
)

// What the simulated NVML says of a GPU beyond the kernel module: brand,
// architecture, CUDA compute capability (by model, the values NVIDIA's
// go-nvml mocks give its GPUs), the GPU instance profiles of MIG (an H100
// 80GB's, as nvidia-smi mig -lgip lists them on one), and where each GPU
// instance lies.

// ModelProps are the NVML properties of a GPU model.
type ModelProps struct {
	// Brand is the nvmlBrandType_t (14: NVML_BRAND_NVIDIA, which go-nvlib
	// names "Nvidia").
	Brand int
	// Architecture is the nvmlDeviceArchitecture_t (9: Hopper).
	Architecture int
	// ComputeMajor and ComputeMinor are the CUDA compute capability.
	ComputeMajor, ComputeMinor int
}

// modelProps are the models the simulated NVML knows, by name prefix;
// another model's brand, architecture and compute capability are
// NOT_SUPPORTED.
var modelProps = []struct {
	prefix string
	props  ModelProps
}{
	{"NVIDIA H100", ModelProps{14, 9, 9, 0}},
	{"NVIDIA H200", ModelProps{14, 9, 9, 0}},
	{"NVIDIA A100", ModelProps{14, 7, 8, 0}},
	{"NVIDIA A30", ModelProps{14, 7, 8, 0}},
	{"NVIDIA B200", ModelProps{14, 10, 10, 0}},
}

// PropsOf returns the NVML properties of model; ok is false for a model
// the simulated NVML does not know.
func PropsOf(model string) (p ModelProps, ok bool) {
	for _, m := range modelProps {
		if strings.HasPrefix(model, m.prefix) {
			return m.props, true
		}
	}
	return ModelProps{}, false
}

// GIProfile is a GPU instance profile (nvmlGpuInstanceProfileInfo_t).
type GIProfile struct {
	// Index is the NVML_GPU_INSTANCE_PROFILE_* that
	// nvmlDeviceGetGpuInstanceProfileInfo takes; ID the profile's id,
	// which nvidia-smi shows and a GPU instance reports.
	Index, ID int
	// Name is nvidia-smi's.
	Name              string
	Slices, Instances int
	// SMs, CopyEngines, Decoders, Encoders, JPEGs, OFAs are the profile's
	// multiprocessors and engines.
	SMs, CopyEngines, Decoders, Encoders, JPEGs, OFAs int
	// MemoryMiB is the profile's memory.
	MemoryMiB uint64
	// MemorySlices is the size of its placements, in memory slices of
	// the eight.
	MemorySlices int
	// Placements are the first memory slice of each place an instance of
	// the profile can lie (nvidia-smi mig -lgipp), taken or not.
	Placements []int
}

// CIProfile is a compute instance profile of a GPU instance profile
// (nvmlComputeInstanceProfileInfo_t; its engines are the GPU instance's,
// shared).
type CIProfile struct {
	// Index is the NVML_COMPUTE_INSTANCE_PROFILE_* that
	// nvmlGpuInstanceGetComputeInstanceProfileInfo takes; ID the profile's
	// id, which a compute instance reports.
	Index, ID int
	// Slices are its compute slices, Instances how many fit in the GPU
	// instance, SMs its multiprocessors.
	Slices, Instances, SMs int
}

// ciProfileIndex is the NVML_COMPUTE_INSTANCE_PROFILE_* of a compute
// instance of that many slices; the real library gives the profile the
// same id.
var ciProfileIndex = map[int]int{1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}

// ciSlices are the compute instance sizes a GPU instance of that many
// slices offers (nvidia-smi mig -lcip): a 4-slice instance has no
// 3-slice compute instance.
var ciSlices = map[int][]int{1: {1}, 2: {1, 2}, 3: {1, 2, 3}, 4: {1, 2, 4}, 7: {1, 2, 3, 4, 7}, 8: {1, 2, 4, 8}}

// CIProfiles returns the compute instance profiles of GPU instance
// profile p among profiles (the GPU's). A compute instance of all the
// instance's slices has its multiprocessors; a smaller one those of the
// GPU instance profile of as many slices, as nvidia-smi mig -lcip lists
// them.
func CIProfiles(profiles []GIProfile, p GIProfile) []CIProfile {
	var out []CIProfile
	for _, c := range ciSlices[p.Slices] {
		sm := p.SMs
		if c < p.Slices {
			q, ok := ProfileOf(profiles, MIG{GISlices: c})
			if !ok {
				continue
			}
			sm = q.SMs
		}
		idx := ciProfileIndex[c]
		out = append(out, CIProfile{Index: idx, ID: idx, Slices: c, Instances: p.Slices / c, SMs: sm})
	}
	return out
}

// h100Profiles are an H100 80GB HBM3's GPU instance profiles, as
// nvidia-smi mig -lgip lists them on one (driver 570; memory 9.75, 19.62,
// 39.50 and 79.25 GiB, which NVML reports in MiB); the placements are
// nvidia-smi mig -lgipp's.
var h100Profiles = []GIProfile{
	{Index: 0, ID: 19, Name: "1g.10gb", Slices: 1, Instances: 7, SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, MemoryMiB: 9984, MemorySlices: 1, Placements: []int{0, 1, 2, 3, 4, 5, 6}},
	{Index: 1, ID: 14, Name: "2g.20gb", Slices: 2, Instances: 3, SMs: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2, MemoryMiB: 20096, MemorySlices: 2, Placements: []int{0, 2, 4}},
	{Index: 2, ID: 9, Name: "3g.40gb", Slices: 3, Instances: 2, SMs: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, MemoryMiB: 40448, MemorySlices: 4, Placements: []int{0, 4}},
	{Index: 3, ID: 5, Name: "4g.40gb", Slices: 4, Instances: 1, SMs: 64, CopyEngines: 4, Decoders: 4, JPEGs: 4, MemoryMiB: 40448, MemorySlices: 4, Placements: []int{0}},
	{Index: 4, ID: 0, Name: "7g.80gb", Slices: 7, Instances: 1, SMs: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, MemoryMiB: 81152, MemorySlices: 8, Placements: []int{0}},
	{Index: 7, ID: 20, Name: "1g.10gb+me", Slices: 1, Instances: 1, SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, MemoryMiB: 9984, MemorySlices: 1, Placements: []int{0, 1, 2, 3, 4, 5, 6}},
	{Index: 9, ID: 15, Name: "1g.20gb", Slices: 1, Instances: 4, SMs: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, MemoryMiB: 20096, MemorySlices: 2, Placements: []int{0, 2, 4, 6}},
}

// A100Model is the A100 40GB's model name, a GPU simnode has MIG
// profiles of beside the H100 (GPU.Model).
const A100Model = "NVIDIA A100-SXM4-40GB"

// a100Profiles are an A100 40GB's GPU instance profiles, as nvidia-smi mig
// -lgip and -lgipp list them on one (memory 4.75, 9.62, 19.50 and 39.25
// GiB).
var a100Profiles = []GIProfile{
	{Index: 0, ID: 19, Name: "1g.5gb", Slices: 1, Instances: 7, SMs: 14, CopyEngines: 1, MemoryMiB: 4864, MemorySlices: 1, Placements: []int{0, 1, 2, 3, 4, 5, 6}},
	{Index: 1, ID: 14, Name: "2g.10gb", Slices: 2, Instances: 3, SMs: 28, CopyEngines: 2, Decoders: 1, MemoryMiB: 9856, MemorySlices: 2, Placements: []int{0, 2, 4}},
	{Index: 2, ID: 9, Name: "3g.20gb", Slices: 3, Instances: 2, SMs: 42, CopyEngines: 3, Decoders: 2, MemoryMiB: 19968, MemorySlices: 4, Placements: []int{0, 4}},
	{Index: 3, ID: 5, Name: "4g.20gb", Slices: 4, Instances: 1, SMs: 56, CopyEngines: 4, Decoders: 2, MemoryMiB: 19968, MemorySlices: 4, Placements: []int{0}},
	{Index: 4, ID: 0, Name: "7g.40gb", Slices: 7, Instances: 1, SMs: 98, CopyEngines: 7, Decoders: 5, JPEGs: 1, OFAs: 1, MemoryMiB: 40192, MemorySlices: 8, Placements: []int{0}},
	{Index: 7, ID: 20, Name: "1g.5gb+me", Slices: 1, Instances: 1, SMs: 14, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, MemoryMiB: 4864, MemorySlices: 1, Placements: []int{0, 1, 2, 3, 4, 5, 6}},
	{Index: 9, ID: 15, Name: "1g.10gb", Slices: 1, Instances: 4, SMs: 14, CopyEngines: 1, Decoders: 1, MemoryMiB: 9856, MemorySlices: 2, Placements: []int{0, 2, 4, 6}},
}

// MIGProfiles returns the GPU instance profiles of model; none for a
// model the simulated NVML has no MIG profiles of (the H100 80GB HBM3,
// simnode's default GPU, and the A100 40GB have).
func MIGProfiles(model string) []GIProfile {
	switch model {
	case DefaultModel:
		return h100Profiles
	case A100Model:
		return a100Profiles
	}
	return nil
}

// ProfileOf returns the GPU instance profile of m among profiles: the one
// named m.Profile, or without a name the first of m.GISlices slices.
func ProfileOf(profiles []GIProfile, m MIG) (GIProfile, bool) {
	for _, p := range profiles {
		if m.Profile == p.Name || m.Profile == "" && p.Slices == m.GISlices {
			return p, true
		}
	}
	return GIProfile{}, false
}

// MIGPlacementStart is the first memory slice of GPU instance gi. The
// simulated NVML places an instance by its id, a rule of its own (the
// driver gives ids as it creates instances, with no documented relation
// to placements): 0 the whole GPU, 1 and 2 the halves (slices 0 and 4),
// 3 to 6 the quarters (0, 2, 4, 6), 7 to 14 the eighths (0 to 7).
func MIGPlacementStart(gi int) int {
	switch {
	case gi == 0 || gi == 1:
		return 0
	case gi == 2:
		return 4
	case gi <= 6:
		return (gi - 3) * 2
	}
	return gi - 7
}

// propsLines renders the props and gip lines of GPU g (nvml.c).
func propsLines(g GPU, ng NVMLGPU) string {
	p, ok := PropsOf(g.Model)
	if !ok {
		p = ModelProps{-1, -1, -1, -1}
	}
	mode := map[string]int{"None": 0, "HMM": 1, "ATS": 2}[ng.AddressingMode]
	if ng.AddressingMode == "" {
		mode = -1
	}
	var b strings.Builder
	fmt.Fprintf(&b, "props %d %d %d %d %d %d %d\n", g.Index, p.Brand, p.Architecture, p.ComputeMajor, p.ComputeMinor, mode, ng.GIError)
	if ng.MIGMode < 0 {
		return b.String()
	}
	profiles := MIGProfiles(g.Model)
	for _, gp := range profiles {
		fmt.Fprintf(&b, "gip %d %d %d %d %d %d %d %d %d %d %d %d\n", g.Index, gp.Index, gp.ID, gp.Slices, gp.Instances,
			gp.SMs, gp.CopyEngines, gp.Decoders, gp.Encoders, gp.JPEGs, gp.OFAs, gp.MemoryMiB)
		for _, start := range gp.Placements {
			fmt.Fprintf(&b, "gipp %d %d %d %d\n", g.Index, gp.Index, start, gp.MemorySlices)
		}
		for _, c := range CIProfiles(profiles, gp) {
			fmt.Fprintf(&b, "cip %d %d %d %d %d %d %d\n", g.Index, gp.Index, c.Index, c.ID, c.Slices, c.Instances, c.SMs)
		}
	}
	return b.String()
}

// migPlacementLine renders the migp line of the k-th MIG device m of GPU
// g: its GPU instance's profile and placement, and its compute instance's
// multiprocessors (those of the profile of its slices). None when the
// GPU has no profile of it.
func migPlacementLine(g GPU, k int, m MIG) string {
	profiles := MIGProfiles(g.Model)
	p, ok := ProfileOf(profiles, m)
	if !ok {
		return ""
	}
	sm := p.SMs
	if m.CISlices > 0 && m.CISlices < p.Slices {
		if c, ok := ProfileOf(profiles, MIG{GISlices: m.CISlices}); ok {
			sm = c.SMs
		}
	}
	line := fmt.Sprintf("migp %d %d %d %d %d %d\n", g.Index, k, p.Index, MIGPlacementStart(m.GI), p.MemorySlices, sm)
	cs := m.CISlices
	if cs <= 0 || cs > p.Slices {
		cs = p.Slices
	}
	if idx, ok := ciProfileIndex[cs]; ok {
		line += fmt.Sprintf("migc %d %d %d %d %d\n", g.Index, k, idx, MIGCIPlacementStart(m), cs)
	}
	return line
}

// MIGCIPlacementStart is where, in its GPU instance's compute slices, the
// compute instance of m lies: by its id, compute instances of one size
// side by side (a rule of the simulated NVML's own, like
// MIGPlacementStart's).
func MIGCIPlacementStart(m MIG) int {
	if m.CISlices <= 0 || m.CISlices >= m.GISlices {
		return 0
	}
	return m.CI * m.CISlices
}
