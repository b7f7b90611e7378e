package mps_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/mps"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// modes is an NVML stand-in for compute modes: each GPU's mode, and an
// error to fail sets with.
type modes struct {
	mu   sync.Mutex
	m    map[string]nvml.ComputeMode
	fail error
	sets int
}

func (f *modes) ComputeMode(uuid string) (nvml.ComputeMode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[uuid], nil
}

func (f *modes) SetComputeMode(uuid string, m nvml.ComputeMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.sets++
	f.m[uuid] = m
	return nil
}

func (f *modes) get(uuid string) nvml.ComputeMode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[uuid]
}

// fixture is a simulated node's driver and the MPS daemons of a plan of
// its GPUs, under a short MPS root (the daemons' control sockets must fit
// in a unix socket address).
type fixture struct {
	node    *simnode.Node
	plan    *sharing.Plan
	daemons map[string]*sharing.MPSDaemon
	modes   *modes
	opts    mps.Options
	log     *logrus.Logger
}

func newFixture(t *testing.T, gpus, replicas int) *fixture {
	t.Helper()
	if e := os.Getenv("NRI_GPU_TEST_EMULATED"); e != "" {
		t.Skipf("under %s (make test-arm64): the supervisor knows its daemon by the program name in /proc/<pid>/cmdline, which for an emulated daemon is the emulator's", e)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: gpus})
	if err != nil {
		t.Fatal(err)
	}
	root, err := os.MkdirTemp("", "mps-")
	if err != nil {
		t.Fatal(err)
	}
	c := config.Default().DevicePlugin
	c.Enabled, c.MPSRoot = true, root
	c.Sharing.MPS = &config.ReplicatedResources{FailRequestsGreaterThanOne: new(bool), Resources: []config.ReplicatedResource{{Name: c.ResourceName, Replicas: replicas, Devices: config.ReplicatedDevices{All: true}}}}
	var units []inventory.GPU
	for _, g := range n.GPUs {
		units = append(units, inventory.GPU{Index: g.Index, UUID: g.UUID, MemoryMiB: 81559, NUMANode: -1})
	}
	f := &fixture{node: n, plan: sharing.NewPlan(c.SharingSpec(), units), modes: &modes{m: map[string]nvml.ComputeMode{}}, log: logrus.New()}
	f.log.SetOutput(io.Discard)
	if os.Getenv("MPS_LOG") != "" {
		f.log.SetOutput(os.Stderr)
	}
	f.daemons = f.plan.MPSDaemons()
	f.opts = mps.Options{Binary: n.HostPath("/usr/bin/nvidia-cuda-mps-control"), LibraryDirs: []string{n.HostPath(n.LibDir)},
		ComputeModes: f.modes, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Heartbeat: 20 * time.Millisecond, CheckEvery: 5}
	t.Cleanup(func() {
		for _, d := range f.daemons {
			if pid := f.pid(d); pid > 0 {
				syscall.Kill(pid, syscall.SIGTERM)
			}
		}
		os.RemoveAll(root)
	})
	return f
}

// run supervises the fixture's daemons until the returned stop is called.
func (f *fixture) run(o mps.Options) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		mps.NewSupervisor(o, f.log).Run(ctx, f.daemons)
	}()
	return func() { cancel(); <-done }
}

// pid returns the PID in d's PID file, 0 without one.
func (f *fixture) pid(d *sharing.MPSDaemon) int {
	data, err := os.ReadFile(filepath.Join(d.PipeDir, simnode.MPSControlPID))
	if err != nil {
		return 0
	}
	var pid int
	fmt.Sscan(string(data), &pid)
	return pid
}

