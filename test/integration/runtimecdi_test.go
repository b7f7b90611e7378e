package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestEmitCDIPerRuntime: with emit: cdi, nri-gpu names GPUs as CDI devices
// only to runtimes that inject them. CRI-O 1.34 drops CDI devices returned
// through NRI, whatever its NRI version says: it gets edits, and the log
// says so once. The runtime side is NRI's own, under the names and
// versions CRI-O and containerd give (a test binary reports no NRI
// version: the plugin's stub infers it from the runtime's name and
// version, as with CRI-O 1.34).
func TestEmitCDIPerRuntime(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		runtime, version string
		cdi              bool
	}{
		// NRI's stub infers NRI v0.10.0 (CDI capable) for these two.
		{"cri-o", "v1.34.0", false},
		{"cri-o", "v1.35.0", true},
		// As CRI-O 1.34.0 really says it: no NRI version is inferred.
		{"cri-o", "1.34.0", false},
		{"cri-o", "v1.33.2", false},
		{"containerd", "v2.2.1", true},
	} {
		t.Run(tc.runtime+"-"+tc.version, func(t *testing.T) {
			dir := shortTempDir(t)
			n, cfg := simNode(t, dir, simnode.LayoutRHEL, "emit: cdi\ncdiSpecDirs: [/etc/cdi]\n")
			specDir := n.HostPath("/etc/cdi")
			if err := os.MkdirAll(specDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(binary, "cdi", "generate", "--config", cfg, "-o", filepath.Join(specDir, "nri-gpu.yaml")).CombinedOutput(); err != nil {
				t.Fatalf("nri-gpu cdi generate: %v\n%s", err, out)
			}
			r := startRuntimeAs(t, dir, tc.runtime, tc.version, newStore())
			defer r.stop()
			p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket)
			r.waitSynced(20 * time.Second)

			adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/pod": "device=1"}, "train")
			if err != nil {
				t.Fatal(err)
			}
			gotCDI := len(adj.GetCDIDevices()) > 0
			if gotCDI != tc.cdi {
				t.Errorf("%s %s: CDI devices %v, device nodes %d; want CDI %v", tc.runtime, tc.version, adj.GetCDIDevices(), len(adj.GetLinux().GetDevices()), tc.cdi)
			}
			if !tc.cdi && len(adj.GetLinux().GetDevices()) == 0 {
				t.Errorf("no device nodes in the edits")
			}
			warning := "drops CDI devices returned through NRI"
			want := 0
			if tc.runtime == "cri-o" && !tc.cdi {
				want = 1
			}
			if got := strings.Count(p.log.String(), warning); got != want {
				t.Errorf("the log says %q %d times:\n%s", warning, got, p.log.String())
			}
		})
	}
}
