package simnode

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
)

// TestMPSControl runs the simulated node's nvidia-cuda-mps-control as
// nri-gpu does: -d returns once the daemon serves its control socket and
// has written its PID; a client sends commands on stdin and prints the
// answers; the daemon logs each command and its CUDA_VISIBLE_DEVICES; a
// second -d on the same pipe directory is refused; quit ends it and a
// client then fails.
func TestMPSControl(t *testing.T) {
	n, err := Generate(t.TempDir(), Options{NumGPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	bin := n.HostPath("/usr/bin/nvidia-cuda-mps-control")
	dir, err := os.MkdirTemp("", "mps-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	env := []string{"CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(dir, "pipe"), "CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(dir, "log"), "CUDA_VISIBLE_DEVICES=" + n.GPUs[0].UUID}
	run := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env, cmd.Stdin = env, strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("", "-d"); err != nil {
		t.Fatalf("-d: %v\n%s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "pipe", MPSControlPID))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(data), &pid); err != nil || syscall.Kill(pid, 0) != nil {
		t.Fatalf("PID file %q: %v", data, err)
	}
	defer syscall.Kill(pid, syscall.SIGTERM)
	out, err := run("get_default_active_thread_percentage\nset_default_active_thread_percentage 25\nset_default_device_pinned_mem_limit 0 20389M\nget_default_device_pinned_mem_limit 0\nget_default_active_thread_percentage\nget_server_list\n")
	if want := "100.0\n25.0\n20389M\n25.0\n"; err != nil || out != want {
		t.Errorf("client: %q, %v; want %q", out, err, want)
	}
	if out, err := run("", "-d"); err == nil || !strings.Contains(out, "already running") {
		t.Errorf("a second daemon: %q, %v", out, err)
	}
	if out, err := run("quit\n"); err != nil {
		t.Fatalf("quit: %v %s", err, out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		if state, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")); strings.Contains(string(state), ") Z") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out, err := run("get_server_list\n"); err == nil || !strings.Contains(out, "Cannot find MPS control daemon process") {
		t.Errorf("a client without a daemon: %q, %v", out, err)
	}
	log, err := os.ReadFile(filepath.Join(dir, "log", MPSControlLog))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Starting control daemon using socket " + filepath.Join(dir, "pipe", "control"), "CUDA_VISIBLE_DEVICES=" + n.GPUs[0].UUID,
		"Cmd:set_default_active_thread_percentage 25", "Cmd:set_default_device_pinned_mem_limit 0 20389M", "Cmd:quit"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("control.log lacks %q:\n%s", want, log)
		}
	}
}

// TestSMIComputeMode reads compute modes with the simulated nvidia-smi,
// as deploy/tools/mps-check.sh does, after a set through the simulated
// NVML's file.
func TestSMIComputeMode(t *testing.T) {
	n, err := Generate(t.TempDir(), Options{NumGPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.WriteNVMLState(NVMLState{}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(filepath.Dir(n.HostPath(NVMLStatePath)), ComputeModeFile)
	if err := os.WriteFile(p, []byte(n.GPUs[1].UUID+" 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(n.HostPath("/usr/bin/nvidia-smi"), "--query-gpu=uuid,compute_mode", "--format=csv,noheader")
	cmd.Env = []string{"LD_LIBRARY_PATH=" + n.HostPath(n.LibDir)}
	out, err := cmd.CombinedOutput()
	want := n.GPUs[0].UUID + ", Default\n" + n.GPUs[1].UUID + ", Exclusive_Process\n"
	if err != nil || string(out) != want {
		t.Errorf("nvidia-smi: %q, %v; want %q", out, err, want)
	}
	modes, err := n.ComputeModes()
	if err != nil || len(modes) != 1 || modes[n.GPUs[1].UUID] != ComputeModeExclusiveProcess {
		t.Errorf("ComputeModes = %v, %v", modes, err)
	}
}
