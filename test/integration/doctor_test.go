package integration

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestDoctorCommand runs `nri-gpu doctor` on a simulated node against a
// real runtime side and a real nri-gpu, asked on its status socket: exit 0
// when all passes, exit 1 with the failed check named once nri-gpu stops
// (its socket left behind, refusing connections).
func TestDoctorCommand(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	n, cfg := simNode(t, dir, simnode.LayoutDebian)
	_, file, _, _ := runtime.Caller(0)
	for _, f := range []struct{ src, dst string }{
		{"containerd/10-nri-v3.toml", "etc/containerd/conf.d/10-nri.toml"},
		{"containerd/20-nri-validator.toml", "etc/containerd/conf.d/20-nri-validator.toml"},
	} {
		data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "deploy", f.src))
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(n.Root, "etc/containerd/conf.d"), 0o755)
		os.WriteFile(filepath.Join(n.Root, f.dst), data, 0o644)
	}
	os.WriteFile(filepath.Join(n.Root, "etc/containerd/config.toml"), []byte("version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n"), 0o644)

	r := startRuntime(t, dir)
	defer r.stop()
	status := filepath.Join(dir, "status.sock")
	p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--status-socket", status)
	r.waitSynced(20 * time.Second)

	doctor := func() (string, int) {
		out, err := exec.Command(binary, "doctor", "--config", cfg, "--socket", r.socket, "--status-socket", status).CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return string(out), 0
		case errors.As(err, &ee):
			return string(out), ee.ExitCode()
		}
		t.Fatal(err)
		return "", 0
	}
	out, code := doctor()
	t.Logf("nri-gpu doctor, exit %d:\n%s", code, out)
	if code != 0 || !strings.Contains(out, "all checks passed") || strings.Count(out, "PASS") != 12 { // 12 with the dev/char links and NVML/MIG checks
		t.Fatalf("doctor on a good node: exit %d\n%s", code, out)
	}
	for _, want := range []string{
		"PASS  kernel      driver            NVIDIA kernel module 580.126.09 loaded",
		"PASS  injection   registration      nri-gpu reports itself connected and synchronized (status socket " + status + ")",
		"PASS  injection   dev/char links    all 16 nodes nri-gpu injects have their /dev/char link", // 4 GPUs, their 8 DRM nodes, 4 control nodes
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}

	p.cmd.Process.Kill()
	<-p.done
	p.done <- nil
	out, code = doctor()
	t.Logf("nri-gpu doctor, exit %d:\n%s", code, out)
	if code != 1 || !strings.Contains(out, "FAIL  injection   registration      status socket "+status) || !strings.Contains(out, "fix: ") {
		t.Fatalf("doctor with nri-gpu stopped: exit %d\n%s", code, out)
	}
}
