package node_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/mps"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestRunMPS: the node's state follows the ready file nri-gpu mps keeps
// for a GPU's daemon: not ready without one, ready once it is written
// (the format is the one mps.Ready documents), not ready again, with why,
// when it goes; each change swaps in a new state that subscribers see, and
// an unchanged readiness swaps nothing.
func TestRunMPS(t *testing.T) {
	root := t.TempDir()
	cfg := config.Default()
	cfg.DevicePlugin.Enabled, cfg.DevicePlugin.MPSRoot = true, root
	cfg.DevicePlugin.Sharing.MPS = &config.ReplicatedResources{Resources: []config.ReplicatedResource{{Name: "nvidia.com/gpu", Replicas: 2, Devices: config.ReplicatedDevices{All: true}}}}
	snap := simnode.MemorySnapshot()
	snap.GPUs = snap.GPUs[:1]
	src := adjust.Prepare(snap, adjust.Layout{LibraryDir: "/l", Library32Dir: "/l32"})
	st := &node.State{Config: cfg, Source: src, Shares: sharing.NewPlan(cfg.DevicePlugin.SharingSpec(), src.Devices())}
	uuid := snap.GPUs[0].UUID
	log := logrus.New()
	log.SetOutput(io.Discard)
	n := node.Fixed(st, log)
	var mu sync.Mutex
	var seen []bool
	cancel := n.Subscribe(func(s *node.State) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, s.Shares.Shares[uuid].MPS.Ready)
	})
	defer cancel()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go n.RunMPS(ctx, 10*time.Millisecond)

	readyNow := func() *sharing.MPSDaemon { return n.State().Shares.Shares[uuid].MPS }
	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, readyNow())
			}
		}
	}
	wait("not ready, with why", func() bool { return strings.Contains(readyNow().Why, "reports no running MPS control daemon") })

	dir := filepath.Join(root, uuid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Written whole and renamed into place, as nri-gpu mps does: a probe
	// must not read it half-written.
	data, _ := json.Marshal(mps.Ready{Version: mps.ReadyVersion, UUID: uuid, MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: 50}, PID: 1})
	if err := os.WriteFile(filepath.Join(dir, mps.ReadyFile+".tmp"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, mps.ReadyFile+".tmp"), filepath.Join(dir, mps.ReadyFile)); err != nil {
		t.Fatal(err)
	}
	wait("ready", func() bool { return readyNow().Ready })
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	swaps := len(seen)
	mu.Unlock()
	if err := os.Remove(filepath.Join(dir, mps.ReadyFile)); err != nil {
		t.Fatal(err)
	}
	wait("not ready again", func() bool { return !readyNow().Ready && readyNow().Why != "" })
	mu.Lock()
	defer mu.Unlock()
	if swaps != 2 || len(seen) != 3 || !seen[1] || seen[2] {
		t.Errorf("subscribers saw %v (%d swaps before the removal), want [false true false]", seen, swaps)
	}
}
