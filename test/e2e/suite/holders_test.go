package suite

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// TestHoldersOnRealContainerd, on an exclusive node of 4 GPUs with a real
// containerd: a privileged pod that the runtime gave every GPU's device
// node is not a holder, after an nri-gpu restart either; a container
// given a GPU node one by one (a device plugin's DeviceSpecs) holds that
// GPU, so a count request cannot have it; and a pod-level count is the
// pod's: its init container, main container and sidecar share one
// booking, held until the pod stops.
func TestHoldersOnRealContainerd(t *testing.T) {
	w, socket := exclusiveWorld(t)
	c, n := w.c, w.node
	node := func(i int) *runtimeapi.Device {
		return &runtimeapi.Device{HostPath: filepath.Join(n.Root, "dev", fmt.Sprint("nvidia", i)), ContainerPath: fmt.Sprint("/dev/nvidia", i), Permissions: "rwm"}
	}
	pod := func(name string, ann map[string]string, o harness.PodOptions) string {
		id, err := w.cri.RunPodWith(w.ctx, name, ann, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			w.cri.StopPod(context.Background(), id)
			w.cri.RemovePod(context.Background(), id)
		})
		return id
	}
	start := func(podID string, spec harness.ContainerSpec) *ctr {
		t.Helper()
		spec.Image = harness.BusyboxImage
		if spec.Command == nil {
			spec.Command = []string{"sleep", "3600"}
		}
		id, err := w.cri.Run(w.ctx, podID, spec)
		if err != nil {
			t.Fatalf("%s: %v", spec.Name, err)
		}
		return &ctr{w: w, id: id, name: spec.Name}
	}

	// A privileged agent, given every GPU node (the host's /dev). Not on
	// CRI-O here: it gives a privileged container every capability, and
	// runc cannot apply those this machine's root lacks
	// (CAP_SYS_RESOURCE); containerd gives it root's own.
	if !onCRIO() {
		agent := pod("agent", nil, harness.PodOptions{Privileged: true})
		start(agent, harness.ContainerSpec{Name: "agent", Privileged: true, Devices: []*runtimeapi.Device{node(0), node(1), node(2), node(3)}})
	}
	// A container given one GPU node, as a device plugin does.
	k := pod("k", nil, harness.PodOptions{})
	start(k, harness.ContainerSpec{Name: "k", Devices: []*runtimeapi.Device{node(2)}})
	held := allocTable(t, socket)
	if strings.Count(held, "exclusive[default/k/k]") != 1 || strings.Contains(held, "agent") {
		t.Fatalf("table %s: want the device plugin's GPU held by k alone", held)
	}
	w.plugin.stop()
	w.plugin = startPlugin(t, c, n, "--status-socket", socket)
	if got := allocTable(t, socket); got != held {
		t.Fatalf("after an nri-gpu restart: %s\nwant %s", got, held)
	}

	// A pod-level count of 2: init exits before main and sidecar start.
	p := pod("p", map[string]string{"gpus.nri-gpu.dev/pod": "2"}, harness.PodOptions{})
	init := start(p, harness.ContainerSpec{Name: "init", Command: []string{"sh", "-c", "ls /dev | grep -E '^nvidia[0-9]+$'"}})
	if code, err := w.cri.WaitExit(w.ctx, init.id, 30*time.Second); err != nil || code != 0 {
		t.Fatalf("init: %d, %v", code, err)
	}
	initLog, _ := w.cri.ContainerLog(w.ctx, init.id)
	main, sidecar := start(p, harness.ContainerSpec{Name: "main"}), start(p, harness.ContainerSpec{Name: "sidecar"})
	gm, gs := gpuNodes(main), gpuNodes(sidecar)
	if len(gm) != 2 || !slices.Equal(gm, gs) {
		t.Errorf("main %q, sidecar %q: want the same 2 GPUs", gm, gs)
	}
	for _, g := range gm {
		if !strings.Contains(initLog, strings.TrimPrefix(g, "/dev/")) {
			t.Errorf("init saw %q, main has %s", initLog, g)
		}
	}
	table := allocTable(t, socket)
	if strings.Count(table, "exclusive[default/p]") != 2 || strings.Contains(table, "default/p/") {
		t.Errorf("table %s: want pod default/p holding 2 GPUs once", table)
	}
	// The node is full: k holds one GPU, p two, and one is free.
	if _, err := w.run("more", map[string]string{"gpus.nri-gpu.dev/pod": "2"}, harness.ContainerSpec{}); err == nil ||
		!strings.Contains(err.Error(), "exclusive request for 2 GPUs cannot be met: 1 of the node's 4 GPUs are free") {
		t.Errorf("count 2 on a node with one free GPU: %v", err)
	}
	w.plugin.stop()
	w.plugin = startPlugin(t, c, n, "--status-socket", socket)
	if got := allocTable(t, socket); got != table {
		t.Errorf("after an nri-gpu restart: %s\nwant %s", got, table)
	}
	if err := w.cri.StopContainer(w.ctx, sidecar.id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := allocTable(t, socket); got != table {
		t.Errorf("after the sidecar stopped: %s\nwant %s", got, table)
	}
	if err := w.cri.StopPod(w.ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := allocTable(t, socket); got != held {
		t.Errorf("after the pod stopped: %s\nwant %s", got, held)
	}
}
