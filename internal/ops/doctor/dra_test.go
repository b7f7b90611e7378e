package doctor

import (
	"errors"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
)

// TestDRACheckpoint: with dra.enabled, a checkpoint that reads passes
// with its count of claims; one that does not fails, naming the file's
// problem and what to do; without dra.enabled it is skipped.
func TestDRACheckpoint(t *testing.T) {
	cfg := config.Default()
	cfg.DRA.Enabled, cfg.DRA.PluginDir = true, "/var/lib/kubelet/plugins/gpu.nri-gpu.dev"
	for _, tc := range []struct {
		name    string
		enabled bool
		read    func(string) (int, error)
		status  Status
		want    []string
	}{
		{"reads", true, func(string) (int, error) { return 2, nil }, Pass, []string{"/var/lib/kubelet/plugins/gpu.nri-gpu.dev/checkpoint.json reads: 2 prepared claims"}},
		{"off", false, nil, Skip, nil},
		{"unreadable", true, func(dir string) (int, error) {
			return 0, errors.New("read checkpoint " + dir + `/checkpoint.json: version "dra.nri-gpu.dev/v3" is not one this nri-gpu reads`)
		}, Fail, []string{`version "dra.nri-gpu.dev/v3"`, "holds every GPU it offers and is not ready", "run the nri-gpu that wrote it again", "move /var/lib/kubelet/plugins/gpu.nri-gpu.dev/checkpoint.json away"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.DRA.Enabled = tc.enabled
			var out []Result
			checkDRACheckpoint(&Options{Config: c, DRACheckpoint: tc.read}, &out)
			if !tc.enabled {
				if len(out) != 0 {
					t.Errorf("dra.enabled off: %+v", out)
				}
				return
			}
			if len(out) != 1 || out[0].Status != tc.status || out[0].Name != "DRA checkpoint" {
				t.Fatalf("results %+v", out)
			}
			text := out[0].Verdict + " " + out[0].Fix
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("%q lacks %q", text, w)
				}
			}
		})
	}
}

// TestDRAMadeMIG: with dra.dynamicMIG listing GPUs, a ledger that reads
// passes with its count; one that does not fails, saying the driver does
// not start and what to do; without dra.dynamicMIG there is no line.
func TestDRAMadeMIG(t *testing.T) {
	cfg := config.Default()
	cfg.DRA.Enabled, cfg.DRA.PluginDir = true, "/var/lib/kubelet/plugins/gpu.nri-gpu.dev"
	for _, tc := range []struct {
		name    string
		devices []string
		read    func(string) (int, error)
		status  Status
		want    []string
	}{
		{"reads", []string{"0"}, func(string) (int, error) { return 3, nil }, Pass, []string{"/var/lib/kubelet/plugins/gpu.nri-gpu.dev/dynamic-mig.json reads: 3 MIG devices made on demand"}},
		{"off", nil, func(string) (int, error) { return 0, errors.New("never read") }, Skip, nil},
		{"unreadable", []string{"0"}, func(dir string) (int, error) {
			return 0, errors.New("read " + dir + "/dynamic-mig.json: unexpected end of JSON input")
		}, Fail, []string{"unexpected end of JSON input", "does not start without it", "nvidia-smi mig -dci", "move /var/lib/kubelet/plugins/gpu.nri-gpu.dev/dynamic-mig.json away"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.DRA.DynamicMIG.Devices = tc.devices
			var out []Result
			checkDRAMadeMIG(&Options{Config: c, DRAMadeMIG: tc.read}, &out)
			if tc.devices == nil {
				if len(out) != 0 {
					t.Errorf("dra.dynamicMIG off: %+v", out)
				}
				return
			}
			if len(out) != 1 || out[0].Status != tc.status || out[0].Name != "DRA MIG made on demand" {
				t.Fatalf("results %+v", out)
			}
			text := out[0].Verdict + " " + out[0].Fix
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("%q lacks %q", text, w)
				}
			}
		})
	}
}
