package nvml

import "testing"

// TestStructLayouts checks the Go structs against the sizes of nvml.h's
// (NVIDIA's header, gen/nvml/nvml.h of github.com/NVIDIA/go-nvml; the
// simulated library asserts the same numbers with _Static_assert).
func TestStructLayouts(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"nvmlPciInfo_t", sizePciInfo, 68},
		{"nvmlDeviceAttributes_t", sizeAttributes, 40},
		{"nvmlMemory_t", sizeMemory, 24},
		{"nvmlEventData_t", sizeEventData, 32},
		{"nvmlGpuInstanceProfileInfo_t", sizeGIProfileInfo, 48},
		{"nvmlGpuInstanceInfo_t", sizeGIInfo, 24},
		{"nvmlDeviceAddressingMode_v1_t", sizeAddressingMode, 8},
		{"nvmlComputeInstanceProfileInfo_t", sizeCIProfileInfo, 36},
		{"nvmlComputeInstanceInfo_t", sizeCIInfo, 32},
		{"nvmlGpuInstancePlacement_t", sizePlacement, 8},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, nvml.h has %d", c.name, c.got, c.want)
		}
	}
}

func TestProfileName(t *testing.T) {
	for _, c := range []struct {
		gi, ci      int
		mem, parent uint64
		want        string
	}{
		{1, 1, 4864, 40960, "1g.5gb"},      // A100-SXM4-40GB
		{1, 1, 9984, 81559, "1g.10gb"},     // H100 80GB HBM3
		{1, 1, 20096, 81559, "1g.20gb"},    // H100
		{2, 2, 20096, 81559, "2g.20gb"},    // H100
		{3, 3, 40448, 81559, "3g.40gb"},    // H100
		{7, 7, 81152, 81559, "7g.80gb"},    // H100
		{2, 1, 20096, 81559, "1c.2g.20gb"}, // a compute instance of part of a GI
		{1, 1, 4864, 0, "1g.0gb"},          // no parent memory known
	} {
		if got := ProfileName(c.gi, c.ci, c.mem, c.parent); got != c.want {
			t.Errorf("ProfileName(%d, %d, %d, %d) = %q, want %q", c.gi, c.ci, c.mem, c.parent, got, c.want)
		}
	}
}

func TestProfileNameSuffixes(t *testing.T) {
	for _, c := range []struct {
		index int
		want  string
	}{{0, "1g.10gb"}, {7, "1g.10gb+me"}, {0x0D, "1g.10gb-me"}, {0x0F, "1g.10gb+me.all"}, {0x0A, "1g.10gb+gfx"}} {
		if got := profileName(c.index, 1, 1, 9984, 81559); got != c.want {
			t.Errorf("profile index %#x: %q, want %q", c.index, got, c.want)
		}
	}
}

func TestCUDAVersion(t *testing.T) {
	for v, want := range map[int32]string{13000: "13.0", 12080: "12.8", 12020: "12.2", 11040: "11.4", 0: "", -1: ""} {
		if got := cudaVersion(v); got != want {
			t.Errorf("cudaVersion(%d) = %q, want %q", v, got, want)
		}
	}
}
