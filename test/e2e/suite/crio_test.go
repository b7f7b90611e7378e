package suite

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestCRIODropIn installs what deploy/ ships for CRI-O into a private CRI-O
// whose crio.conf turns NRI off: deploy/crio/10-nri.conf as a drop-in in
// crio.conf.d (its paths made private), nri-gpu as the pre-registered
// plugin 10-nri-gpu with deploy/nri/10-nri-gpu.conf (hostRoot and
// driverRoot pointed at the simulated node). CRI-O itself starts nri-gpu,
// a GPU pod gets its GPU, and nri-gpu doctor reads NRI as enabled from the
// same files.
func TestCRIODropIn(t *testing.T) {
	if !onCRIO() {
		t.Skipf("runs in the CRI-O run of the suite (NRI_GPU_E2E_RUNTIME=%s)", harness.RuntimeCRIO)
	}
	_, file, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy")
	dropIn, err := os.ReadFile(filepath.Join(deploy, "crio", "10-nri.conf"))
	if err != nil {
		t.Fatal(err)
	}
	pluginConf, err := os.ReadFile(filepath.Join(deploy, "nri", "10-nri-gpu.conf"))
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, simnode.LayoutRHEL, "")
	bin := nriGPU(t)
	c := harness.StartCRIOForTest(t, harness.CRIOOptions{DisableNRI: true, Prepare: func(c *harness.CRIO) error {
		private := strings.NewReplacer(
			`"/var/run/nri/nri.sock"`, strconv.Quote(c.NRISocket),
			`"/opt/nri/plugins"`, strconv.Quote(c.NRIPluginPath),
			`"/etc/nri/conf.d"`, strconv.Quote(c.NRIPluginConfig),
		).Replace(string(dropIn))
		if strings.Count(private, c.Dir) != 3 {
			t.Errorf("deploy/crio/10-nri.conf no longer names CRI-O's three default NRI paths:\n%s", dropIn)
		}
		if err := os.WriteFile(filepath.Join(c.ConfigDir, "10-nri.conf"), []byte(private), 0o644); err != nil {
			return err
		}
		conf := strings.NewReplacer("hostRoot: /\n", "hostRoot: "+n.Root+"\n", "driverRoot: /\n", "driverRoot: "+n.Root+"\n").Replace(string(pluginConf))
		if !strings.Contains(conf, n.Root) {
			t.Errorf("deploy/nri/10-nri-gpu.conf no longer sets hostRoot: / and driverRoot: /:\n%s", pluginConf)
		}
		if err := os.WriteFile(filepath.Join(c.NRIPluginConfig, "10-nri-gpu.conf"), []byte(conf), 0o644); err != nil {
			return err
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(c.NRIPluginPath, "10-nri-gpu"), data, 0o755)
	}})
	if !strings.Contains(c.LogTail(1<<20), "enable_nri = true") {
		t.Errorf("CRI-O does not show NRI enabled by the drop-in")
	}
	started := false
	for _, p := range harness.ProcessesUnder(c.Dir) {
		started = started || p.Cmdline[0] == filepath.Join(c.NRIPluginPath, "10-nri-gpu")
	}
	if !started {
		t.Errorf("CRI-O did not start the pre-registered nri-gpu: %+v", harness.ProcessesUnder(c.Dir))
	}

	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: t.Context()}
	var g *ctr
	for deadline := time.Now().Add(20 * time.Second); ; {
		g = w.mustRun("gpu", map[string]string{"gpus.nri-gpu.dev/pod": "1"}, harness.ContainerSpec{})
		if len(gpuNodes(g)) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := gpuNodes(g); len(got) != 1 {
		t.Errorf("a GPU pod under the pre-registered nri-gpu got GPU nodes %q\n%s", got, g.view())
	}

	out, _ := exec.Command(bin, "doctor", "--crio-config", c.ConfigPath, "--containerd-config", filepath.Join(c.Dir, "none.toml"),
		"--socket", c.NRISocket).CombinedOutput()
	want := "CRI-O: NRI enabled (enable_nri = true) in " + c.ConfigPath + ", " + filepath.Join(c.ConfigDir, "10-nri.conf")
	if !strings.Contains(string(out), want) {
		t.Errorf("doctor disagrees with CRI-O, want %q:\n%s", want, out)
	}
}

// TestCRIOContainerName: CRI-O names a container to NRI only from the CRI
// label io.kubernetes.container.name. With it, the per-container
// annotation applies; without it, a pod with per-container annotations is
// refused with an error naming the annotation and the label, not served
// the pod's request; a pod with only the pod annotation still gets it.
func TestCRIOContainerName(t *testing.T) {
	if !onCRIO() {
		t.Skipf("runs in the CRI-O run of the suite (NRI_GPU_E2E_RUNTIME=%s); containerd always names containers", harness.RuntimeCRIO)
	}
	w := newWorld(t, simnode.LayoutRHEL, "")
	ann := map[string]string{"gpus.nri-gpu.dev/container.train": "1", "gpus.nri-gpu.dev/pod": "2"}
	named := w.mustRun("train", ann, harness.ContainerSpec{})
	if got := gpuNodes(named); len(got) != 1 {
		t.Errorf("labelled container: GPU nodes %q, want the container annotation's 1", got)
	}
	_, err := w.run("train", ann, harness.ContainerSpec{NoNameLabel: true})
	if err == nil || !strings.Contains(err.Error(), "gpus.nri-gpu.dev/container.train") || !strings.Contains(err.Error(), harness.ContainerNameLabel) {
		t.Errorf("unlabelled container in a pod with per-container annotations: %v; want a refusal naming the annotation and the label", err)
	}
	pod := w.mustRun("train", map[string]string{"gpus.nri-gpu.dev/pod": "2"}, harness.ContainerSpec{NoNameLabel: true})
	if got := gpuNodes(pod); len(got) != 2 {
		t.Errorf("unlabelled container with the pod annotation: GPU nodes %q, want 2", got)
	}
}
