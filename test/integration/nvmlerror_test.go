package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// nodeView is what a MIG node offers, as seen from outside the plugin:
// its allocation table's units (from nri-gpu status), the unhealthy ones,
// its /dev/char links, and what two requests that must not be served on a
// MIG node get over NRI.
type nodeView struct {
	Whole, MIG int
	// Unhealthy are the units marked unhealthy, by name.
	Unhealthy []string
	Links     int
	// Device0 is whether device=0 (a GPU with MIG enabled) was served;
	// Count2 whether a count of 2 whole GPUs was.
	Device0, Count2 bool
}

// viewNode reads nodeView of the plugin on socket (its status socket).
func viewNode(t *testing.T, r *runtimeSide, n *simnode.Node, socket string) nodeView {
	t.Helper()
	out, code := statusCmd(t, socket, "-o", "json")
	var s status.Status
	if err := json.Unmarshal([]byte(out), &s); code != 0 || err != nil {
		t.Fatalf("nri-gpu status -o json: exit %d, %v\n%s", code, err, out)
	}
	var v nodeView
	for _, g := range s.GPUs {
		if inventory.IsMIGKey(g.Index) {
			v.MIG++
		} else {
			v.Whole++
		}
		if g.Unhealthy != "" {
			v.Unhealthy = append(v.Unhealthy, g.Name)
		}
	}
	links, _ := os.ReadDir(n.HostPath("/dev/char"))
	v.Links = len(links)
	served := func(name, value string) bool {
		adj, err := r.run(map[string]string{"gpus.nri-gpu.dev/container." + name: value}, name)
		if err == nil {
			r.stopCtr(name)
			r.removePod(name)
		}
		return err == nil && len(adj.GetLinux().GetDevices()) > 0
	}
	v.Device0 = served("device0", "device=0")
	v.Count2 = served("count2", "2")
	return v
}

// refreshes sums nri_gpu_inventory_refreshes_total over its results.
func refreshes(t *testing.T, url string) int {
	t.Helper()
	_, body := httpGet(t, url+"/metrics")
	sum := 0
	for _, l := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(l, "nri_gpu_inventory_refreshes_total{"); ok {
			_, v, _ := strings.Cut(rest, "} ")
			n, _ := strconv.Atoi(v)
			sum += n
		}
	}
	return sum
}

// afterRefreshes waits until the plugin has rediscovered the node twice
// more (the first may have started before the change).
func afterRefreshes(t *testing.T, url string) {
	t.Helper()
	from := refreshes(t, url)
	waitUntil(t, "two rediscoveries", func() bool { return refreshes(t, url) >= from+2 })
}

