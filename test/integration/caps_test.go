package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestRunsWithoutCapabilities runs the plugin as root with every
// capability dropped and privilege escalation off (util-linux setpriv),
// as the DaemonSet and the systemd unit run it: discovery, the library
// directories (hard links) and injection must all work.
func TestRunsWithoutCapabilities(t *testing.T) {
	needRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs setpriv (util-linux) to drop capabilities")
	}
	dir := shortTempDir(t)
	n, cfg := simNode(t, dir, simnode.LayoutRHEL)
	r := startRuntime(t, dir)
	defer r.stop()
	p := startCommand(t, setpriv, "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--",
		binary, "run", "--config", cfg, "--socket", r.socket, "--status-socket", filepath.Join(dir, "status.sock"))
	r.waitSynced(20 * time.Second)

	status, _ := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if !strings.Contains(string(status), "CapEff:\t0000000000000000") || !strings.Contains(string(status), "NoNewPrivs:\t1") {
		t.Fatalf("the plugin runs with capabilities:\n%s", status)
	}
	adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/pod": "all"}, "nocaps")
	if err != nil || len(adj.GetLinux().GetDevices()) != len(n.GPUs)+3 {
		t.Fatalf("without capabilities: %v, %v", adj, err)
	}
	if !strings.Contains(p.log.String(), "serving status on") {
		t.Errorf("no status socket without capabilities:\n%s", p.log.String())
	}
	if _, src := libcuda(adj); !strings.Contains(p.log.String(), "library directories ready") || src == "" {
		t.Errorf("library directories not prepared without capabilities (libcuda from %q):\n%s", src, p.log.String())
	}
}
