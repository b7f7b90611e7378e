package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestWriteTargetsNoSlowerThanCDI checks the verdict of the weaker CDI
// goal: met while the paired interval reaches 1 or below, MISSED when all
// of it is above 1. Synthetic samples; no containers.
func TestWriteTargetsNoSlowerThanCDI(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ratio func(i int) float64 // nri-gpu over cdi, per round
		want  string
	}{
		{"equal up to noise", func(i int) float64 { return 0.97 + 0.06*float64(i%5)/4 }, "no slower than the runtime's CDI of the same files: 1.000 [1.000–1.015], met"},
		{"slower every round", func(i int) float64 { return 1.05 + 0.01*float64(i%3) }, "MISSED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Result{Samples: map[string][]Sample{}}
			for i := range 100 {
				base := 100 * time.Millisecond
				r.Samples[CDI] = append(r.Samples[CDI], Sample{Create: base, Start: base})
				d := time.Duration(float64(base) * tc.ratio(i))
				r.Samples[NRIGPU] = append(r.Samples[NRIGPU], Sample{Create: d, Start: d})
			}
			var out bytes.Buffer
			WriteTargets(&out, r)
			line := ""
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.Contains(l, "no slower than") {
					line = l
				}
			}
			if !strings.Contains(line, tc.want) {
				t.Errorf("no-slower line %q, want it to contain %q\n%s", line, tc.want, out.String())
			}
		})
	}
}
