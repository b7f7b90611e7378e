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
}

// h100Profiles are an H100 80GB HBM3's GPU instance profiles, as
// nvidia-smi mig -lgip lists them on one (driver 570; memory 9.75, 19.62,
// 39.50 and 79.25 GiB, which NVML reports in MiB); the placement sizes
// are nvidia-smi mig -lgipp's.
var h100Profiles = []GIProfile{
	{Index: 0, ID: 19, Name: "1g.10gb", Slices: 1, Instances: 7, SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, MemoryMiB: 9984, MemorySlices: 1},
	{Index: 1, ID: 14, Name: "2g.20gb", Slices: 2, Instances: 3, SMs: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2, MemoryMiB: 20096, MemorySlices: 2},
	{Index: 2, ID: 9, Name: "3g.40gb", Slices: 3, Instances: 2, SMs: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, MemoryMiB: 40448, MemorySlices: 4},
	{Index: 3, ID: 5, Name: "4g.40gb", Slices: 4, Instances: 1, SMs: 64, CopyEngines: 4, Decoders: 4, JPEGs: 4, MemoryMiB: 40448, MemorySlices: 4},
	{Index: 4, ID: 0, Name: "7g.80gb", Slices: 7, Instances: 1, SMs: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, MemoryMiB: 81152, MemorySlices: 8},
	{Index: 7, ID: 20, Name: "1g.10gb+me", Slices: 1, Instances: 1, SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, MemoryMiB: 9984, MemorySlices: 1},
	{Index: 9, ID: 15, Name: "1g.20gb", Slices: 1, Instances: 4, SMs: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, MemoryMiB: 20096, MemorySlices: 2},
}

// MIGProfiles returns the GPU instance profiles of model; none for a
// model the simulated NVML has no MIG profiles of (only the H100 80GB
// HBM3, simnode's default GPU, has).
func MIGProfiles(model string) []GIProfile {
	if model == DefaultModel {
		return h100Profiles
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
	for _, gp := range MIGProfiles(g.Model) {
		fmt.Fprintf(&b, "gip %d %d %d %d %d %d %d %d %d %d %d %d\n", g.Index, gp.Index, gp.ID, gp.Slices, gp.Instances,
			gp.SMs, gp.CopyEngines, gp.Decoders, gp.Encoders, gp.JPEGs, gp.OFAs, gp.MemoryMiB)
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
	return fmt.Sprintf("migp %d %d %d %d %d %d\n", g.Index, k, p.Index, MIGPlacementStart(m.GI), p.MemorySlices, sm)
}
