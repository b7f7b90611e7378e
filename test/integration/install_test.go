package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestMakeInstall installs into a staging directory (DESTDIR) with
// make install and make install-systemd, checks what lands where, that an
// edited configuration survives a reinstall, that systemd accepts the
// unit, and that the installed pre-registered plugin serves a runtime.
func TestMakeInstall(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("needs make")
	}
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..")
	dir := shortTempDir(t)
	dest := filepath.Join(dir, "dest")
	makeInstall := func() {
		t.Helper()
		cmd := exec.Command("make", "-s", "install", "install-systemd", "DESTDIR="+dest, "PREFIX=/usr")
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make install: %v\n%s", err, out)
		}
	}
	makeInstall()
	for path, mode := range map[string]os.FileMode{
		"usr/bin/nri-gpu":                    0o755,
		"opt/nri/plugins/10-nri-gpu":         0o755,
		"etc/nri/conf.d/10-nri-gpu.conf":     0o644,
		"etc/systemd/system/nri-gpu.service": 0o644,
		"etc/nri-gpu/config.yaml":            0o644,
	} {
		fi, err := os.Stat(filepath.Join(dest, path))
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, mode %v; want %v", path, err, fi.Mode().Perm(), mode)
		}
	}
	for _, c := range []string{"etc/nri/conf.d/10-nri-gpu.conf", "etc/nri-gpu/config.yaml"} {
		if _, err := config.Load(filepath.Join(dest, c)); err != nil {
			t.Errorf("installed configuration rejected: %v", err)
		}
	}
	unit, _ := os.ReadFile(filepath.Join(dest, "etc/systemd/system/nri-gpu.service"))
	if !strings.Contains(string(unit), "ExecStart=/usr/bin/nri-gpu run --config /etc/nri-gpu/config.yaml") {
		t.Errorf("the unit does not run PREFIX's binary with the installed config:\n%s", unit)
	}
	if sa, err := exec.LookPath("systemd-analyze"); err == nil {
		// Verify a copy whose ExecStart names the staged binary.
		u := filepath.Join(dir, "nri-gpu.service")
		os.WriteFile(u, []byte(strings.ReplaceAll(string(unit), "/usr/bin/nri-gpu", filepath.Join(dest, "usr/bin/nri-gpu"))), 0o644)
		if out, err := exec.Command(sa, "verify", u).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}

	// The pre-registered plugin as installed, configured for a simulated
	// node; a reinstall keeps the edited configuration.
	n, cfg := simNode(t, dir, simnode.LayoutRHEL)
	data, _ := os.ReadFile(cfg)
	conf := filepath.Join(dest, "etc/nri/conf.d/10-nri-gpu.conf")
	os.WriteFile(conf, data, 0o644)
	makeInstall()
	if got, _ := os.ReadFile(conf); string(got) != string(data) {
		t.Fatalf("make install replaced the edited configuration:\n%s", got)
	}
	os.Symlink(filepath.Join(dest, "opt/nri/plugins"), filepath.Join(dir, "plugins"))
	os.Symlink(filepath.Join(dest, "etc/nri/conf.d"), filepath.Join(dir, "conf.d"))
	r := startRuntime(t, dir)
	defer r.stop()
	adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/pod": "all"}, "installed")
	if err != nil || len(adj.GetLinux().GetDevices()) != len(n.GPUs)+3 {
		t.Fatalf("installed pre-registered plugin: %v, %v", adj, err)
	}
}
