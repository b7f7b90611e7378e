package node

import (
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
)

func TestSkipFirmware(t *testing.T) {
	for _, tc := range []struct {
		mode, kernel string
		skip         bool
		why          string
	}{
		{"auto", "6.8.0-49-generic", true, "kernel 6.8.0-49-generic reads firmware from the host's mount namespace"},
		{"auto", "5.7.0", true, "Linux 5.7 and later"},
		{"auto", "5.4.0-150-generic", false, "before Linux 5.7"},
		{"auto", "4.18.0-553.el8_10.x86_64", false, "kernel 4.18.0-553.el8_10.x86_64 reads firmware from the mount namespace of the process that opens the GPU"},
		{"auto", "", false, "kernel release could not be read"},
		{"auto", "weird", false, `kernel release "weird" does not start with <major>.<minor>`},
		{"mount", "6.8.0", false, "firmware: mount"},
		{"skip", "4.18.0", true, "firmware: skip"},
	} {
		skip, why := skipFirmware(config.Firmware(tc.mode), tc.kernel)
		if skip != tc.skip || !strings.Contains(why, tc.why) {
			t.Errorf("skipFirmware(%q, %q) = %v, %q; want %v, %q", tc.mode, tc.kernel, skip, why, tc.skip, tc.why)
		}
	}
}
