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

// count returns how many compute modes were set.
func (f *modes) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sets
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

// TestSupervisorMIG: the daemons of two MIG devices of one GPU (two DRA
// claims, as SuperviseClaims follows them) are two daemons, each in its
// own directories under <mpsRoot>/MIG-<uuid>, started with
// CUDA_VISIBLE_DEVICES set to its MIG device's UUID and its claim's
// limits, ready on their own; no compute mode is set (NVML has none for
// a MIG device, and the GPU's other MIG devices are not theirs); each
// MIG device's nvidia-caps nodes missing from the supervisor's /dev are
// made first from discovery's numbers (0444 character devices), one
// already there left alone; a node discovery gives outside
// /dev/nvidia-caps is not made and its daemon does not start. One no
// longer wanted is retired (told to quit, no ready file, still no
// compute mode), and Retire knows MIG devices' directories.
func TestSupervisorMIG(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("the nvidia-caps nodes are made with mknod: %v", err)
	}
	f := newFixture(t, 1, 2)
	g := f.node.GPUs[0]
	root := filepath.Dir(mps.DaemonDir(f.daemons[g.UUID]))
	a, b, bad := simnode.MIGUUIDFor(g.UUID, 1, 0), simnode.MIGUUIDFor(g.UUID, 2, 0), simnode.MIGUUIDFor(g.UUID, 3, 0)
	daemon := func(uuid string, lim sharing.MPSLimits) *sharing.MPSDaemon {
		pipe, log, shm := sharing.DaemonDirs(root, uuid)
		return &sharing.MPSDaemon{PipeDir: pipe, LogDir: log, ShmDir: shm, MPSLimits: lim}
	}
	da, db, dbad := daemon(a, sharing.MPSLimits{ActiveThreadPercentage: 30, PinnedMemoryMiB: 4096}), daemon(b, sharing.MPSLimits{ActiveThreadPercentage: 50}), daemon(bad, sharing.MPSLimits{ActiveThreadPercentage: 50})
	f.daemons = map[string]*sharing.MPSDaemon{a: da, b: db, bad: dbad} // the fixture's cleanup kills them
	caps := func(minor int64) inventory.DeviceNode {
		return inventory.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), Major: simnode.MemoryCapsMajor, Minor: minor, Mode: 0o444}
	}
	nodes := map[string][]inventory.DeviceNode{a: {caps(21), caps(22)}, b: {caps(30), caps(31)}, bad: {{Path: "/dev/nvidia0", Major: 195, Minor: 0}}}
	o := f.opts
	o.DevRoot = t.TempDir()
	o.MIGNodes = func(uuid string) ([]inventory.DeviceNode, error) { return nodes[uuid], nil }
	// GPU instance 1's node exists already (the runtime gave it).
	if err := os.MkdirAll(filepath.Join(o.DevRoot, "nvidia-caps"), 0o755); err != nil {
		t.Fatal(err)
	}
	existing := filepath.Join(o.DevRoot, "nvidia-caps", "nvidia-cap21")
	if err := syscall.Mknod(existing, syscall.S_IFCHR|0o400, int(simnode.Makedev(simnode.MemoryCapsMajor, 21))); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	want := map[string]*sharing.MPSDaemon{a: da, b: db, bad: dbad}
	ctx, cancel := context.WithCancel(context.Background())
	wake := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		mps.NewSupervisor(o, f.log).Follow(ctx, root, wake, func() map[string]*sharing.MPSDaemon {
			mu.Lock()
			defer mu.Unlock()
			return want
		})
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	defer stop()
	probe := func(uuid string, d *sharing.MPSDaemon) sharing.MPSStatus {
		return mps.Probe(map[string]*sharing.MPSDaemon{uuid: d}, time.Now())[uuid]
	}
	waitFor(t, "both MIG devices' daemons ready", func() bool { return probe(a, da).Ready && probe(b, db).Ready })
	if da.PipeDir == db.PipeDir || f.pid(da) == f.pid(db) || f.pid(da) == 0 {
		t.Errorf("one daemon for two MIG devices: pipes %s, %s; pids %d, %d", da.PipeDir, db.PipeDir, f.pid(da), f.pid(db))
	}
	for uuid, w := range map[string][]string{
		a: {"CUDA_VISIBLE_DEVICES=" + a + "\n", "Starting control daemon using socket " + filepath.Join(root, a, "pipe", "control"),
			"Cmd:set_default_active_thread_percentage 30", "Cmd:set_default_device_pinned_mem_limit 0 4096M"},
		b: {"CUDA_VISIBLE_DEVICES=" + b + "\n", "Starting control daemon using socket " + filepath.Join(root, b, "pipe", "control"),
			"Cmd:set_default_active_thread_percentage 50"},
	} {
		log := controlLog(t, f.daemons[uuid])
		for _, s := range w {
			if !strings.Contains(log, s) {
				t.Errorf("MIG device %s: control.log lacks %q:\n%s", uuid, s, log)
			}
		}
	}
	if f.modes.count() != 0 || f.modes.get(g.UUID) != nvml.ComputeModeDefault {
		t.Errorf("%d compute modes set; GPU %s in %s", f.modes.count(), g.UUID, f.modes.get(g.UUID))
	}
	for minor, perm := range map[int64]os.FileMode{21: 0o400, 22: 0o444, 30: 0o444, 31: 0o444} {
		p := filepath.Join(o.DevRoot, "nvidia-caps", fmt.Sprintf("nvidia-cap%d", minor))
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR || st.Rdev != simnode.Makedev(simnode.MemoryCapsMajor, uint32(minor)) || os.FileMode(st.Mode).Perm() != perm {
			t.Errorf("%s: %v, mode %o, rdev %x; want a %o character device %d:%d", p, err, st.Mode, st.Rdev, perm, simnode.MemoryCapsMajor, minor)
		}
	}
	if st := probe(bad, dbad); st.Ready || f.pid(dbad) != 0 {
		t.Errorf("a MIG device whose discovered node is %s: %+v, daemon %d", nodes[bad][0].Path, st, f.pid(dbad))
	}
	if _, err := os.Lstat(filepath.Join(o.DevRoot, "nvidia0")); !os.IsNotExist(err) {
		t.Errorf("a node outside /dev/nvidia-caps was made: %v", err)
	}

	// b's claim unprepared: its daemon is retired, a's runs on.
	pidB := f.pid(db)
	mu.Lock()
	want = map[string]*sharing.MPSDaemon{a: da}
	mu.Unlock()
	wake <- struct{}{}
	waitFor(t, "b's daemon retired", func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pidB))
		return err != nil || strings.Contains(string(stat), ") Z")
	})
	if !strings.Contains(controlLog(t, db), "Cmd:quit") {
		t.Error("b's daemon was not told to quit")
	}
	if _, err := os.Stat(filepath.Join(mps.DaemonDir(db), mps.ReadyFile)); !os.IsNotExist(err) {
		t.Errorf("b's ready file after retiring: %v", err)
	}
	if !probe(a, da).Ready || f.modes.count() != 0 {
		t.Errorf("after retiring b: a %+v, %d compute modes set", probe(a, da), f.modes.count())
	}
	// Nothing wanted any more (nri-gpu mps restarted without claims):
	// Retire finds a's MIG directory.
	stop()
	pidA := f.pid(da)
	mps.NewSupervisor(o, f.log).Retire(context.Background(), root, nil)
	waitFor(t, "a's daemon retired", func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pidA))
		return err != nil || strings.Contains(string(stat), ") Z")
	})
	if f.modes.count() != 0 {
		t.Errorf("%d compute modes set retiring MIG devices' daemons", f.modes.count())
	}
}