// TestNVMLErrorKeepsMIG: on a node with MIG on two GPUs of three (11 MIG
// devices, 1 whole GPU), an NVML answer worse than the last good one (an
// enumeration that fails, then one GPU that NVML cannot query) hands out
// nothing more than before, through the NRI protocol: no MIG-enabled GPU
// becomes whole (device=0 and a count of 2 stay refused), the last MIG
// layout stays, no /dev/char link goes; the erring GPU is unhealthy (status,
// metric, log naming the GPU and NVML's error) until NVML answers again.
func TestNVMLErrorKeepsMIG(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	n, cfg := simNodeN(t, dir, 3, "")
	if err := n.SetMIG(simnode.MixedMIG()); err != nil {
		t.Fatal(err)
	}
	r := startRuntime(t, dir)
	defer r.stop()
	socket := filepath.Join(dir, "status.sock")
	p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--status-socket", socket,
		"--metrics-addr", "127.0.0.1:0", "--watch-interval", "100ms")
	url := metricsURL(t, p)
	r.waitSynced(20 * time.Second)

	good := viewNode(t, r, n, socket)
	want := nodeView{Whole: 1, MIG: 11, Links: good.Links}
	if d := cmp.Diff(want, good); d != "" || good.Links < 30 {
		t.Fatalf("the MIG node before any NVML error (-want +got), %d links:\n%s", good.Links, d)
	}

	// NVML's enumeration fails as a whole.
	failed := simnode.MixedMIG()
	failed.CountError = simnode.NVMLErrorUnknown
	if err := n.WriteNVMLState(failed); err != nil {
		t.Fatal(err)
	}
	afterRefreshes(t, url)
	got := viewNode(t, r, n, socket)
	t.Logf("after a failed enumeration: %+v (before: %+v)", got, good)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("after a failed enumeration (-before +after):\n%s", d)
	}
	if !strings.Contains(p.log.String(), "Unknown Error") {
		t.Errorf("the log does not say NVML's error:\n%s", p.log.String())
	}

	// NVML answers again, but cannot query GPU 0.
	erring := simnode.MixedMIG()
	erring.GPUs[0].Error = simnode.NVMLErrorUnknown
	if err := n.WriteNVMLState(erring); err != nil {
		t.Fatal(err)
	}
	afterRefreshes(t, url)
	got = viewNode(t, r, n, socket)
	t.Logf("with GPU 0 erring: %+v", got)
	bad := want
	bad.Unhealthy = []string{"0:0", "0:1", "0:2", "0:3", "0:4", "0:5", "0:6"}
	if d := cmp.Diff(bad, got); d != "" {
		t.Errorf("with GPU 0 erring (-want +got):\n%s", d)
	}
	_, body := httpGet(t, url+"/metrics")
	g0 := n.GPUs[0].UUID
	if !strings.Contains(body, fmt.Sprintf(`nri_gpu_device_unhealthy{reason="NVML: nvmlDeviceGetUUID: Unknown Error (999)",uuid="%s"} 1`, g0)) {
		t.Errorf("no nri_gpu_device_unhealthy for GPU 0:\n%s", grepLines(body, "nri_gpu_device_unhealthy"))
	}
	if log := p.log.String(); !strings.Contains(log, "GPU 0 ("+g0+")") || !strings.Contains(log, "Unknown Error") {
		t.Errorf("the log does not name GPU 0 and NVML's error:\n%s", log)
	}

	// NVML answers for every GPU again: healthy, as before.
	if err := n.WriteNVMLState(simnode.MixedMIG()); err != nil {
		t.Fatal(err)
	}
	afterRefreshes(t, url)
	if got := viewNode(t, r, n, socket); !cmp.Equal(want, got) {
		t.Errorf("NVML answering again: %+v, want %+v", got, want)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestPreRegisteredSlowNVML: a pre-registered plugin gets its
// configuration in Configure, which the runtime bounds (2 s); an
// nvmlInit_v2 that takes 4 s does not make it miss that deadline: the
// plugin registers, serves whole GPUs until NVML answers (but not GPU 0,
// whose GPU instances the driver shows), then the node's MIG devices,
// without a restart.
func TestPreRegisteredSlowNVML(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	n, cfg := simNodeN(t, dir, 3, "")
	st := simnode.MixedMIG()
	st.InitDelay = 4 * time.Second
	if err := n.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"plugins", "conf.d"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins", "10-nri-gpu"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	conf, _ := os.ReadFile(cfg)
	if err := os.WriteFile(filepath.Join(dir, "conf.d", "10-nri-gpu.conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := startRuntime(t, dir)
	defer r.stop()
	registered := time.Since(start)
	adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/container.c": "device=2"}, "c")
	t.Logf("the runtime started its plugins in %s, with nvmlInit_v2 taking %s", registered.Round(time.Millisecond), st.InitDelay)
	if err != nil || len(adj.GetLinux().GetDevices()) == 0 {
		t.Fatalf("the pre-registered plugin does not serve (did it miss the runtime's deadline?): %v %v", adj, err)
	}
	// GPU 0 has MIG enabled. NVML has not answered yet, but the driver
	// shows its GPU instances: it is not handed out whole, neither now
	// nor once NVML answers.
	if adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/container.w": "device=0"}, "w"); err == nil {
		t.Errorf("GPU 0, in MIG mode, was handed out whole while NVML was busy: %v", adj.GetLinux().GetDevices())
	}
	waitUntil(t, "MIG device 0:0 once NVML answered", func() bool {
		adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/container.m": "device=0:0"}, "m")
		return err == nil && len(adj.GetLinux().GetDevices()) > 0
	})
	t.Logf("MIG devices served %s after the runtime started", time.Since(start).Round(time.Millisecond))
}
