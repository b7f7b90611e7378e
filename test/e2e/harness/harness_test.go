package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func setup(t *testing.T) (*Tools, *Images) {
	t.Helper()
	tl, im := SetupForTest(t, "")
	return tl, im
}

func startContainerd(t *testing.T, opts ContainerdOptions) *Containerd {
	t.Helper()
	return StartForTest(t, opts)
}

// assertClean checks that nothing of a stopped harness containerd is left.
func assertClean(t *testing.T, dir string, pids []int) {
	t.Helper()
	if left := ProcessesUnder(dir); len(left) > 0 {
		t.Errorf("processes left for %s: %+v", dir, left)
	}
	if m, err := MountsUnder(dir); err != nil || len(m) > 0 {
		t.Errorf("mounts left under %s: %v (err %v)", dir, m, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists (err %v)", dir, err)
	}
	for _, pid := range pids {
		if !processGone(pid) {
			p, _ := readProcess(pid)
			t.Errorf("container process %d still runs: %v", pid, p.Cmdline)
		}
	}
}

func shims(dir string) []int {
	var pids []int
	for _, p := range ProcessesUnder(dir) {
		if len(p.Cmdline) > 0 && strings.HasSuffix(p.Cmdline[0], "containerd-shim-runc-v2") {
			pids = append(pids, p.PID)
		}
	}
	sort.Ints(pids)
	return pids
}

func TestSmoke(t *testing.T) {
	tl, im := setup(t)
	c := startContainerd(t, ContainerdOptions{Tools: tl, Images: im})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cri := c.CRI()

	if v, err := cri.Runtime.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("CRI: %s %s (API %s)", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	}

	pod, err := cri.RunPod(ctx, "smoke", map[string]string{"e2e.nri-gpu/test": "smoke"})
	if err != nil {
		t.Fatal(err)
	}
	bb, err := cri.Run(ctx, pod, ContainerSpec{Name: "busybox", Image: BusyboxImage})
	if err != nil {
		t.Fatal(err)
	}
	out, _, code, err := cri.Exec(ctx, bb, "ls", "/dev")
	if err != nil || code != 0 || !strings.Contains(out, "null") {
		t.Fatalf("ls /dev: code %d err %v out %q", code, err, out)
	}
	out, _, code, err = cri.Exec(ctx, bb, "cat", "/proc/self/status")
	if err != nil || code != 0 || !strings.Contains(out, "Name:\tcat") {
		t.Fatalf("cat /proc/self/status: code %d err %v out %q", code, err, out)
	}
	info, err := cri.Inspect(ctx, bb)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING || info.Pid <= 0 || info.Spec == nil {
		t.Fatalf("inspect: state %v pid %d spec %v", info.Status.State, info.Pid, info.Spec != nil)
	}
	if got := strings.Join(info.Spec.Process.Args, " "); got != "sleep 3600" {
		t.Errorf("busybox args %q, want the image default 'sleep 3600'", got)
	}
	pids := []int{info.Pid}

	// gpucheck without any driver injected: a clean dlopen failure.
	gl, err := cri.Run(ctx, pod, ContainerSpec{Name: "glibc", Image: GlibcImage, DropAllCaps: true, RunAsUser: ptr(int64(65534)), ReadOnlyRootfs: true})
	if err != nil {
		t.Fatal(err)
	}
	out, serr, code, err := cri.Exec(ctx, gl, "/usr/local/bin/gpucheck")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gpucheck (exit %d):\n%s%s", code, out, serr)
	want := "libcuda.so.1: FAIL libcuda.so.1: cannot open shared object file: No such file or directory"
	if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, "libnvidia-ml.so.1: FAIL ") {
		t.Errorf("gpucheck: exit %d, output %q; want exit 1 and %q", code, out, want)
	}
	out, _, code, err = cri.Exec(ctx, gl, "id")
	if err != nil || code != 0 || !strings.Contains(out, "uid=65534") {
		t.Errorf("id in the glibc container: %q code %d err %v", out, code, err)
	}
	if info, err := cri.Inspect(ctx, gl); err == nil {
		pids = append(pids, info.Pid)
	}

	// The image's own LD_LIBRARY_PATH and library work.
	app, err := cri.Run(ctx, pod, ContainerSpec{Name: "app", Image: GlibcAppImage})
	if err != nil {
		t.Fatal(err)
	}
	out, _, code, err = cri.Exec(ctx, app, "gpucheck", "app")
	if err != nil || code != 0 || !strings.Contains(out, "libapp.so.1: ok app_hello=42") {
		t.Errorf("gpucheck app: %q code %d err %v", out, code, err)
	}
	if spec, err := cri.RuntimeSpec(ctx, app); err != nil {
		t.Error(err)
	} else if !contains(spec.Process.Env, "LD_LIBRARY_PATH=/opt/app/lib") {
		t.Errorf("app env %v lacks the image's LD_LIBRARY_PATH", spec.Process.Env)
	}
	if info, err := cri.Inspect(ctx, app); err == nil {
		pids = append(pids, info.Pid)
	}

	// A short-lived container: exit code and log.
	echo, err := cri.Run(ctx, pod, ContainerSpec{Name: "echo", Image: BusyboxImage, Command: []string{"sh", "-c", "echo hello-from-echo; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := cri.WaitExit(ctx, echo, 20*time.Second); err != nil || code != 3 {
		t.Errorf("echo container: exit %d err %v", code, err)
	}
	if log, err := cri.ContainerLog(ctx, echo); err != nil || !strings.Contains(log, "hello-from-echo") {
		t.Errorf("echo log %q err %v", log, err)
	}

	// Timing: create+start+stop+remove rounds.
	var rounds []time.Duration
	for i := 0; i < 10; i++ {
		start := time.Now()
		id, err := cri.Run(ctx, pod, ContainerSpec{Name: fmt.Sprintf("round%d", i), Image: BusyboxImage})
		if err != nil {
			t.Fatal(err)
		}
		created := time.Since(start)
		if err := cri.StopContainer(ctx, id, 0); err != nil {
			t.Fatal(err)
		}
		if err := cri.RemoveContainer(ctx, id); err != nil {
			t.Fatal(err)
		}
		rounds = append(rounds, time.Since(start))
		t.Logf("round %d: create+start %s, create+start+stop+remove %s", i, created.Round(time.Microsecond), rounds[i].Round(time.Microsecond))
	}
	sort.Slice(rounds, func(i, j int) bool { return rounds[i] < rounds[j] })
	t.Logf("create+start+stop+remove median %s", rounds[len(rounds)/2].Round(time.Microsecond))

	list, err := cri.ListContainers(ctx, pod)
	if err != nil || len(list) != 4 {
		t.Errorf("ListContainers: %d containers, err %v", len(list), err)
	}
	if len(shims(c.Dir)) == 0 {
		t.Errorf("no shim found for %s", c.Dir)
	}
	if m, _ := MountsUnder(c.Dir); len(m) == 0 {
		t.Errorf("no mounts under %s while containers run", c.Dir)
	}

	dir := c.Dir
	start := time.Now()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Stop: %s", time.Since(start).Round(time.Millisecond))
	assertClean(t, dir, pids)
}

// runSleeper runs a pod with one busybox container that sleeps, and
// returns the pod, the container and what the runtime says of it.
func runSleeper(t *testing.T, ctx context.Context, cri *CRI, name string) (pod, id string, info *ContainerInfo) {
	t.Helper()
	pod, err := cri.RunPod(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, err = cri.Run(ctx, pod, ContainerSpec{Name: "sleeper", Image: BusyboxImage}); err != nil {
		t.Fatal(err)
	}
	if info, err = cri.Inspect(ctx, id); err != nil {
		t.Fatal(err)
	}
	return pod, id, info
}

func TestRestart(t *testing.T) {
	tl, im := setup(t)
	c := startContainerd(t, ContainerdOptions{Tools: tl, Images: im})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cri := c.CRI()

	pod, id, info := runSleeper(t, ctx, cri, "restart")
	before := shims(c.Dir)
	if len(before) == 0 {
		t.Fatal("no shim before restart")
	}
	oldPID := c.PID()

	start := time.Now()
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("Restart: %s", time.Since(start).Round(time.Millisecond))
	if c.PID() == oldPID || c.PID() == 0 {
		t.Errorf("containerd pid %d after restart, was %d", c.PID(), oldPID)
	}
	if after := shims(c.Dir); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("shims %v after restart, %v before", after, before)
	}
	if processGone(info.Pid) {
		t.Errorf("container process %d died with the restart", info.Pid)
	}
	list, err := cri.ListContainers(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Id != id || list[0].State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("after restart: %v", list)
	}
	out, _, code, err := cri.Exec(ctx, id, "echo", "still-here")
	if err != nil || code != 0 || strings.TrimSpace(out) != "still-here" {
		t.Errorf("exec after restart: %q code %d err %v", out, code, err)
	}
	// And new containers still start.
	id2, err := cri.Run(ctx, pod, ContainerSpec{Name: "after", Image: BusyboxImage})
	if err != nil {
		t.Fatal(err)
	}
	info2, err := cri.Inspect(ctx, id2)
	if err != nil {
		t.Fatal(err)
	}

	dir := c.Dir
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	assertClean(t, dir, []int{info.Pid, info2.Pid})
}

// TestCleanupWithoutCRI kills containerd first and lets CleanupDir find the shims
// and containers by itself, as after a crashed test binary.
func TestCleanupWithoutCRI(t *testing.T) {
	tl, im := setup(t)
	c := startContainerd(t, ContainerdOptions{Tools: tl, Images: im})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cri := c.CRI()
	pod, _, info := runSleeper(t, ctx, cri, "orphan")
	podPid, err := cri.PodPid(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	c.stopDaemon(5 * time.Second) // containerd gone; shims, pause and sleep remain
	if len(shims(c.Dir)) == 0 {
		t.Fatal("no shim left to clean up")
	}
	dir := c.Dir
	if err := CleanupDir(dir, tl.Runc); err != nil {
		t.Fatal(err)
	}
	assertClean(t, dir, []int{info.Pid, podPid})
	// The test's cleanup calls Stop, which finds nothing left to do.
}

// TestDefaultValidator: with the NRI default validator on, a pod that requires a
// plugin that is not connected gets its container rejected.
func TestDefaultValidator(t *testing.T) {
	tl, im := setup(t)
	c := startContainerd(t, ContainerdOptions{Tools: tl, Images: im, DefaultValidator: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := os.Stat(c.NRISocket); err != nil {
		t.Errorf("NRI socket: %v", err)
	}
	cri := c.CRI()
	pod, err := cri.RunPod(ctx, "validated", map[string]string{
		"required-plugins.noderesource.dev/container.ctr": `["nri-gpu"]`,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cri.CreateContainer(ctx, pod, ContainerSpec{Name: "ctr", Image: BusyboxImage})
	if err == nil || !strings.Contains(err.Error(), `required plugin "nri-gpu" not present`) {
		t.Fatalf("CreateContainer: %v; want a rejection by the default validator", err)
	}
	var ce *CRIError
	if !errors.As(err, &ce) || ce.LogTail == "" {
		t.Errorf("error %T carries no containerd log tail", err)
	}
	// Another container of the same pod is not affected.
	if _, err := cri.Run(ctx, pod, ContainerSpec{Name: "other", Image: BusyboxImage}); err != nil {
		t.Fatal(err)
	}
}

// TestRuntimeBinaryWrapper: RuntimeBinary puts a wrapper in place of runc.
func TestRuntimeBinaryWrapper(t *testing.T) {
	tl, im := setup(t)
	wdir := t.TempDir()
	logPath := filepath.Join(wdir, "calls.log")
	wrapper := filepath.Join(wdir, "runc-wrapper")
	script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\nexec %s \"$@\"\n", logPath, tl.Runc)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	c := startContainerd(t, ContainerdOptions{Tools: tl, Images: im, RuntimeBinary: wrapper})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod, err := c.CRI().RunPod(ctx, "wrapped", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CRI().Run(ctx, pod, ContainerSpec{Name: "c", Image: BusyboxImage}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(logPath)
	if err != nil || !strings.Contains(string(b), " create ") || !strings.Contains(string(b), "--root "+c.RuncRoot) {
		t.Errorf("wrapper calls: %q (err %v)", b, err)
	}
}

func TestConfigFeatures(t *testing.T) {
	for _, tc := range []struct {
		v                       string
		socketDir, enableCDIKey bool
	}{
		{"v2.2.9", false, true},
		{"v2.4.2", true, false},
		{"2.4.0", true, false},
	} {
		f := featuresFor(tc.v)
		if f.shimSocketDir != tc.socketDir || f.enableCDIKey != tc.enableCDIKey {
			t.Errorf("%s: %+v", tc.v, f)
		}
	}
	c := &Containerd{Dir: "/tmp/nrie2e-x", Opts: ContainerdOptions{
		Tools:            &Tools{ContainerdVersion: "v2.4.2", Shim: "/s", Runc: "/r"},
		RuntimeBinary:    "/wrapper",
		DefaultValidator: true,
		ExtraConfig:      "[plugins.'io.containerd.nri.v1.nri']\nplugin_request_timeout = '7s'\n[plugins.'io.containerd.cri.v1.runtime']\nenable_selinux = false\n",
	}, features: featuresFor("v2.4.2")}
	b, err := c.config()
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	for _, want := range []string{"restrict_oom_score_adj = true", "BinaryName = '/wrapper'", "plugin_request_timeout = '7s'", "enable = true", "enable_selinux = false", "snapshotter = 'native'"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
}

// TestConfigV2 renders containerd 1.7's config (version 2): CRI in one
// plugin table, NRI on with private paths, no validator; the runtime name
// and RuntimeFromEnv's alias.
func TestConfigV2(t *testing.T) {
	if f := featuresFor(LegacyContainerdVersion); !f.configV2 || f.shimSocketDir {
		t.Errorf("%s: %+v", LegacyContainerdVersion, f)
	}
	c := &Containerd{Dir: "/tmp/nrie2e-x", NRISocket: "/tmp/nrie2e-x/nri.sock", CDISpecDir: "/tmp/nrie2e-x/cdi", Opts: ContainerdOptions{
		Tools: &Tools{ContainerdVersion: LegacyContainerdVersion, Shim: "/s", Runc: "/r"}, RuntimeBinary: "/r", SandboxImage: BusyboxImage,
	}, features: featuresFor(LegacyContainerdVersion)}
	b, err := c.config()
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	for _, want := range []string{"version = 2", "[plugins.'io.containerd.grpc.v1.cri']", "sandbox_image = '" + BusyboxImage + "'", "enable_cdi = true",
		"cdi_spec_dirs = ['/tmp/nrie2e-x/cdi']", "restrict_oom_score_adj = true", "snapshotter = 'native'", "[plugins.'io.containerd.nri.v1.nri']",
		"disable = false", "socket_path = '/tmp/nrie2e-x/nri.sock'"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	if strings.Contains(cfg, "io.containerd.cri.v1") {
		t.Errorf("containerd 2.x tables in a 1.7 config:\n%s", cfg)
	}
	c.Opts.DefaultValidator = true
	if _, err := c.config(); err == nil || !strings.Contains(err.Error(), "no NRI default validator") {
		t.Errorf("a validator on containerd 1.7: %v", err)
	}
	if got := c.Name(); got != RuntimeContainerd17 {
		t.Errorf("Name() = %q", got)
	}
	t.Setenv("NRI_GPU_E2E_RUNTIME", "")
	t.Setenv("NRI_GPU_E2E_CONTAINERD_VERSION", "v2.2.9")
	if got := RuntimeFromEnv(); got != RuntimeContainerd22 {
		t.Errorf("RuntimeFromEnv() with the old variable = %q", got)
	}
	t.Setenv("NRI_GPU_E2E_RUNTIME", RuntimeContainerd17)
	if got, v := RuntimeFromEnv(), VersionFromEnv(); got != RuntimeContainerd17 || v != LegacyContainerdVersion {
		t.Errorf("RuntimeFromEnv() = %q, VersionFromEnv() = %q", got, v)
	}
}

func ptr[T any](v T) *T { return &v }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