// log returns d's control.log.
func controlLog(t *testing.T, d *sharing.MPSDaemon) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(d.LogDir, simnode.MPSControlLog))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// ready returns whether Probe says every daemon is ready at now.
func (f *fixture) ready(now time.Time) map[string]sharing.MPSStatus {
	return mps.Probe(f.daemons, now)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func allReady(st map[string]sharing.MPSStatus) bool {
	for _, s := range st {
		if !s.Ready {
			return false
		}
	}
	return len(st) > 0
}

// TestSupervisor runs the stand-in MPS control daemon of two GPUs through
// its life: started with the GPU's CUDA_VISIBLE_DEVICES and its own pipe
// and log directories, the GPU in Exclusive_Process, the limits of one of
// four replicas set by control commands, ready; killed, then not ready
// and started again; the supervisor stopped, the daemon still running and
// its ready file going stale; a new supervisor adopting it (no second
// daemon) and keeping it ready.
func TestSupervisor(t *testing.T) {
	f := newFixture(t, 2, 4)
	stop := f.run(f.opts)
	waitFor(t, "both daemons ready", func() bool { return allReady(f.ready(time.Now())) })
	for uuid, d := range f.daemons {
		if m := f.modes.get(uuid); m != nvml.ComputeModeExclusiveProcess {
			t.Errorf("GPU %s in compute mode %s", uuid, m)
		}
		log := controlLog(t, d)
		for _, want := range []string{"CUDA_VISIBLE_DEVICES=" + uuid, "Starting control daemon using socket " + filepath.Join(d.PipeDir, "control"),
			"Cmd:set_default_active_thread_percentage 25", "Cmd:set_default_device_pinned_mem_limit 0 20389M", "Cmd:get_server_list"} {
			if !strings.Contains(log, want) {
				t.Errorf("GPU %s: control.log lacks %q:\n%s", uuid, want, log)
			}
		}
		if fi, err := os.Stat(d.ShmDir); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
			t.Errorf("shm directory %s: %v, %v", d.ShmDir, fi.Mode(), err)
		}
	}

	// The daemon dies: not ready, then started again.
	var uuid string
	for uuid = range f.daemons {
		break
	}
	d := f.daemons[uuid]
	first := f.pid(d)
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the killed daemon to be reported not ready", func() bool { return !f.ready(time.Now())[uuid].Ready })
	if why := f.ready(time.Now())[uuid].Why; !strings.Contains(why, "no running MPS control daemon") {
		t.Errorf("not ready because %q", why)
	}
	waitFor(t, "the daemon started again", func() bool { return f.ready(time.Now())[uuid].Ready && f.pid(d) != first })
	if n := strings.Count(controlLog(t, d), "Starting control daemon"); n != 2 {
		t.Errorf("%d daemon starts, want 2", n)
	}

	// The supervisor stops: the daemon runs on; its ready file goes stale.
	second := f.pid(d)
	stop()
	if syscall.Kill(second, 0) != nil {
		t.Fatal("stopping the supervisor stopped the daemon")
	}
	if why := f.ready(time.Now().Add(2 * mps.StaleAfter))[uuid].Why; !strings.Contains(why, "is nri-gpu mps running?") {
		t.Errorf("a ready file untouched for %s: %q", 2*mps.StaleAfter, why)
	}

	// A new supervisor adopts the running daemon.
	stop = f.run(f.opts)
	defer stop()
	// (Its ready file is fresh for StaleAfter after the stop: wait for
	// the adoption's commands.)
	waitFor(t, "the adoption to set the limits", func() bool {
		return strings.Count(controlLog(t, d), "Cmd:set_default_active_thread_percentage 25") == 3
	})
	waitFor(t, "the daemons ready again", func() bool { return allReady(f.ready(time.Now())) })
	if pid := f.pid(d); pid != second {
		t.Errorf("after the restart the daemon is %d, not %d", pid, second)
	}
	log := controlLog(t, d)
	if n := strings.Count(log, "Starting control daemon"); n != 2 {
		t.Errorf("%d daemon starts after an adoption, want 2:\n%s", n, log)
	}
	time.Sleep(10 * f.opts.Heartbeat)
	if !allReady(f.ready(time.Now())) {
		t.Errorf("not ready while supervised: %v", f.ready(time.Now()))
	}
}

