package node

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdispec"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the simulated node has real device nodes (mknod); CI runs as root")
	}
}

// logBuffer collects log output safely across goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// countingObserver records refresh results.
type countingObserver struct {
	mu        sync.Mutex
	refreshes map[string]int
	inventory int
}

func (o *countingObserver) Request(string, string, []inventory.GPU, time.Duration) {}
func (o *countingObserver) Connected()                                             {}
func (o *countingObserver) Refresh(r string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refreshes[r]++
}
func (o *countingObserver) Inventory(*inventory.Snapshot) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.inventory++
}

func newTestNode(t *testing.T) (*Node, *simnode.Node, config.Config, *logBuffer, *countingObserver) {
	t.Helper()
	needRoot(t)
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 2, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = n.Root, n.Root, n.Root
	buf := &logBuffer{}
	log := logrus.New()
	log.SetOutput(io.MultiWriter(buf))
	log.SetLevel(logrus.DebugLevel)
	p, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	obs := &countingObserver{refreshes: map[string]int{}}
	p.SetObserver(obs)
	return p, n, cfg, buf, obs
}

// libVersions returns the version suffixes of the snapshot's libraries.
func libVersions(s *inventory.Snapshot) map[string]bool {
	out := map[string]bool{}
	for _, f := range s.Files {
		if f.Kind == inventory.Library && !f.OwnVersion {
			b := filepath.Base(f.HostPath)
			out[b[strings.Index(b, ".so.")+4:]] = true
		}
	}
	return out
}

