package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// capNodes returns the /dev/nvidia-caps nodes a container sees.
func capNodes(c *ctr) []string {
	out, _ := c.sh("ls /dev/nvidia-caps 2>/dev/null")
	var nodes []string
	for _, f := range strings.Fields(out) {
		nodes = append(nodes, "/dev/nvidia-caps/"+f)
	}
	sort.Strings(nodes)
	return nodes
}

// TestMIG runs containers on MIG devices of a simulated node (GPU 0 in
// seven 1g.10gb, GPU 1 in three 2g.20gb and one 1g.10gb, GPUs 2 and 3
// whole; minors swapped, so GPU 0 is /dev/nvidia3), with the simulated
// libnvidia-ml.so.1 that nri-gpu loads through its purego binding, under
// a real containerd, in exclusive mode.
func TestMIG(t *testing.T) {
	outer := t
	c := harness.StartForTest(t, harness.ContainerdOptions{})
	n := newNode(t, simnode.LayoutRHEL, "sharing: exclusive\n")
	if err := n.SetMIG(simnode.MixedMIG()); err != nil {
		t.Fatal(err)
	}
	major, err := n.CapsMajor()
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: context.Background()}
	dir, err := os.MkdirTemp("", "nri-gpu-e2e-mig-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "status.sock")
	w.plugin = startPlugin(t, c, n, "--watch-interval", "200ms", "--status-socket", socket)
	if !strings.Contains(w.plugin.log.String(), "NVML: ") || !strings.Contains(w.plugin.log.String(), "loaded: MIG devices and XID health are available") {
		t.Fatalf("nri-gpu did not load the simulated NVML:\n%s", w.plugin.log.String())
	}
	g0 := n.GPUs[0]
	parent := fmt.Sprintf("/dev/nvidia%d", g0.Minor)
	cap := func(minor int) string { return fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor) }
	// MIG device 0:1 is GPU instance 8, compute instance 0; 0:2 is GI 9.
	gi, ci := simnode.GIMinor(g0.Minor, 8), simnode.CIMinor(g0.Minor, 8, 0)
	mig01 := simnode.MIGUUIDFor(g0.UUID, 8, 0)

	t.Run("one MIG device", func(t *testing.T) {
		c := w.mustRun("mig", map[string]string{"gpus.nri-gpu.dev/container.mig": "device=" + mig01}, harness.ContainerSpec{})
		if got := gpuNodes(c); !slices.Equal(got, []string{parent}) {
			t.Errorf("GPU nodes %q, want exactly the parent's %s\n%s", got, parent, c.view())
		}
		want := []string{cap(gi), cap(ci)}
		sort.Strings(want)
		if got := capNodes(c); !slices.Equal(got, want) {
			t.Errorf("capability nodes %q, want exactly %q\n%s", got, want, c.view())
		}
		if got := envOf(c, "NVIDIA_VISIBLE_DEVICES"); got != mig01 {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, mig01)
		}
		for p, mm := range map[string]string{
			parent:  fmt.Sprintf("195:%d", g0.Minor),
			cap(gi): fmt.Sprintf("%d:%d", major, gi),
			cap(ci): fmt.Sprintf("%d:%d", major, ci),
		} {
			if got := majorMinor(c, p); got != mm {
				t.Errorf("%s is %s, want %s", p, got, mm)
			}
			if e := openError(c, p); !strings.Contains(e, enxio) {
				t.Errorf("opening %s: %q, want %q (the cgroup must allow it)", p, e, enxio)
			}
		}
		// A sibling's capability node, made by hand, is denied.
		sib := simnode.CIMinor(g0.Minor, 9, 0)
		if out, code := c.sh(fmt.Sprintf("mknod /tmp/x c %d %d && head -c 1 /tmp/x", major, sib)); code == 0 || !strings.Contains(out, eperm) {
			t.Errorf("a sibling MIG device's capability node (minor %d) was usable: %q", sib, out)
		}
	})

	t.Run("two MIG devices of one GPU side by side", func(t *testing.T) {
		a := w.mustRun("mig-a", map[string]string{"gpus.nri-gpu.dev/container.mig-a": "device=0:2"}, harness.ContainerSpec{})
		b := w.mustRun("mig-b", map[string]string{"gpus.nri-gpu.dev/container.mig-b": "device=0:3"}, harness.ContainerSpec{})
		for _, x := range []*ctr{a, b} {
			if got := gpuNodes(x); !slices.Equal(got, []string{parent}) {
				t.Errorf("%s: GPU nodes %q, want %s", x.name, got, parent)
			}
		}
		if got := envOf(b, "NVIDIA_VISIBLE_DEVICES"); got != simnode.MIGUUIDFor(g0.UUID, 10, 0) {
			t.Errorf("mig-b: NVIDIA_VISIBLE_DEVICES=%q", got)
		}
		_, err := w.run("mig-c", map[string]string{"gpus.nri-gpu.dev/container.mig-c": "device=0:2"}, harness.ContainerSpec{})
		if err == nil || !strings.Contains(err.Error(), "MIG device 0:2 cannot be held exclusively: it is held by default/mig-a/mig-a (exclusive)") {
			t.Errorf("a third container on a held MIG device: %v", err)
		}
		// nri-gpu status shows the MIG devices, also after a restart
		// (the table rebuilt from the containers).
		want := []string{"0:1=exclusive[default/mig/mig]", "0:2=exclusive[default/mig-a/mig-a]", "0:3=exclusive[default/mig-b/mig-b]", "0:4=free", "1:3=free", "2=free"}
		for _, when := range []string{"before", "after a plugin restart"} {
			table := allocTable(t, socket)
			for _, row := range want {
				if !strings.Contains(table, row) {
					t.Errorf("%s: table %s lacks %s", when, table, row)
				}
			}
			if when == "before" {
				w.plugin.stop()
				w.plugin = startPlugin(outer, c, n, "--watch-interval", "200ms", "--status-socket", socket) // lives past the subtest
			}
		}
	})

	t.Run("the MIG GPU is not handed out whole", func(t *testing.T) {
		_, err := w.run("whole", map[string]string{"gpus.nri-gpu.dev/container.whole": "device=0"}, harness.ContainerSpec{})
		if err == nil || !strings.Contains(err.Error(), `GPU "0" (index 0) has MIG enabled and is not handed out whole; request one of its MIG devices 0:0-0:6`) {
			t.Errorf("device=0 on the MIG GPU: %v", err)
		}
	})

	t.Run("a layout change is followed without a restart", func(t *testing.T) {
		// The driver refuses to destroy an instance in use: the MIG
		// devices of GPU 0 are released first.
		pods, err := w.cri.ListPods(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if name := p.GetMetadata().GetName(); name == "mig" || name == "mig-a" || name == "mig-b" {
				if err := w.cri.StopPod(w.ctx, p.GetId()); err != nil {
					t.Fatal(err)
				}
			}
		}
		st := simnode.MixedMIG()
		st.GPUs[0].MIG = []simnode.MIG{simnode.H100MIG(1, 0, 3), simnode.H100MIG(2, 0, 3)}
		if err := n.SetMIG(st); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(w.plugin.log.String(), "mig=6") {
			if time.Now().After(deadline) {
				t.Fatalf("nri-gpu did not rediscover the new layout:\n%s", w.plugin.log.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		_, err = w.run("gone", map[string]string{"gpus.nri-gpu.dev/container.gone": "device=0:6"}, harness.ContainerSpec{})
		if err == nil || !strings.Contains(err.Error(), `unknown MIG device "0:6" (node has MIG devices 0:0-0:1,1:0-1:3`) {
			t.Errorf("a request for a MIG device that no longer exists: %v", err)
		}
		x := w.mustRun("new", map[string]string{"gpus.nri-gpu.dev/container.new": "device=0:1"}, harness.ContainerSpec{})
		want := []string{cap(simnode.GIMinor(g0.Minor, 2)), cap(simnode.CIMinor(g0.Minor, 2, 0))}
		sort.Strings(want)
		if got := capNodes(x); !slices.Equal(got, want) {
			t.Errorf("the new 3g.40gb MIG device 0:1: capability nodes %q, want %q", got, want)
		}
	})
}
