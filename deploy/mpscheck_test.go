package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestMPSCheckScript runs tools/mps-check.sh against a simulated node whose
// two GPUs the built nri-gpu mps shares with MPS (the simulated node's
// nvidia-smi, nvidia-cuda-mps-control and NVML): OK once both daemons are
// ready; then one line for a GPU whose compute mode went back to Default
// and one for a daemon whose default thread percentage someone changed.
func TestMPSCheckScript(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: nri-gpu finds GPUs through /dev/nvidia* character devices, and the simulated NVML sets compute modes only as root: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 2, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "nri-gpu")
	build := exec.Command("go", "build", "-o", bin, "./cmd/nri-gpu")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building nri-gpu: %v\n%s", err, out)
	}
	root, err := os.MkdirTemp("", "mps-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	data := fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\ndevicePlugin:\n  enabled: true\n  mpsRoot: %s\n  sharing:\n    mps:\n      resources: [{name: nvidia.com/gpu, replicas: 4}]\n", n.Root, n.Root, root)
	if err := os.WriteFile(cfg, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	mps := exec.Command(bin, "mps", "--config", cfg)
	var log strings.Builder
	mps.Stdout, mps.Stderr = &log, &log
	if err := mps.Start(); err != nil {
		t.Fatal(err)
	}
	pipe := func(g int) string { return filepath.Join(root, n.GPUs[g].UUID, "pipe") }
	defer func() {
		mps.Process.Kill()
		mps.Wait()
		for g := range n.GPUs {
			if data, err := os.ReadFile(filepath.Join(pipe(g), simnode.MPSControlPID)); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
					syscall.Kill(pid, syscall.SIGTERM)
				}
			}
		}
		if t.Failed() {
			t.Logf("nri-gpu mps:\n%s", log.String())
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, e0 := os.Stat(filepath.Join(root, n.GPUs[0].UUID, "ready"))
		_, e1 := os.Stat(filepath.Join(root, n.GPUs[1].UUID, "ready"))
		if e0 == nil && e1 == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemons did not come up")
		}
	}
	control := n.HostPath("/usr/bin/nvidia-cuda-mps-control")
	run := func() (string, error) {
		cmd := exec.Command("sh", "tools/mps-check.sh", "--mps-root", root)
		cmd.Env = append(os.Environ(), "NVIDIA_SMI="+n.HostPath("/usr/bin/nvidia-smi"), "MPS_CONTROL="+control, "LD_LIBRARY_PATH="+n.HostPath(n.LibDir))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run(); err != nil || !strings.HasPrefix(out, "OK: 2 MPS GPUs") {
		t.Fatalf("a node as nri-gpu mps set it up: %v\n%s", err, out)
	}

	modes := filepath.Join(filepath.Dir(n.HostPath(simnode.NVMLStatePath)), simnode.ComputeModeFile)
	if err := os.WriteFile(modes, []byte(n.GPUs[0].UUID+" 3\n"+n.GPUs[1].UUID+" 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	set := exec.Command(control)
	set.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipe(0)}
	set.Stdin = strings.NewReader("set_default_active_thread_percentage 100\n")
	if out, err := set.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := run()
	for _, want := range []string{n.GPUs[1].UUID + ": compute mode Default, want Exclusive_Process", n.GPUs[0].UUID + ": default active thread percentage 100, the ready file says 25"} {
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("after the changes: %v, want %q in\n%s", err, want, out)
		}
	}
}
