package config

import (
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// TestDynamicMIG: dra.dynamicMIG is off by default, takes GPUs as the
// other devices keys do, and refuses a GPU also shared by memory, a list
// without dra.enabled and anything that names no GPU.
func TestDynamicMIG(t *testing.T) {
	c, err := Parse([]byte("dra:\n  enabled: true\n"))
	if err != nil || c.DRA.DynamicMIG.Enabled() {
		t.Fatalf("default: %+v, %v", c.DRA.DynamicMIG, err)
	}
	c, err = Parse([]byte("dra:\n  enabled: true\n  dynamicMIG:\n    devices: [\"1\", GPU-abc]\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := c.DRA.DynamicMIG
	if !m.Has(inventory.GPU{Index: 1}) || !m.Has(inventory.GPU{Index: 3, UUID: "GPU-ABC"}) || m.Has(inventory.GPU{Index: 0}) {
		t.Errorf("Has: wrong GPUs for %v", m.Devices)
	}
	if m.Has(inventory.GPU{Index: 1, MIG: &inventory.MIGDevice{}}) {
		t.Error("Has: a MIG device is never a GPU of dra.dynamicMIG")
	}
	for _, tc := range []struct{ yaml, want string }{
		{"dra:\n  dynamicMIG:\n    devices: [\"0\"]\n", "key dra.dynamicMIG.devices: set without dra.enabled"},
		{"dra:\n  enabled: true\n  dynamicMIG:\n    devices: [banana]\n", `key dra.dynamicMIG.devices: "banana" is not a GPU`},
		{"dra:\n  enabled: true\n  dynamicMIG:\n    devices: [\"0\", \"0\"]\n", `key dra.dynamicMIG.devices: "0" is listed twice`},
		{"dra:\n  enabled: true\n  memoryShares:\n    devices: [\"0\"]\n  dynamicMIG:\n    devices: [\"0\"]\n", `key dra.dynamicMIG.devices: "0" is in dra.memoryShares.devices too`},
		{"dra:\n  enabled: true\n  dynamicMIG:\n    device: [\"0\"]\n", `unknown field "device" (valid keys: devices)`},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
