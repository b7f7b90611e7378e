package suite

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// unitHealth returns, by unit label ("2", "0:1"), why `nri-gpu status`
// says each unhealthy unit is unhealthy.
func unitHealth(t *testing.T, socket string) map[string]string {
	t.Helper()
	out, err := exec.Command(nriGPU(t), "status", "--status-socket", socket, "-o", "json").CombinedOutput()
	var s struct {
		GPUs []alloc.GPUState `json:"gpus"`
	}
	if err != nil || json.Unmarshal(out, &s) != nil {
		t.Fatalf("nri-gpu status: %v\n%s", err, out)
	}
	bad := map[string]string{}
	for _, g := range s.GPUs {
		if g.Unhealthy != "" {
			bad[inventory.UnitLabel(g.Index)] = g.Unhealthy
		}
	}
	return bad
}

// TestMIGHealth: on the suite's runtime, with the simulated NVML, a
// critical XID of a whole GPU (2) and one of a MIG instance (0:1, GPU
// instance 8) make them Unhealthy in nri-gpu's device plugin (its
// ListAndWatch, read on its socket as the kubelet does; migStrategy
// single advertises the MIG devices) and in nri-gpu status, leave the
// siblings healthy, and make count requests skip GPU 2: the first gets
// GPU 3, the second is refused naming GPU 2 unhealthy. A simulated reset
// (NVML reports GPU 2 lost, then usable) brings it back in all three; the
// MIG device, whose GPU was not reset, stays Unhealthy.
func TestMIGHealth(t *testing.T) {
	c := startRuntime(t, harness.RuntimeOptions{})
	dir, err := os.MkdirTemp("", "nri-gpu-e2e-xid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	dpDir := filepath.Join(dir, "dp")
	if err := os.Mkdir(dpDir, 0o755); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, simnode.LayoutRHEL, fmt.Sprintf("sharing: exclusive\ndevicePlugin:\n  enabled: true\n  socketDir: %s\n  migStrategy: single\n", dpDir))
	st := simnode.MixedMIG()
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "status.sock")
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: t.Context()}
	w.plugin = startPlugin(t, c, n, "--watch-interval", "200ms", "--status-socket", socket)
	waitFor(t, 30*time.Second, "nri-gpu listening for XID events", func() (bool, string) {
		return strings.Contains(w.plugin.log.String(), "listening for XID events"), w.plugin.log.String()
	})
	g0, g2, g3 := n.GPUs[0], n.GPUs[2], n.GPUs[3]
	mig01, mig02 := simnode.MIGUUIDFor(g0.UUID, 8, 0), simnode.MIGUUIDFor(g0.UUID, 9, 0)
	health := watchHealth(t, filepath.Join(dpDir, "nri-gpu-nvidia.com-gpu.sock"))
	for _, id := range []string{g2.UUID, g3.UUID, mig01, mig02} {
		health.wait(t, id, pluginapi.Healthy)
	}

	// XID 79 (fallen off the bus) on GPU 2, XID 94 on GPU 0's GPU
	// instance 8 (MIG device 0:1).
	st.Events = []simnode.XID{{GPU: 2, XID: 79, GI: -1, CI: -1}, {GPU: 0, XID: 94, GI: 8, CI: 0}}
	if err := n.WriteNVMLState(st); err != nil {
		t.Fatal(err)
	}
	health.wait(t, g2.UUID, pluginapi.Unhealthy)
	health.wait(t, mig01, pluginapi.Unhealthy)
	health.wait(t, g3.UUID, pluginapi.Healthy)
	health.wait(t, mig02, pluginapi.Healthy)
	if bad := unitHealth(t, socket); bad["2"] != "XID 79" || !strings.HasPrefix(bad["0:1"], "XID 94") || len(bad) != 2 {
		t.Errorf("nri-gpu status: unhealthy %v, want 2 (XID 79) and 0:1 (XID 94)", bad)
	}

	// A count skips GPU 2: GPU 3, then nothing.
	a := w.mustRun("count-a", map[string]string{"gpus.nri-gpu.dev/container.count-a": "count=1"}, harness.ContainerSpec{})
	if got, want := gpuNodes(a), []string{fmt.Sprintf("/dev/nvidia%d", g3.Minor)}; !slices.Equal(got, want) {
		t.Errorf("count-a: GPU nodes %q, want GPU 3's %q (GPU 2 is unhealthy)", got, want)
	}
	_, err = w.run("count-b", map[string]string{"gpus.nri-gpu.dev/container.count-b": "count=1"}, harness.ContainerSpec{})
	if err == nil || !strings.Contains(err.Error(), "exclusive request for 1 GPU cannot be met") || !strings.Contains(err.Error(), "unhealthy: GPU 2: XID 79") {
		t.Errorf("count-b while GPU 2 is unhealthy: %v", err)
	}

	// Reset GPU 2: NVML reports it lost, then usable again.
	st.GPUs = append(st.GPUs, simnode.NVMLGPU{Lost: true})
	if err := n.WriteNVMLState(st); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "GPU 2 lost", func() (bool, string) {
		bad := unitHealth(t, socket)
		return strings.Contains(bad["2"], "lost"), fmt.Sprint(bad)
	})
	st.GPUs[2] = simnode.NVMLGPU{}
	if err := n.WriteNVMLState(st); err != nil {
		t.Fatal(err)
	}
	health.wait(t, g2.UUID, pluginapi.Healthy)
	if bad := unitHealth(t, socket); bad["2"] != "" || bad["0:1"] == "" {
		t.Errorf("after GPU 2's reset: unhealthy %v, want only 0:1", bad)
	}
	health.wait(t, mig01, pluginapi.Unhealthy)
	if !strings.Contains(w.plugin.log.String(), "healthy again") {
		t.Errorf("no log line of GPU 2's recovery")
	}
	b := w.mustRun("count-b", map[string]string{"gpus.nri-gpu.dev/container.count-b": "count=1"}, harness.ContainerSpec{})
	if got, want := gpuNodes(b), []string{fmt.Sprintf("/dev/nvidia%d", g2.Minor)}; !slices.Equal(got, want) {
		t.Errorf("count-b after the reset: GPU nodes %q, want GPU 2's %q", got, want)
	}
}
