package suite

import (
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestOperations runs nri-gpu with its metrics listener under a real
// containerd with NRI's default validator: nri-gpu doctor passes every
// check against containerd's own config and socket; a driver upgrade is
// followed without any signal (containers started after it get the new
// driver, running ones keep theirs); the connection to containerd is
// never dropped.
func TestOperations(t *testing.T) {
	// containerd 1.7's NRI (v0.8.0) and CRI-O 1.34's (a v0.9 pre-release)
	// have no validator: the required-plugins annotation below is ignored,
	// the rest runs the same. On CRI-O doctor reads CRI-O's config.
	validator := !isContainerd1() && !onCRIO()
	c := startRuntime(t, harness.RuntimeOptions{DefaultValidator: validator})
	n := newNode(t, simnode.LayoutRHEL, "")
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: t.Context()}
	w.plugin = startPlugin(t, c, n, "--metrics-addr", "127.0.0.1:0")
	m := regexp.MustCompile(`on (http://[0-9.:]+)`).FindStringSubmatch(w.plugin.log.String())
	if m == nil {
		t.Fatalf("no metrics listener in the log:\n%s", w.plugin.log.String())
	}
	url := m[1]

	t.Run("doctor", func(t *testing.T) {
		args := []string{"doctor", "--config", n.config, "--socket", c.NRISocketPath(), "--cdi-dirs", c.CDIDir(), "--health-url", url}
		switch rt := c.(type) {
		case *harness.Containerd:
			args = append(args, "--containerd-config", rt.ConfigPath)
		case *harness.CRIO:
			args = append(args, "--crio-config", rt.ConfigPath, "--containerd-config", filepath.Join(rt.Dir, "none.toml"))
		default:
			t.Skipf("doctor's runtime-config check reads containerd's or CRI-O's config; %s has neither", c.Name())
		}
		out, err := exec.Command(nriGPU(t), args...).CombinedOutput()
		t.Logf("nri-gpu doctor:\n%s", out)
		want := 12
		if !validator {
			want = 11 // "required plugins" is not a PASS without a validator
		}
		if err != nil || strings.Count(string(out), "PASS") != want {
			t.Errorf("doctor against %s: %v (want %d PASS)", c.Name(), err, want)
		}
	})

	t.Run("driver upgrade without a signal", func(t *testing.T) {
		ann := map[string]string{"gpus.nri-gpu.dev/pod": "1", "required-plugins.noderesource.dev/pod": `["nri-gpu"]`}
		before := w.mustRun("before", ann, harness.ContainerSpec{Image: harness.GlibcImage})
		if _, err := simnode.Upgrade(n.Node, "590.44.01", simnode.Options{DeviceNodes: true}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(w.plugin.log.String(), "to=590.44.01") {
			if time.Now().After(deadline) {
				t.Fatalf("the upgrade was not followed:\n%s", w.plugin.log.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		after := w.mustRun("after", ann, harness.ContainerSpec{Image: harness.GlibcImage})
		if out, code := after.sh("gpucheck nvml"); code != 0 || !strings.Contains(out, "driver=590.44.01") {
			t.Errorf("new container: %q\n%s", out, after.view())
		}
		if out, code := before.sh("gpucheck nvml"); code != 0 || !strings.Contains(out, "driver=580.126.09") {
			t.Errorf("running container lost its driver: %q\n%s", out, before.view())
		}
	})

	t.Run("one connection throughout", func(t *testing.T) {
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, want := range []string{
			"nri_gpu_runtime_connections_total 1\n",
			`nri_gpu_driver_info{version="590.44.01"} 1`,
			`nri_gpu_inventory_refreshes_total{result="changed"}`,
		} {
			if !strings.Contains(string(body), want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		if strings.Contains(w.plugin.log.String(), "reconnecting") {
			t.Error("the plugin reconnected")
		}
	})
}
