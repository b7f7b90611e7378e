package harness

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCRIO runs a private CRI-O: a pod (without an infra container) and two
// containers, a restart with the
// container running (it keeps running and answers exec), and a stop that
// leaves no process, mount or directory behind.
func TestCRIO(t *testing.T) {
	c := StartCRIOForTest(t, CRIOOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cri := c.CRI()
	v, err := cri.Runtime.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CRI: %s %s (API %s)", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	if v.RuntimeName != "cri-o" || "crio-"+v.RuntimeVersion != c.Name() {
		t.Errorf("CRI says %s %s, the harness %s", v.RuntimeName, v.RuntimeVersion, c.Name())
	}

	pod, err := cri.RunPod(ctx, "crio-smoke", nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := cri.Run(ctx, pod, ContainerSpec{Name: "busybox", Image: BusyboxImage})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cri.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING || info.Pid <= 0 || info.Spec == nil {
		t.Fatalf("inspect: state %v pid %d spec %v", info.Status.State, info.Pid, info.Spec != nil)
	}
	if got := strings.Join(info.Spec.Process.Args, " "); got != "sleep 3600" {
		t.Errorf("busybox args %q, want the image default 'sleep 3600'", got)
	}
	gl, err := cri.Run(ctx, pod, ContainerSpec{Name: "glibc", Image: GlibcImage})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, code, err := cri.Exec(ctx, gl, "cat", "/proc/self/status"); err != nil || code != 0 || !strings.Contains(out, "Name:\tcat") {
		t.Fatalf("exec in the glibc container: code %d err %v out %q", code, err, out)
	}

	// A pod with a per-container PID namespace (the harness's, and the
	// kubelet's default) has no infra container on CRI-O: runc runs only
	// the two containers.
	if states, _ := filepath.Glob(filepath.Join(c.RuncRoot, "*", "state.json")); len(states) != 2 {
		t.Errorf("runc runs %d containers, want the 2 of the pod and no infra container: %v", len(states), states)
	}

	oldPID := c.PID()
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if c.PID() == oldPID || c.PID() == 0 {
		t.Errorf("crio pid %d after restart, was %d", c.PID(), oldPID)
	}
	after, err := cri.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if after.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING || after.Pid != info.Pid {
		t.Errorf("after restart: state %v pid %d, want running with pid %d", after.Status.State, after.Pid, info.Pid)
	}
	if out, _, code, err := cri.Exec(ctx, id, "echo", "alive"); err != nil || code != 0 || strings.TrimSpace(out) != "alive" {
		t.Errorf("exec after restart: code %d err %v out %q", code, err, out)
	}

	dir := c.Dir
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	assertClean(t, dir, []int{info.Pid})
}

// TestRuntimeCRIOName: the runtime name the suite selects is the CRI-O the
// harness builds.
func TestRuntimeCRIOName(t *testing.T) {
	if want := "crio-" + strings.TrimPrefix(CRIOVersion, "v"); RuntimeCRIO != want {
		t.Errorf("RuntimeCRIO %q, CRIOVersion %s: want %q", RuntimeCRIO, CRIOVersion, want)
	}
}
