package inventory_test

import (
	"fmt"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

func TestCUDAVersion(t *testing.T) {
	for _, tc := range []struct {
		driver, cuda string
		ok           bool
	}{
		{"580.126.09", "13.0", true},
		{"580.65.06", "13.0", true},
		{"575.57.08", "12.9", true},
		{"570.172.08", "12.8", true},
		{"535.261.03", "12.2", true},
		{"550.54.15", "12.4", true},
		{"470.256.02", "11.4", true},
		{"999.1", "13.1", true}, // newer than the table: the newest known, a lower bound
		{"390.157", "", false},
		{"", "", false},
		{"banana", "", false},
		{"99999999999999999999.1", "", false},
	} {
		cuda, ok := inventory.CUDAVersion(tc.driver)
		if cuda != tc.cuda || ok != tc.ok {
			t.Errorf("CUDAVersion(%q) = %q, %v; want %q, %v", tc.driver, cuda, ok, tc.cuda, tc.ok)
		}
	}
	// The simulated driver's libcuda reports cuDriverGetVersion 13000 for
	// its 580 driver (test/simnode checks that by dlopen); the table
	// must agree without loading it.
	cuda, _ := inventory.CUDAVersion(simnode.DefaultDriverVersion)
	if want := fmt.Sprintf("%d.%d", simnode.DefaultCUDAVersion/1000, simnode.DefaultCUDAVersion%1000/10); cuda != want {
		t.Errorf("CUDAVersion(%s) = %s, simulated libcuda reports %s", simnode.DefaultDriverVersion, cuda, want)
	}
}
