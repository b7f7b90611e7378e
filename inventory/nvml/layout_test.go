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
		{1, 1, 9856, 81559, "1g.10gb"},     // H100 80GB HBM3
		{2, 2, 19968, 81559, "2g.20gb"},    // H100
		{3, 3, 40192, 81559, "3g.40gb"},    // H100
		{7, 7, 80896, 81559, "7g.80gb"},    // H100
		{2, 1, 19968, 81559, "1c.2g.20gb"}, // a compute instance of part of a GI
		{1, 1, 4864, 0, "1g.0gb"},          // no parent memory known
	} {
		if got := ProfileName(c.gi, c.ci, c.mem, c.parent); got != c.want {
			t.Errorf("ProfileName(%d, %d, %d, %d) = %q, want %q", c.gi, c.ci, c.mem, c.parent, got, c.want)
		}
	}
}
