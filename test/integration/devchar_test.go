package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// charLinks returns the entries of the node's /dev/char, "name -> target".
func charLinks(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		target, _ := os.Readlink(filepath.Join(dir, e.Name()))
		out = append(out, e.Name()+" -> "+target)
	}
	return out
}

// TestDevCharLinksOutliveStop: the /dev/char links nri-gpu run makes stay
// when it stops (SIGTERM) while a GPU container runs; a plugin killed
// ungracefully and replaced finds its record in the host directory
// (devCharLinks.stateDir) and removes a link only when its device node is
// gone from the host; nri-gpu cleanup removes the links the record lists,
// and nothing else.
func TestDevCharLinksOutliveStop(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	state := filepath.Join(dir, "var-lib-nri-gpu")
	n, cfg := simNodeN(t, dir, 2, "devCharLinks:\n  stateDir: "+state+"\n")
	charDir := n.HostPath("/dev/char")
	if err := os.MkdirAll(charDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../somewhere", filepath.Join(charDir, "10:200")); err != nil { // not nri-gpu's
		t.Fatal(err)
	}
	r := startRuntime(t, dir)
	defer r.stop()
	start := func() *pluginProc {
		p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--status-socket", "")
		r.waitSynced(20 * time.Second)
		return p
	}
	p := start()
	if _, err := r.run(map[string]string{"gpus.nri-gpu.dev/container.c": "device=0"}, "c"); err != nil {
		t.Fatal(err)
	}
	made := charLinks(t, charDir)
	if len(made) < 8 {
		t.Fatalf("links made: %q", made)
	}

	// A graceful stop (a rolling update, helm uninstall) with the
	// container running: every link stays.
	if err := stopPlugin(t, p); err != nil {
		t.Fatalf("nri-gpu run on SIGTERM: %v", err)
	}
	kept := charLinks(t, charDir)
	t.Logf("links: %d made, %d kept across a stop", len(made)-1, len(kept)-1)
	if strings.Join(kept, "\n") != strings.Join(made, "\n") {
		t.Errorf("links after SIGTERM:\n%s\nwant:\n%s", strings.Join(kept, "\n"), strings.Join(made, "\n"))
	}

	// Killed (no chance to do anything), then a node goes from the host
	// while no nri-gpu runs: the replacement's record says the link is
	// nri-gpu's, and the node is gone: it goes, the others stay.
	p = start()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	p.done <- nil
	uvmTools := n.HostPath("/dev/nvidia-uvm-tools")
	if err := os.Remove(uvmTools); err != nil {
		t.Fatal(err)
	}
	p = start()
	waitUntil(t, "the link of the node gone", func() bool { return len(charLinks(t, charDir)) == len(made)-1 })
	if strings.Contains(strings.Join(charLinks(t, charDir), "\n"), "../nvidia-uvm-tools") {
		t.Errorf("the link of nvidia-uvm-tools stays after its node went:\n%s", p.log.String())
	}
	if err := stopPlugin(t, p); err != nil {
		t.Fatal(err)
	}

	// The uninstall: nri-gpu cleanup removes what the record lists.
	out, err := exec.Command(binary, "cleanup", "--config", cfg, "--dry-run").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "would remove ") {
		t.Fatalf("nri-gpu cleanup --dry-run: %v\n%s", err, out)
	}
	if got := len(charLinks(t, charDir)); got != len(made)-1 {
		t.Errorf("--dry-run removed links: %d left", got)
	}
	out, err = exec.Command(binary, "cleanup", "--config", cfg).CombinedOutput()
	t.Logf("nri-gpu cleanup:\n%s", out)
	if err != nil {
		t.Fatalf("nri-gpu cleanup: %v", err)
	}
	if got := charLinks(t, charDir); len(got) != 1 || got[0] != "10:200 -> ../somewhere" {
		t.Errorf("after nri-gpu cleanup: %q, want only the link that is not nri-gpu's", got)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("left in the state directory: %v", entries)
	}
}
