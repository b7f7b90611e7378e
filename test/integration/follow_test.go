package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// metricsURL waits for the plugin to log where it serves metrics.
func metricsURL(t *testing.T, p *pluginProc) string {
	t.Helper()
	re := regexp.MustCompile(`on (http://[0-9.:]+)`)
	var m []string
	waitUntil(t, "the metrics listener", func() bool {
		m = re.FindStringSubmatch(p.log.String())
		return m != nil
	})
	return m[1]
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricValue returns the value of the sample named exactly series.
func metricValue(body, series string) string {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v
		}
	}
	return ""
}

// libcuda returns where libcuda.so.1 appears in the container and the
// host file it is, whether the libraries are mounted one by one or as a
// prepared directory (libraryMode).
func libcuda(adj *api.ContainerAdjustment) (dest, src string) {
	for _, m := range adj.GetMounts() {
		if strings.HasSuffix(m.Destination, "/libcuda.so.1") {
			return m.Destination, m.Source
		}
	}
	for _, m := range adj.GetMounts() {
		p := filepath.Join(m.Source, "libcuda.so.1")
		if _, err := os.Stat(p); err == nil {
			return filepath.Join(m.Destination, "libcuda.so.1"), p
		}
	}
	return "", ""
}

// libcudaIs reports whether the container's libcuda.so.1 is the node's
// libcuda of version (the same file, by inode: a prepared directory holds
// hard links).
func libcudaIs(adj *api.ContainerAdjustment, n *simnode.Node, version string) bool {
	_, src := libcuda(adj)
	a, err1 := os.Stat(src)
	b, err2 := os.Stat(n.HostPath(n.LibDir + "/libcuda.so." + version))
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// TestFollowTheNode runs the plugin with metrics on, upgrades the
// simulated node's driver under it, breaks the driver, and changes the
// configuration, checking through the NRI protocol what containers get and
// that the connection to the runtime is never dropped.
func TestFollowTheNode(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	n, cfg := simNode(t, dir, simnode.LayoutRHEL)
	r := startRuntime(t, dir)
	defer r.stop()
	p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--log-level", "debug", "--status-socket", "",
		"--metrics-addr", "127.0.0.1:0")
	url := metricsURL(t, p)
	if code, body := httpGet(t, url+"/readyz"); code != http.StatusServiceUnavailable && code != http.StatusOK {
		t.Errorf("/readyz before sync: %d %q", code, body)
	}
	r.waitSynced(20 * time.Second)
	if code, body := httpGet(t, url+"/readyz"); code != 200 {
		t.Fatalf("/readyz once synchronized: %d %q", code, body)
	}
	if code, _ := httpGet(t, url+"/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}

	ann := map[string]string{"gpus.nri-gpu.dev/container.c": `"device=0,1"`}
	adj, err := r.create(ann, "c")
	if err != nil {
		t.Fatal(err)
	}
	if !libcudaIs(adj, n, n.DriverVersion) {
		_, src := libcuda(adj)
		t.Fatalf("before the upgrade libcuda.so.1 comes from %q", src)
	}

	old := n
	t.Run("driver upgrade", func(t *testing.T) {
		var err error
		if n, err = simnode.Upgrade(old, "590.44.01", simnode.Options{}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "containers to get the new driver", func() bool {
			adj, err := r.create(ann, "c")
			return err == nil && libcudaIs(adj, n, "590.44.01")
		})
		adj, _ := r.create(ann, "c")
		spec := applyToSpec(t, adj)
		for _, m := range spec.Mounts {
			if strings.Contains(m.Source, old.DriverVersion) {
				t.Errorf("mount of the old driver after the upgrade: %+v", m)
			}
			if strings.HasPrefix(m.Source, n.Root) {
				if _, err := os.Stat(m.Source); err != nil {
					t.Errorf("mount source %s: %v", m.Source, err)
				}
			}
		}
		if !strings.Contains(p.log.String(), "from=580.126.09") || !strings.Contains(p.log.String(), "to=590.44.01") {
			t.Errorf("no log line names the upgrade")
		}
	})

	t.Run("broken driver keeps the last good inventory", func(t *testing.T) {
		// The module is reloaded at a new version whose libraries are
		// not installed (yet).
		os.WriteFile(n.HostPath("/proc/driver/nvidia/version"),
			[]byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  600.10.01  Release Build  (dvs-builder@U16)  Thu Nov 20 2025\n"), 0o644)
		waitUntil(t, "the broken driver to be noticed", func() bool {
			return strings.Contains(p.log.String(), "broken driver") && strings.Contains(p.log.String(), "keeping the last good inventory")
		})
		adj, err := r.create(ann, "c")
		if err != nil || !libcudaIs(adj, n, "590.44.01") {
			_, src := libcuda(adj)
			t.Fatalf("with a broken driver: %v, libcuda from %q", err, src)
		}
		os.WriteFile(n.HostPath("/proc/driver/nvidia/version"),
			[]byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.44.01  Release Build  (dvs-builder@U16)  Thu Nov 20 2025\n"), 0o644)
	})

	t.Run("configuration changes", func(t *testing.T) {
		base := fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\n", n.Root, n.Root)
		os.WriteFile(cfg, []byte(base+"libraryDirectory: /opt/nvidia\n"), 0o644)
		waitUntil(t, "the invalid configuration to be rejected", func() bool {
			return strings.Contains(p.log.String(), "invalid configuration rejected")
		})
		adj, err := r.create(ann, "c")
		if dest, _ := libcuda(adj); err != nil || dest != "/usr/local/nvidia/lib64/libcuda.so.1" {
			t.Fatalf("after an invalid configuration: %v, libcuda at %q", err, dest)
		}
		os.WriteFile(cfg, []byte(base+"libraryDir: /opt/nvidia/lib64\n"), 0o644)
		waitUntil(t, "the new configuration to apply", func() bool {
			adj, err := r.create(ann, "c")
			dest, _ := libcuda(adj)
			return err == nil && dest == "/opt/nvidia/lib64/libcuda.so.1"
		})
		// SIGHUP rereads it as well.
		p.cmd.Process.Signal(syscall.SIGHUP)
		waitUntil(t, "SIGHUP", func() bool { return strings.Contains(p.log.String(), "cause=SIGHUP") })
	})

	t.Run("the connection was never dropped", func(t *testing.T) {
		select {
		case <-r.synced:
			t.Error("the plugin synchronized again: its connection was dropped")
		default:
		}
		if strings.Contains(p.log.String(), "reconnecting") {
			t.Error("the plugin reconnected")
		}
		_, body := httpGet(t, url+"/metrics")
		for series, want := range map[string]string{
			"nri_gpu_runtime_connections_total":                                     "1",
			`nri_gpu_driver_info{version="590.44.01"}`:                              "1",
			`nri_gpu_inventory_gpus`:                                                "4",
			`nri_gpu_gpu_injections_total{index="1",uuid="` + n.GPUs[1].UUID + `"}`: "",
		} {
			got := metricValue(body, series)
			if got == "" || want != "" && got != want {
				t.Errorf("%s = %q, want %q", series, got, want)
			}
		}
		for _, series := range []string{
			`nri_gpu_inventory_refreshes_total{result="changed"}`,
			`nri_gpu_inventory_refreshes_total{result="rejected"}`,
			`nri_gpu_requests_total{outcome="injected",source="container-annotation"}`,
			`nri_gpu_request_duration_seconds_count`,
			`nri_gpu_gpu_allocations{index="0",uuid="` + n.GPUs[0].UUID + `"}`,
		} {
			if v := metricValue(body, series); v == "" || v == "0" {
				t.Errorf("%s = %q, want > 0", series, v)
			}
		}
	})
}

// TestRunBadMetricsAddr: a bad --metrics-addr is a usage error (exit 2)
// naming the flag and what is wrong; an address in use stops the plugin.
func TestRunBadMetricsAddr(t *testing.T) {
	dir := shortTempDir(t)
	out, err := exec.Command(binary, "run", "--socket", filepath.Join(dir, "none.sock"), "--status-socket", "", "--metrics-addr", ":http").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), `--metrics-addr: ":http": port "http" must be a number`) {
		t.Errorf("--metrics-addr :http: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	out, err = exec.Command(binary, "run", "--socket", filepath.Join(dir, "none.sock"), "--status-socket", "", "--metrics-addr", l.Addr().String()).CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "address already in use") {
		t.Errorf("--metrics-addr in use: %v\n%s", err, out)
	}
}

// TestProbesThroughIdleClients: the built plugin's metrics listener keeps
// answering /healthz and /readyz, each on a new connection as the
// kubelet's prober asks, within the probe's 1 s timeout while one client
// (another address) holds 300 connections: a third idle after a request,
// a third sending headers a byte every 100 ms, a third silent.
func TestProbesThroughIdleClients(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	_, cfg := simNode(t, dir, simnode.LayoutDebian)
	r := startRuntime(t, dir)
	defer r.stop()
	p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--status-socket", "", "--metrics-addr", "127.0.0.1:0")
	url := metricsURL(t, p)
	r.waitSynced(20 * time.Second)
	addr := strings.TrimPrefix(url, "http://")
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, 1)}}
	for i := range 300 {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		switch i % 3 {
		case 0:
			fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: nri-gpu\r\n\r\n")
		case 1:
			go func() {
				for _, b := range []byte("GET /healthz HTTP/1.1\r\nHost: nri-gpu\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa") {
					if _, err := c.Write([]byte{b}); err != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()
		}
	}
	probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 10 {
		path := []string{"/healthz", "/readyz"}[i%2]
		resp, err := probe.Get(url + path)
		if err != nil {
			t.Fatalf("probe %d, %s, with 300 connections of one client held: %v", i, path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("probe %d, %s: %s", i, path, resp.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
