package suite

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// TestContainerdDropIns has the real containerd merge deploy/containerd's
// drop-ins (`containerd config dump`) into a config.toml that turns NRI
// off, and checks that the result has NRI on and the default validator
// enabled, and that nri-gpu doctor reads the same from the same files.
func TestContainerdDropIns(t *testing.T) {
	skipOnCRIO(t, "containerd's drop-ins (TestCRIODropIn is CRI-O's)")
	tools, _ := harness.SetupForTest(t, "")
	_, file, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "containerd")
	legacy := strings.HasPrefix(tools.ContainerdVersion, "v1.")
	for _, tc := range []struct {
		name    string
		version int
		imports []string
	}{
		{"1.7 drop-in", 2, []string{"10-nri.toml"}},
		{"2.x drop-ins", 3, []string{"10-nri-v3.toml", "20-nri-validator.toml"}},
		{"1.7 drop-in with the validator", 3, []string{"10-nri.toml", "20-nri-validator.toml"}},
		{"version 2 config with the validator", 2, []string{"10-nri.toml", "20-nri-validator.toml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if legacy && tc.version == 3 {
				t.Skipf("containerd %s reads only config version 2 (version 3 is containerd 2.x's)", tools.ContainerdVersion)
			}
			dir := t.TempDir()
			var imports []string
			for _, i := range tc.imports {
				imports = append(imports, `"`+filepath.Join(deploy, i)+`"`)
			}
			cfg := filepath.Join(dir, "config.toml")
			os.WriteFile(cfg, []byte("version = "+itoa(tc.version)+"\nimports = ["+strings.Join(imports, ", ")+"]\n"+
				"[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n"), 0o644)
			out, err := exec.Command(tools.Containerd, "--config", cfg, "config", "dump").CombinedOutput()
			v3Import := tc.version == 2 && strings.Contains(strings.Join(tc.imports, " "), "validator")
			if legacy && v3Import {
				// containerd 1.7 refuses a version 3 import: it would not
				// start. doctor says so.
				if err == nil || !strings.Contains(string(out), "unsupported config version `3`") {
					t.Errorf("containerd %s accepted a version 3 import: %v\n%s", tools.ContainerdVersion, err, out)
				}
				out, _ = exec.Command(nriGPU(t), "doctor", "--containerd-config", cfg, "--socket", filepath.Join(dir, "none.sock")).CombinedOutput()
				if !strings.Contains(string(out), "containerd 1.7 refuses to start with it") {
					t.Errorf("doctor does not warn about the version 3 import:\n%s", out)
				}
				return
			}
			if err != nil {
				t.Fatalf("containerd config dump: %v\n%s", err, out)
			}
			dump := strings.ReplaceAll(string(out), `"io.containerd.nri.v1.nri"`, "'io.containerd.nri.v1.nri'") // 1.7 quotes with "
			i := strings.Index(dump, "[plugins.'io.containerd.nri.v1.nri']")
			if i < 0 {
				t.Fatalf("no NRI table in\n%s", dump)
			}
			nri := dump[i:]
			if j := strings.Index(nri, "\n  [plugins.'io.containerd.runtime"); j > 0 {
				nri = nri[:j]
			}
			if j := strings.Index(nri, "\n  [plugins.\"io.containerd.runtime"); j > 0 {
				nri = nri[:j]
			}
			if !strings.Contains(nri, "disable = false") {
				t.Errorf("containerd %s: NRI not enabled by the drop-ins:\n%s", tools.ContainerdVersion, nri)
			}
			wantValidator := strings.Contains(strings.Join(tc.imports, " "), "validator")
			if wantValidator && !strings.Contains(nri, "enable = true") {
				t.Errorf("containerd %s: default validator not enabled:\n%s", tools.ContainerdVersion, nri)
			}

			// nri-gpu doctor merges the same files the same way.
			out, _ = exec.Command(nriGPU(t), "doctor", "--containerd-config", cfg, "--socket", filepath.Join(dir, "none.sock")).CombinedOutput()
			if !strings.Contains(string(out), "containerd: NRI enabled (disable = false)") {
				t.Errorf("doctor disagrees with containerd:\n%s", out)
			}
			if wantValidator != strings.Contains(string(out), "PASS  injection   required plugins") {
				t.Errorf("doctor's validator verdict disagrees with containerd:\n%s", out)
			}
		})
	}
}
