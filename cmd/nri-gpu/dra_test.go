package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/plugin"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// syncBuffer is a log that a test reads while the plugin writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReviewDefect3UnreadableCheckpointFailsClosed: nri-gpu run with
// dra.enabled and a checkpoint that cannot be read (truncated) holds
// every GPU the DRA driver offers, exclusively, for its unknown claims,
// is not ready, saying why, and logs it once; once the file reads, the
// GPUs are free and the reason gone. (The previous startDRA only warned:
// every prepared claim's GPU was free to a node-local request.)
func TestReviewDefect3UnreadableCheckpointFailsClosed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the simulated node has real device nodes (mknod); CI runs as root")
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 2, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = n.Root, n.Root, n.Root
	dirs := t.TempDir()
	cfg.DRA.Enabled, cfg.DRA.PluginDir = true, filepath.Join(dirs, "plugin")
	cfg.DRA.RegistrationDir, cfg.DRA.CDIDir = filepath.Join(dirs, "registry"), filepath.Join(dirs, "cdi")
	if err := os.MkdirAll(cfg.DRA.PluginDir, 0o750); err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(cfg.DRA.PluginDir, "checkpoint.json")
	truncated := `{"version":"dra.nri-gpu.dev/v2","claims":{"uid-1":{"namespace":"ml","name":"train","devices":[{"request":"gpu","device":"gpu-0","uu`
	if err := os.WriteFile(ckpt, []byte(truncated), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	log := logrus.New()
	log.SetOutput(&logs)
	p, err := plugin.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := startDRA(ctx, true, p, log)
	defer func() { cancel(); <-done }()
	st := p.Status()
	if len(st.GPUs) != 2 {
		t.Fatalf("%d GPUs in the table", len(st.GPUs))
	}
	for _, g := range st.GPUs {
		if g.Mode != "exclusive" || len(g.Holders) != 1 || !strings.Contains(g.Holders[0].String(), "checkpoint cannot be read") {
			t.Errorf("GPU %d with an unreadable checkpoint: %s %v, want held exclusively for the unknown claims", g.Index, g.Mode, g.Holders)
		}
	}
	if err := p.NotReady(); err == nil || !strings.Contains(err.Error(), "checkpoint.json") || !strings.Contains(err.Error(), "GPUs it offers are held") {
		t.Errorf("readiness with an unreadable checkpoint: %v", err)
	}
	// It reads again: the GPUs go free, the reason goes.
	if err := os.WriteFile(ckpt, []byte(`{"version":"dra.nri-gpu.dev/v2","claims":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.Status().GPUs[0].Mode != "free" || p.Status().GPUs[1].Mode != "free" {
		if time.Now().After(deadline) {
			t.Fatalf("GPUs still held once the checkpoint reads: %+v", p.Status().GPUs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := p.NotReady(); err != nil && strings.Contains(err.Error(), "checkpoint") {
		t.Errorf("readiness once the checkpoint reads: %v", err)
	}
	if got := strings.Count(logs.String(), "the prepared claims cannot be read"); got != 1 {
		t.Errorf("logged %d times that the checkpoint cannot be read, want once:\n%s", got, logs.String())
	}
}
