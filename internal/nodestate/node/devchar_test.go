package node

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/devchar"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestDevCharLinks: a node that keeps /dev/char links (nri-gpu run) makes
// one per node it serves when it starts and leaves a foreign link alone;
// its links outlive it (a replaced nri-gpu picks up the record) and a
// configuration that switches them off; one goes only when its device node
// is gone from the host; Remove (nri-gpu cleanup) takes only nri-gpu's. A
// node without the option (nri-gpu inventory, doctor) makes none.
func TestDevCharLinks(t *testing.T) {
	needRoot(t)
	sn, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 2, DeviceNodes: true, IMEXChannels: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = sn.Root, sn.Root, sn.Root
	log := logrus.New()
	log.SetOutput(io.Discard)
	charDir := filepath.Join(sn.Root, "dev", "char")
	links := func() []string {
		entries, _ := os.ReadDir(charDir)
		var out []string
		for _, e := range entries {
			target, _ := os.Readlink(filepath.Join(charDir, e.Name()))
			out = append(out, e.Name()+" -> "+target)
		}
		return out
	}

	// Without the option: nothing.
	if _, err := New(cfg, log); err != nil {
		t.Fatal(err)
	}
	if got := links(); len(got) != 0 {
		t.Fatalf("a node without KeepDevCharLinks made %q", got)
	}

	if err := os.MkdirAll(charDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../foreign", filepath.Join(charDir, "195:255")); err != nil {
		t.Fatal(err)
	}
	n, err := New(cfg, log, KeepDevCharLinks())
	if err != nil {
		t.Fatal(err)
	}
	g := sn.GPUs[0]
	imexMajor := simnode.IMEXMajor(sn.UVMMajor)
	for name, target := range map[string]string{
		"195:" + itoa(g.Minor):   "../nvidia" + itoa(g.Minor),
		"195:254":                "../nvidia-modeset",
		itoa(sn.UVMMajor) + ":1": "../nvidia-uvm-tools",
		itoa(imexMajor) + ":0":   "../nvidia-caps-imex-channels/channel0",
		"195:255":                "../foreign",
	} {
		if got, err := os.Readlink(filepath.Join(charDir, name)); err != nil || got != target {
			t.Errorf("/dev/char/%s -> %q (%v), want %s", name, got, err, target)
		}
	}
	// The DRM nodes of both GPUs.
	for _, gg := range sn.GPUs {
		for _, p := range []string{simnode.CardPath(gg.Index), simnode.RenderPath(gg.Index)} {
			fi, err := os.Stat(filepath.Join(sn.Root, p))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			name := itoa(int(unix.Major(st.Rdev))) + ":" + itoa(int(unix.Minor(st.Rdev)))
			if got, err := os.Readlink(filepath.Join(charDir, name)); err != nil || got != "../dri/"+filepath.Base(p) {
				t.Errorf("/dev/char/%s -> %q (%v), want ../dri/%s", name, got, err, filepath.Base(p))
			}
		}
	}
	// 2 GPUs, their 4 DRM nodes, modeset, uvm, uvm-tools, 1 channel;
	// nvidiactl's is foreign.
	if got := links(); len(got) != 11 {
		t.Errorf("links %q", got)
	}
	rec := filepath.Join(sn.Root, "run", "nri-gpu", devchar.RecordName)
	if _, err := os.Stat(rec); err != nil {
		t.Errorf("no record under hostRoot: %v", err)
	}

	// A replaced nri-gpu (a restart, a new pod) finds the record and the
	// links as they are: it makes none and loses none.
	buf := &logBuffer{}
	log2 := logrus.New()
	log2.SetOutput(buf)
	if _, err := New(cfg, log2, KeepDevCharLinks()); err != nil {
		t.Fatal(err)
	}
	if got := links(); len(got) != 11 || strings.Contains(buf.String(), "devCharLinks: created") {
		t.Errorf("after a restart: %q\n%s", got, buf)
	}
	if rec, err := devchar.Recorded(DevCharOptions(cfg)); err != nil || len(rec) != 10 {
		t.Errorf("the record after a restart: %v, %v", rec, err)
	}

	// A configuration that switches them off leaves them (containers
	// were given the nodes), and says so once.
	off := cfg
	off.DevCharLinks.Enabled = new(bool)
	for range 2 {
		if err := n.Reload(off); err != nil {
			t.Fatal(err)
		}
	}
	if got := links(); len(got) != 11 {
		t.Errorf("after devCharLinks.enabled: false: %q", got)
	}

	// A node gone from the host loses its link at the next discovery.
	uvmTools := filepath.Join(sn.Root, "dev", "nvidia-uvm-tools")
	if err := os.Remove(uvmTools); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if got := links(); len(got) != 10 || slices.Contains(got, itoa(sn.UVMMajor)+":1 -> ../nvidia-uvm-tools") {
		t.Errorf("after nvidia-uvm-tools went: %q", got)
	}

	// nri-gpu cleanup: only nri-gpu's go.
	if removed, err := devchar.Remove(DevCharOptions(cfg)); err != nil || len(removed) != 9 {
		t.Errorf("Remove: %v, %v", removed, err)
	}
	if got := links(); len(got) != 1 || got[0] != "195:255 -> ../foreign" {
		t.Errorf("after cleanup: %q, want only the foreign link", got)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
