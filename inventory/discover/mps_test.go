package discover_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestDiscoverMPSPipeDir checks that the MPS pipe directory is looked for
// where MPSPipeDir (nri-gpu's own CUDA_MPS_PIPE_DIRECTORY) puts it, as
// libnvidia-container does with its own environment: found there and
// mounted at the same path, not at the default; a value that is not a
// clean absolute path is a warning and the default is used.
func TestDiscoverMPSPipeDir(t *testing.T) {
	n := generate(t, simnode.Options{NumGPUs: 1, IPC: true})
	if err := os.MkdirAll(n.HostPath("/run/mps"), 0o755); err != nil {
		t.Fatal(err)
	}
	mps := func(s *inventory.Snapshot) []string {
		var out []string
		for _, f := range s.Files {
			if f.Kind == inventory.Socket && f.Capability == inventory.Compute {
				out = append(out, f.Name+" "+f.HostPath)
			}
		}
		return out
	}
	for _, tc := range []struct {
		env, want, warning string
	}{
		{"", simnode.MPSPipeDir, ""},
		{"/run/mps", "/run/mps", ""},
		{"/run/absent", "", ""},
		{"run/mps", simnode.MPSPipeDir, "not a clean absolute directory"},
		{"/run/../run/mps", simnode.MPSPipeDir, "not a clean absolute directory"},
		{"/", simnode.MPSPipeDir, "not a clean absolute directory"},
	} {
		s, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root, MPSPipeDir: tc.env})
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		if tc.want != "" {
			want = []string{tc.want + " " + n.HostPath(tc.want)}
		}
		if got := mps(s); !slices.Equal(got, want) {
			t.Errorf("CUDA_MPS_PIPE_DIRECTORY=%q: MPS directory %q, want %q", tc.env, got, want)
		}
		warned := slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, "CUDA_MPS_PIPE_DIRECTORY") })
		if warned != (tc.warning != "") || tc.warning != "" && !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, tc.warning) }) {
			t.Errorf("CUDA_MPS_PIPE_DIRECTORY=%q: warnings %q, want %q", tc.env, s.Warnings, tc.warning)
		}
	}
}