// TestSupervisorNotReady: without NVML, or when the compute mode cannot
// be set, the daemon is not started and Probe says why it is not ready;
// a plan asking for other limits than the daemon's is not ready either.
func TestSupervisorNotReady(t *testing.T) {
	f := newFixture(t, 1, 2)
	f.modes.fail = &nvml.Error{Func: "nvmlDeviceSetComputeMode", Code: nvml.ErrNoPermission, Text: "Insufficient Permissions"}
	o := f.opts
	stop := f.run(o)
	uuid := f.node.GPUs[0].UUID
	d := f.daemons[uuid]
	time.Sleep(5 * o.MinBackoff)
	stop()
	if pid := f.pid(d); pid != 0 {
		t.Errorf("a daemon %d started on a GPU not in Exclusive_Process", pid)
	}
	if st := f.ready(time.Now())[uuid]; st.Ready || !strings.Contains(st.Why, "no running MPS control daemon") {
		t.Errorf("status %+v", st)
	}

	f.modes.fail = nil
	stop = f.run(o)
	waitFor(t, "the daemon ready", func() bool { return f.ready(time.Now())[uuid].Ready })
	stop()
	other := *d
	other.ActiveThreadPercentage, other.PinnedMemoryMiB = 50, 1000
	st := mps.Probe(map[string]*sharing.MPSDaemon{uuid: &other}, time.Now())[uuid]
	want := sharing.MPSStatus{Why: "the MPS control daemon of GPU " + uuid + " holds clients to 50% of the threads and 40779 MiB, the configuration asks for 50% of the threads and 1000 MiB: restart nri-gpu mps to apply it"}
	if d := cmp.Diff(want, st); d != "" {
		t.Errorf("other limits (-want +got):\n%s", d)
	}

	o.ComputeModes = nil
	if err := os.Remove(filepath.Join(mps.DaemonDir(d), mps.ReadyFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	syscall.Kill(f.pid(d), syscall.SIGTERM)
	stop = f.run(o)
	time.Sleep(5 * o.MinBackoff)
	stop()
	if st := f.ready(time.Now())[uuid]; st.Ready {
		t.Errorf("ready without NVML: %+v", st)
	}
}

// TestSupervisorRepairs: a ready daemon whose GPU left Exclusive_Process
// (a GPU reset) has it set again, and one whose default limits someone
// changed through its control pipe gets them back, both found by the
// supervisor's periodic check, without a second daemon.
func TestSupervisorRepairs(t *testing.T) {
	f := newFixture(t, 1, 4)
	uuid := f.node.GPUs[0].UUID
	d := f.daemons[uuid]
	stop := f.run(f.opts)
	defer stop()
	waitFor(t, "the daemon ready", func() bool { return f.ready(time.Now())[uuid].Ready })
	pid := f.pid(d)

	f.modes.mu.Lock()
	f.modes.m[uuid] = nvml.ComputeModeDefault
	f.modes.mu.Unlock()
	waitFor(t, "the compute mode set again", func() bool { return f.modes.get(uuid) == nvml.ComputeModeExclusiveProcess })

	cmd := exec.Command(f.opts.Binary)
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=" + d.PipeDir}
	cmd.Stdin = strings.NewReader("set_default_active_thread_percentage 100\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitFor(t, "the limits set again", func() bool {
		return strings.Count(controlLog(t, d), "Cmd:set_default_active_thread_percentage 25") == 2
	})
	waitFor(t, "the daemon ready again", func() bool { return f.ready(time.Now())[uuid].Ready })
	if got := f.pid(d); got != pid || strings.Count(controlLog(t, d), "Starting control daemon") != 1 {
		t.Errorf("the daemon %d was replaced by %d", pid, got)
	}
}

// TestSupervisorForgedPID: a PID file in the pipe directory (which client
// containers can write) that names an MPS control daemon of another pipe
// directory is not adopted: the supervisor starts the GPU's own daemon.
func TestSupervisorForgedPID(t *testing.T) {
	f := newFixture(t, 1, 2)
	uuid := f.node.GPUs[0].UUID
	d := f.daemons[uuid]
	other := filepath.Join(filepath.Dir(mps.DaemonDir(d)), "other")
	if err := os.MkdirAll(filepath.Join(other, "pipe"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(f.opts.Binary, "-d")
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(other, "pipe"), "CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(other, "log")}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	impostor := &sharing.MPSDaemon{PipeDir: filepath.Join(other, "pipe")}
	pid := f.pid(impostor)
	defer syscall.Kill(pid, syscall.SIGTERM)
	if err := os.MkdirAll(d.PipeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.PipeDir, simnode.MPSControlPID), []byte(fmt.Sprintln(pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := f.run(f.opts)
	defer stop()
	waitFor(t, "the daemon ready", func() bool { return f.ready(time.Now())[uuid].Ready })
	if got := f.pid(d); got == pid || got == 0 {
		t.Errorf("the GPU's daemon is %d; the impostor is %d", got, pid)
	}
	if !strings.Contains(controlLog(t, d), "Starting control daemon") {
		t.Error("no daemon started for the GPU")
	}
}

// TestRetire: a GPU whose daemon runs but which the plan no longer shares
// with MPS has its daemon told to quit, its ready file removed and its
// compute mode set back to Default; a GPU the plan keeps is left alone.
func TestRetire(t *testing.T) {
	f := newFixture(t, 2, 2)
	stop := f.run(f.opts)
	waitFor(t, "the daemons ready", func() bool { return allReady(f.ready(time.Now())) })
	stop()
	g0, g1 := f.node.GPUs[0].UUID, f.node.GPUs[1].UUID
	pid1 := f.pid(f.daemons[g1])
	keep := map[string]*sharing.MPSDaemon{g0: f.daemons[g0]}
	mps.NewSupervisor(f.opts, f.log).Retire(context.Background(), filepath.Dir(mps.DaemonDir(f.daemons[g0])), keep)
	waitFor(t, "GPU 1's daemon to quit", func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid1))
		return err != nil || strings.Contains(string(stat), ") Z")
	})
	if !strings.Contains(controlLog(t, f.daemons[g1]), "Cmd:quit") {
		t.Error("GPU 1's daemon was not told to quit")
	}
	if m := f.modes.get(g1); m != nvml.ComputeModeDefault {
		t.Errorf("GPU 1 in compute mode %s", m)
	}
	if _, err := os.Stat(filepath.Join(mps.DaemonDir(f.daemons[g1]), mps.ReadyFile)); !os.IsNotExist(err) {
		t.Errorf("GPU 1's ready file: %v", err)
	}
	if m := f.modes.get(g0); m != nvml.ComputeModeExclusiveProcess || syscall.Kill(f.pid(f.daemons[g0]), 0) != nil {
		t.Errorf("GPU 0, kept: compute mode %s, daemon %d", m, f.pid(f.daemons[g0]))
	}
}

// TestFollow: Follow brings up the daemons want names as it names them
// (a DRA claim prepared), gives an adopted daemon new limits when they
// change (another claim on the GPU), and retires one it no longer names
// (its claims unprepared): told to quit, compute mode Default, no ready
// file. A nil answer (a checkpoint that cannot be read) changes nothing.
func TestFollow(t *testing.T) {
	f := newFixture(t, 2, 2)
	g0, g1 := f.node.GPUs[0].UUID, f.node.GPUs[1].UUID
	root := filepath.Dir(mps.DaemonDir(f.daemons[g0]))
	var mu sync.Mutex
	want := map[string]*sharing.MPSDaemon{}
	set := func(w map[string]*sharing.MPSDaemon) {
		mu.Lock()
		defer mu.Unlock()
		want = w
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		wake := make(chan struct{})
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					select {
					case wake <- struct{}{}:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
		mps.NewSupervisor(f.opts, f.log).Follow(ctx, root, wake, func() map[string]*sharing.MPSDaemon {
			mu.Lock()
			defer mu.Unlock()
			return want
		})
	}()
	defer func() { cancel(); <-done }()
	probe := func(uuid string, d *sharing.MPSDaemon) sharing.MPSStatus {
		return mps.Probe(map[string]*sharing.MPSDaemon{uuid: d}, time.Now())[uuid]
	}
	d0 := *f.daemons[g0]
	d0.ActiveThreadPercentage, d0.PinnedMemoryMiB = 30, 8192
	set(map[string]*sharing.MPSDaemon{g0: &d0})
	waitFor(t, "GPU 0's daemon ready with the claim's limits", func() bool { return probe(g0, &d0).Ready })
	if log := controlLog(t, &d0); !strings.Contains(log, "Cmd:set_default_active_thread_percentage 30") || !strings.Contains(log, "Cmd:set_default_device_pinned_mem_limit 0 8192M") {
		t.Errorf("GPU 0's daemon log:\n%s", log)
	}
	if _, err := os.Stat(mps.DaemonDir(f.daemons[g1])); !os.IsNotExist(err) {
		t.Errorf("GPU 1, not named, has a daemon directory: %v", err)
	}
	pid := f.pid(&d0)
	set(nil) // cannot tell: nothing changes
	time.Sleep(100 * time.Millisecond)
	if !probe(g0, &d0).Ready || f.pid(&d0) != pid {
		t.Error("a nil answer changed GPU 0's daemon")
	}
	d0b := d0
	d0b.ActiveThreadPercentage = 50
	set(map[string]*sharing.MPSDaemon{g0: &d0b})
	waitFor(t, "GPU 0's daemon ready with new limits", func() bool { return probe(g0, &d0b).Ready })
	if f.pid(&d0b) != pid {
		t.Errorf("GPU 0's daemon %d replaced by %d: it should be adopted with the new limits", pid, f.pid(&d0b))
	}
	set(map[string]*sharing.MPSDaemon{})
	waitFor(t, "GPU 0's daemon retired", func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return (err != nil || strings.Contains(string(stat), ") Z")) && f.modes.get(g0) == nvml.ComputeModeDefault
	})
	if _, err := os.Stat(filepath.Join(mps.DaemonDir(&d0), mps.ReadyFile)); !os.IsNotExist(err) {
		t.Errorf("GPU 0's ready file after retiring: %v", err)
	}
}

// TestWatch: a file renamed into a watched directory wakes the watcher
// (the checkpoint's and the ready files' atomic writes), well before the
// fallback; a directory made after the watch started is watched from the
// next wake-up on; a quiet directory wakes it at the fallback only.
func TestWatch(t *testing.T) {
	dir := t.TempDir()
	later := filepath.Join(dir, "later")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wake := mps.Watch(ctx, time.Hour, dir, later)
	waitWake := func(what string) {
		t.Helper()
		select {
		case <-wake:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no wake-up", what)
		}
	}
	write := func(d string) {
		tmp := filepath.Join(d, ".f.tmp")
		if err := os.WriteFile(tmp, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(d, "f")); err != nil {
			t.Fatal(err)
		}
	}
	write(dir)
	waitWake("a rename into the directory")
	if err := os.Mkdir(later, 0o755); err != nil {
		t.Fatal(err)
	}
	waitWake("a directory made")
	for len(wake) > 0 {
		<-wake
	}
	time.Sleep(50 * time.Millisecond)
	for len(wake) > 0 { // the writes' other events
		<-wake
	}
	write(later)
	waitWake("a rename into the directory made later")
	quiet := mps.Watch(ctx, 30*time.Millisecond, t.TempDir())
	select {
	case <-quiet:
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up at the fallback")
	}
}
