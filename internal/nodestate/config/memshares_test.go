package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMemoryShares: dra.memoryShares is off by default, takes the GPUs
// and a minimum share, and refuses bad values naming the key, the token
// and what is valid.
func TestMemoryShares(t *testing.T) {
	c, err := Parse([]byte("dra:\n  enabled: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.DRA.MemoryShares.Enabled() {
		t.Errorf("memory shares on by default: %+v", c.DRA.MemoryShares)
	}
	c, err = Parse([]byte("dra:\n  enabled: true\n  memoryShares:\n    devices: [\"0\", GPU-abc]\n    minimum: 512Mi\n"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(DRAMemoryShares{Devices: []string{"0", "GPU-abc"}, Minimum: "512Mi"}, c.DRA.MemoryShares); diff != "" {
		t.Errorf("memoryShares (-want +got):\n%s", diff)
	}
	if !c.DRA.MemoryShares.Enabled() || c.DRA.MemoryShares.MinimumBytes() != 512<<20 {
		t.Errorf("enabled %v, minimum %d", c.DRA.MemoryShares.Enabled(), c.DRA.MemoryShares.MinimumBytes())
	}
	for _, tc := range []struct{ yaml, want string }{
		{"dra:\n  memoryShares:\n    devices: [\"0\"]\n", "key dra.memoryShares.devices: set without dra.enabled"},
		{"dra:\n  enabled: true\n  memoryShares:\n    devices: [banana]\n", `key dra.memoryShares.devices: "banana" is not a GPU`},
		{"dra:\n  enabled: true\n  memoryShares:\n    devices: [\"0\"]\n    minimum: lots\n", `key dra.memoryShares.minimum: "lots" is not a whole number of Mi, Gi or Ti from 1Mi to 1024Ti (valid: a memory size such as 1Gi or 512Mi`},
		{"dra:\n  enabled: true\n  memoryShares:\n    devices: [\"0\"]\n    minimum: 1.5Mi\n", `key dra.memoryShares.minimum: "1.5Mi" is not a whole number of Mi, Gi or Ti`},
		{"dra:\n  enabled: true\n  memoryShares:\n    devices: [\"0\"]\n    minimum: 1k\n", `key dra.memoryShares.minimum: "1k" is not a whole number of Mi, Gi or Ti`},
		{"dra:\n  enabled: true\n  memoryShares:\n    devices: [\"0\"]\n    minimum: 0Gi\n", `"0Gi" is not a whole number`},
		{"dra:\n  enabled: true\n  memoryShares:\n    devices: [\"0\"]\n    minimum: 01Gi\n", `"01Gi" is not a whole number`},
		{"dra:\n  enabled: true\n  memoryShares:\n    device: [\"0\"]\n", `unknown field "device" (valid keys: devices, minimum, acrossNamespaces)`},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