func TestUpdate(t *testing.T) {
	p, n, cfg, log, obs := newTestNode(t)
	if obs.inventory != 1 {
		t.Errorf("SetObserver told the observer %d inventories, want 1", obs.inventory)
	}
	if r, err := p.Update(cfg, "test"); r != RefreshUnchanged || err != nil {
		t.Fatalf("Update of an unchanged node = %q, %v", r, err)
	}
	before := p.Snapshot()

	// A half-done upgrade: the new kernel module is loaded, the old
	// libraries are still there. Broken: the last good snapshot stays.
	mustWrite(t, filepath.Join(n.Root, "proc/driver/nvidia/version"),
		"NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.44.01  Release Build  (dvs-builder@U16)  Thu Nov 20 2025\n")
	r, err := p.Update(cfg, "test")
	if r != RefreshRejected || err == nil || !strings.Contains(err.Error(), "do not carry the kernel module's version 590.44.01") {
		t.Fatalf("Update with a version mismatch = %q, %v", r, err)
	}
	if p.Snapshot() != before {
		t.Fatal("a broken driver replaced the snapshot")
	}
	if !strings.Contains(log.String(), "keeping the last good inventory") {
		t.Errorf("no log line says the last good inventory stays:\n%s", log)
	}

	// The upgrade completes. The log line naming it comes once the new
	// snapshot is current: a reader of the log may start a container
	// right away (it did in CI, and got the old driver).
	n2, err := simnode.Upgrade(n, "590.44.01", simnode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	seen := &snapshotAtLog{node: p, version: map[string]string{}}
	p.log.AddHook(seen)
	if r, err := p.Update(cfg, "test"); r != RefreshChanged || err != nil {
		t.Fatalf("Update after the upgrade = %q, %v", r, err)
	}
	for _, msg := range []string{"inventory discovered", "inventory refreshed"} {
		if v := seen.version[msg]; v != "590.44.01" {
			t.Errorf("when %q was logged the current driver was %q, want 590.44.01", msg, v)
		}
	}
	if s := p.Snapshot(); s.DriverVersion != "590.44.01" || !libVersions(s)["590.44.01"] || len(libVersions(s)) != 1 || len(s.GPUs) != 2 {
		t.Fatalf("after the upgrade: driver %s, libraries %v, %d GPUs", s.DriverVersion, libVersions(s), len(s.GPUs))
	}

	// The driver's libraries go away while the module stays: broken.
	good := p.Snapshot()
	if _, err := simnode.Upgrade(n2, "600.10.01", simnode.Options{NoDriver: true}); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Update(cfg, "test"); r != RefreshRejected || !strings.Contains(fmt.Sprint(err), "no driver library was found") {
		t.Fatalf("Update without libraries = %q, %v", r, err)
	}
	if p.Snapshot() != good {
		t.Fatal("a driver without libraries replaced the snapshot")
	}

	// A configuration whose root cannot be read is an error; the last
	// good configuration stays.
	bad := cfg
	bad.HostRoot = filepath.Join(n.Root, "missing")
	if r, err := p.Update(bad, "test"); r != RefreshError || err == nil {
		t.Fatalf("Update with a missing hostRoot = %q, %v", r, err)
	}
	if !reflect.DeepEqual(p.Config(), cfg) {
		t.Error("a failed update replaced the configuration")
	}
	want := map[string]int{RefreshUnchanged: 1, RefreshRejected: 2, RefreshChanged: 1, RefreshError: 1}
	for k, v := range want {
		if obs.refreshes[k] != v {
			t.Errorf("observer saw %d %q refreshes, want %d (all: %v)", obs.refreshes[k], k, v, obs.refreshes)
		}
	}
}

// snapshotAtLog records, by log message, the current snapshot's driver
// version when the message was logged.
type snapshotAtLog struct {
	node    *Node
	version map[string]string
}

func (h *snapshotAtLog) Levels() []logrus.Level { return logrus.AllLevels }
func (h *snapshotAtLog) Fire(e *logrus.Entry) error {
	h.version[e.Message] = h.node.Snapshot().DriverVersion
	return nil
}

// runWatcher runs a watcher of p with o until the test ends.
func runWatcher(t *testing.T, p *Node, o WatchOptions) *Watcher {
	t.Helper()
	w, err := p.NewWatcher(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func mustWrite(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatcher follows a driver upgrade and configuration changes through
// file events alone (no periodic rediscovery).
func TestWatcher(t *testing.T) {
	p, n, cfg, log, _ := newTestNode(t)
	cfgPath := filepath.Join(t.TempDir(), "nri-gpu.yaml")
	writeCfg := func(extra string) {
		mustWrite(t, cfgPath, fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\n%s", cfg.HostRoot, cfg.DriverRoot, extra))
	}
	writeCfg("")
	w := runWatcher(t, p, WatchOptions{ConfigPath: cfgPath, Interval: -1, Debounce: 50 * time.Millisecond})

	if _, err := simnode.Upgrade(n, "590.44.01", simnode.Options{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the upgrade to be picked up", func() bool {
		s := p.Snapshot()
		return s.DriverVersion == "590.44.01" && s.DriverProblem() == ""
	})

	// An invalid configuration is rejected; the current one stays.
	writeCfg("libraryDirs: /x\n")
	waitFor(t, "the invalid configuration to be rejected", func() bool {
		return strings.Contains(log.String(), "invalid configuration rejected")
	})
	if !strings.Contains(log.String(), `unknown field \"libraryDirs\"`) {
		t.Errorf("the log does not say what is wrong:\n%s", log)
	}
	if !reflect.DeepEqual(p.Config(), cfg) {
		t.Errorf("configuration changed to %+v", p.Config())
	}

	// A valid one replaces it.
	writeCfg("libraryDir: /usr/lib/nvidia\n")
	waitFor(t, "the new configuration", func() bool { return p.Config().LibraryDir == "/usr/lib/nvidia" })

	// Kick rereads the file even when it did not change.
	w.Kick("SIGHUP")
	waitFor(t, "the kick", func() bool { return strings.Contains(log.String(), "cause=SIGHUP") })
}

// TestWatcherCDISpecs: with emit: cdi, a CDI spec written after start is
// picked up (the node itself is unchanged), so containers created later
// get CDI references.
func TestWatcherCDISpecs(t *testing.T) {
	p, n, cfg, _, _ := newTestNode(t)
	cfg.Emit = "cdi"
	cfg.Layout, cfg.BinaryDir = config.LayoutToolkit, "" // the default with emit: cdi
	cfg.CDISpecDirs = []string{"/etc/cdi"}
	if err := p.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if len(p.State().CDINames) != 0 {
		t.Fatal("CDI names without a spec")
	}
	os.MkdirAll(filepath.Join(n.Root, "etc/cdi"), 0o755)
	runWatcher(t, p, WatchOptions{Interval: -1, Debounce: 50 * time.Millisecond})

	spec, err := cdispec.Generate(p.State().Source, inventory.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	data, err := cdispec.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(n.Root, "etc/cdi/nri-gpu.yaml"), string(data))
	waitFor(t, "the CDI spec to be read", func() bool { return len(p.State().CDINames) == len(n.GPUs) })
}

// TestWatcherConfigMapUpdate updates the configuration the way the
// kubelet updates a mounted ConfigMap: the file is a symbolic link through
// ..data, and an update renames a new ..data link over the old one.
func TestWatcherConfigMapUpdate(t *testing.T) {
	p, _, cfg, _, _ := newTestNode(t)
	dir := t.TempDir()
	write := func(version, extra string) {
		t.Helper()
		d := filepath.Join(dir, "..2026_"+version)
		os.MkdirAll(d, 0o755)
		mustWrite(t, filepath.Join(d, "config.yaml"), fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\n%s", cfg.HostRoot, cfg.DriverRoot, extra))
		tmp := filepath.Join(dir, "..data_tmp")
		os.Remove(tmp)
		if err := os.Symlink(filepath.Base(d), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	write("1", "")
	if err := os.Symlink("..data/config.yaml", filepath.Join(dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	runWatcher(t, p, WatchOptions{ConfigPath: filepath.Join(dir, "config.yaml"), Interval: -1, Debounce: 50 * time.Millisecond})

	write("2", "libraryDir: /opt/nvidia/lib64\n")
	waitFor(t, "the ConfigMap update", func() bool { return p.Config().LibraryDir == "/opt/nvidia/lib64" })
}

// BenchmarkUpdateUnchanged measures a periodic rediscovery of an
// unchanged 8-GPU node (discovery plus the comparison; nothing swapped).
func BenchmarkUpdateUnchanged(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: the simulated node has real device nodes")
	}
	n, err := simnode.Generate(b.TempDir(), simnode.Options{NumGPUs: 8, DeviceNodes: true})
	if err != nil {
		b.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = n.Root, n.Root, n.Root
	log := logrus.New()
	log.SetOutput(io.Discard)
	p, err := New(cfg, log)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if r, err := p.Update(cfg, "bench"); r != RefreshUnchanged || err != nil {
			b.Fatal(r, err)
		}
	}
}
