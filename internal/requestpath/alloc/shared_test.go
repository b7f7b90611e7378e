package alloc

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestKubeletShares checks the shared-replicas annotation: its key per
// resource, its value written and read back, and each bad value refused
// with what is wrong.
func TestKubeletShares(t *testing.T) {
	if k := KubeletSharedAnnotation("nvidia.com/gpu.shared"); k != "gpus.nri-gpu.dev/kubelet-shared.nvidia.com_gpu.shared" {
		t.Errorf("key %q", k)
	}
	s := KubeletShares{Strategy: "mps", Shares: []KubeletShare{{UUID: "GPU-a", Given: 1, Replicas: 4}, {UUID: "GPU-b", Given: 2, Replicas: 4}}}
	if v := s.String(); v != "mps:GPU-a=1/4,GPU-b=2/4" {
		t.Errorf("String() = %q", v)
	}
	got, err := ParseKubeletShares(s.String())
	if d := cmp.Diff(s, got); err != nil || d != "" {
		t.Errorf("round trip (-want +got), %v:\n%s", err, d)
	}
	for _, tc := range []struct{ v, want string }{
		{"", `"" does not start with a strategy (time-slicing or mps) and a colon`},
		{"spatial:GPU-a=1/2", `does not start with a strategy`},
		{"mps:", `device "" is not <uuid>=<given>/<replicas>`},
		{"mps:GPU-a=3/2", `device "GPU-a=3/2" is not`},
		{"mps:GPU-a=0/2", `device "GPU-a=0/2" is not`},
		{"mps:GPU-a=1/1", `device "GPU-a=1/1" is not`},
		{"time-slicing:GPU a=1/2", `device "GPU a=1/2" is not`},
		{"time-slicing:GPU-a=1/2,GPU-a=1/2", "device GPU-a is listed twice"},
		{"mps:" + strings.Repeat("G=1/2,", 300) + "G=1/2", "301 devices (at most 256)"},
		{"mps:" + strings.Repeat("x", 70000), "70004 bytes (at most 65536)"},
	} {
		if _, err := ParseKubeletShares(tc.v); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseKubeletShares(%.40q) = %v, want %q", tc.v, err, tc.want)
		}
	}
}

// FuzzParseKubeletShares: any value parses without panicking, within its
// bounds, and what parses writes back to a value that reads the same.
func FuzzParseKubeletShares(f *testing.F) {
	f.Add("mps:GPU-a=1/4,GPU-b=2/4")
	f.Add("time-slicing:MIG-3e953d37-558d-fb20-8eca-25de8b98f5a7=1/2")
	f.Add("mps:GPU-a=1/4,,")
	f.Fuzz(func(t *testing.T, v string) {
		s, err := ParseKubeletShares(v)
		if err != nil {
			return
		}
		if len(s.Shares) == 0 || len(s.Shares) > maxKubeletShares {
			t.Fatalf("%q: %d devices", v, len(s.Shares))
		}
		back, err := ParseKubeletShares(s.String())
		if err != nil || !cmp.Equal(s, back) {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", v, s, s.String(), back, err)
		}
	})
}
