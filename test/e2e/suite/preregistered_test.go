package suite

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestPreRegisteredByDropIn installs nri-gpu as deploy/ lays it out on a
// node, made private: the binary as <dir>/opt/nri/plugins/10-nri-gpu, its
// configuration deploy/nri/10-nri-gpu.conf (roots pointed at the simulated
// node) as <dir>/etc/nri/conf.d/10-nri-gpu.conf, and deploy/containerd's
// 10-nri.toml (its host paths moved under <dir>, nothing else changed)
// imported by a containerd config that turns NRI off. containerd must load
// the drop-in, enable NRI, start the plugin itself and have a GPU pod
// served by it. On containerd 1.7 this is the documented install: NRI is
// off there by default.
func TestPreRegisteredByDropIn(t *testing.T) {
	v := harness.ContainerdVersionOf(runtimeName())
	if v == "" {
		t.Skipf("%s: deploy/containerd's drop-in and containerd's imports are containerd's", runtimeName())
	}
	tools, imgs := harness.SetupForTest(t, v)
	n := newNode(t, simnode.LayoutRHEL, "")
	_, file, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy")

	dir, err := os.MkdirTemp("", "nrie2e-pre-")
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after containerd is stopped: the plugin
	// containerd started is gone then, or killed here.
	t.Cleanup(func() {
		for _, p := range harness.ProcessesUnder(dir) {
			syscall.Kill(p.PID, syscall.SIGKILL)
		}
		os.RemoveAll(dir)
	})
	rewrite := func(src, dst string, pairs ...string) {
		t.Helper()
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		s := string(data)
		for i := 0; i < len(pairs); i += 2 {
			if strings.Count(s, pairs[i]) != 1 {
				t.Fatalf("%s: %q is not there exactly once", src, pairs[i])
			}
			s = strings.Replace(s, pairs[i], pairs[i+1], 1)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	priv := func(p string) string { return filepath.Join(dir, p) }
	dropIn := priv("conf.d/10-nri.toml")
	rewrite(filepath.Join(deploy, "containerd", "10-nri.toml"), dropIn,
		`"/var/run/nri/nri.sock"`, `"`+priv("nri.sock")+`"`,
		`"/opt/nri/plugins"`, `"`+priv("opt/nri/plugins")+`"`,
		`"/etc/nri/conf.d"`, `"`+priv("etc/nri/conf.d")+`"`)
	rewrite(filepath.Join(deploy, "nri", "10-nri-gpu.conf"), priv("etc/nri/conf.d/10-nri-gpu.conf"),
		"hostRoot: /\n", "hostRoot: "+n.Root+"\n",
		"driverRoot: /\n", "driverRoot: "+n.Root+"\n")
	bin, err := os.ReadFile(nriGPU(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(priv("opt/nri/plugins"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(priv("opt/nri/plugins/10-nri-gpu"), bin, 0o755); err != nil {
		t.Fatal(err)
	}

	c := harness.StartForTest(t, harness.ContainerdOptions{
		Tools: tools, Images: imgs,
		DisableNRI:  true, // the main config turns NRI off; the drop-in on
		ExtraConfig: `imports = ["` + dropIn + `"]`,
	})
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: t.Context()}
	var g *ctr
	deadline := time.Now().Add(30 * time.Second)
	for {
		// containerd starts pre-registered plugins with NRI; the first
		// pod may come before the plugin has synchronized.
		g, err = w.run("pre"+itoa(int(time.Now().UnixNano()%1e6)), map[string]string{"gpus.nri-gpu.dev/pod": "device=1"}, harness.ContainerSpec{})
		if err != nil {
			t.Fatal(err)
		}
		if len(gpuNodes(g)) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got, want := gpuNodes(g), "/dev/nvidia"+itoa(n.GPUs[1].Minor); len(got) != 1 || got[0] != want {
		t.Fatalf("GPU nodes %q, want [%s]: the pre-registered nri-gpu did not serve the pod\n%s\n--- containerd log ---\n%s", got, want, g.view(), c.LogTail(6000))
	}
	if got := envOf(g, "NVIDIA_VISIBLE_DEVICES"); got != n.GPUs[1].UUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %s", got, n.GPUs[1].UUID)
	}
	// containerd itself runs it: its parent is containerd.
	procs := harness.ProcessesUnder(priv("opt/nri/plugins"))
	if len(procs) != 1 || procs[0].PPID != c.PID() {
		t.Errorf("processes of the plugin dir %+v, want one, child of containerd (pid %d)", procs, c.PID())
	}
	// The socket for external plugins is the drop-in's, not the main config's.
	if _, err := os.Stat(priv("nri.sock")); err != nil {
		t.Errorf("the drop-in's NRI socket: %v", err)
	}
}
