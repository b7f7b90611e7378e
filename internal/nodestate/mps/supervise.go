package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
)

// ControlBinary is the MPS control daemon's file name among the driver's
// binaries.
const ControlBinary = "nvidia-cuda-mps-control"

// PIDFile is the file in its pipe directory where the control daemon
// writes its process id.
const PIDFile = "nvidia-cuda-mps-control.pid"

// Options configure a Supervisor.
type Options struct {
	// Binary is the driver's nvidia-cuda-mps-control, as this process
	// runs it (found by discovery under the driver root).
	Binary string
	// LibraryDirs are the daemon's LD_LIBRARY_PATH: it and the MPS
	// servers it starts load libcuda.so.1 (Driver.LibraryDir).
	LibraryDirs []string
	// ComputeModes sets the GPUs' compute mode (NVML).
	ComputeModes nvml.ComputeModes
	// MinBackoff and MaxBackoff bound the wait before a daemon that did
	// not come up, or died, is started again; zero: 1 s and 1 min.
	MinBackoff, MaxBackoff time.Duration
	// Heartbeat is how often a ready daemon is checked and its ready
	// file touched; zero: HeartbeatInterval. CheckEvery is how many
	// heartbeats pass between asking the daemon itself (its limits) and
	// NVML (the compute mode); zero: 30.
	Heartbeat  time.Duration
	CheckEvery int
	// MIGNodes returns the nvidia-caps device nodes of MIG device uuid
	// (its GPU instance's and compute instance's access capabilities),
	// as discovery found them: the MPS servers of its daemon open them
	// beside the GPU's node. Before the daemon of a MIG device starts,
	// those missing under DevRoot (this process's /dev, where the
	// runtime put the nodes that existed when it started: a MIG device
	// made later has none there) are made from discovery's numbers. Nil:
	// none are made.
	MIGNodes func(uuid string) ([]inventory.DeviceNode, error)
	// DevRoot is this process's device directory; empty: /dev.
	DevRoot string
}

// Supervisor starts the MPS control daemons of a plan and keeps them
// running: one daemon per GPU or MIG device, each with its own pipe and
// log directories, CUDA_VISIBLE_DEVICES set to its device's UUID, a GPU
// in compute mode Exclusive_Process (a MIG device has no compute mode of
// its own), and the daemon's default limits those of one replica. A daemon that dies is started again after a backoff that
// doubles up to MaxBackoff. A daemon that an earlier supervisor started
// (nri-gpu mps restarted) is adopted, not started twice, so that running
// clients keep their server. Stopping the supervisor leaves the daemons
// running.
type Supervisor struct {
	o   Options
	log *logrus.Entry
}

// NewSupervisor returns a supervisor with options o.
func NewSupervisor(o Options, log *logrus.Logger) *Supervisor {
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(time.Minute, o.MinBackoff)
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = HeartbeatInterval
	}
	if o.CheckEvery <= 0 {
		o.CheckEvery = 30
	}
	if o.DevRoot == "" {
		o.DevRoot = "/dev"
	}
	return &Supervisor{o: o, log: log.WithField("component", "mps")}
}

// Run supervises daemons (by GPU UUID) until ctx ends, and returns when
// every GPU's supervision has stopped; the daemons keep running.
func (s *Supervisor) Run(ctx context.Context, daemons map[string]*sharing.MPSDaemon) {
	var wg sync.WaitGroup
	for uuid, d := range daemons {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.supervise(ctx, uuid, d)
		}()
	}
	wg.Wait()
}

// supervise brings one GPU's daemon up and watches it, again and again,
// until ctx ends.
func (s *Supervisor) supervise(ctx context.Context, uuid string, d *sharing.MPSDaemon) {
	log := s.log.WithField("gpu", uuid)
	backoff := s.o.MinBackoff
	for ctx.Err() == nil {
		pid, how, err := s.bringUp(ctx, uuid, d)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.WithError(err).Warnf("MPS control daemon not ready: new containers on this GPU are refused; trying again in %s", backoff)
			if rerr := removeReady(DaemonDir(d)); rerr != nil {
				log.WithError(rerr).Warn("MPS")
			}
			sleep(ctx, backoff)
			backoff = min(2*backoff, s.o.MaxBackoff)
			continue
		}
		th, mem := d.Limits()
		log.WithFields(logrus.Fields{"pid": pid, "threads": th + "%", "memory": mem, "pipe": d.PipeDir}).Infof("MPS control daemon %s: ready", how)
		up := time.Now()
		why := s.watch(ctx, uuid, d, pid)
		if ctx.Err() != nil {
			return
		}
		if err := removeReady(DaemonDir(d)); err != nil {
			log.WithError(err).Warn("MPS")
		}
		if time.Since(up) > s.o.MaxBackoff {
			backoff = s.o.MinBackoff
		}
		log.WithField("pid", pid).Warnf("MPS control daemon %s: new containers on this GPU are refused until it is back; starting it again in %s", why, backoff)
		sleep(ctx, backoff)
		backoff = min(2*backoff, s.o.MaxBackoff)
	}
}

// bringUp prepares the GPU's directories and compute mode, adopts the
// daemon that runs in its pipe directory or starts one, sets its limits
// and writes the ready file. It returns the daemon's PID and whether it
// was "started" or "adopted".
func (s *Supervisor) bringUp(ctx context.Context, uuid string, d *sharing.MPSDaemon) (int, string, error) {
	for _, dir := range []struct {
		path string
		mode os.FileMode
	}{{DaemonDir(d), 0o755}, {d.PipeDir, 0o755}, {d.LogDir, 0o755}, {d.ShmDir, 0o777 | os.ModeSticky}} {
		if err := os.MkdirAll(dir.path, dir.mode); err != nil {
			return 0, "", fmt.Errorf("making %s: %w", dir.path, err)
		}
		// /dev/shm's mode: every client's user makes its segments there.
		if err := os.Chmod(dir.path, dir.mode); err != nil {
			return 0, "", fmt.Errorf("setting the mode of %s: %w", dir.path, err)
		}
	}
	if err := s.exclusive(uuid); err != nil {
		return 0, "", err
	}
	if err := s.migNodes(uuid); err != nil {
		return 0, "", err
	}
	how := "adopted"
	pid := daemonPID(d.PipeDir)
	if pid == 0 || s.control(ctx, d, "get_default_active_thread_percentage") != nil {
		how = "started"
		var err error
		if pid, err = s.start(ctx, uuid, d); err != nil {
			return 0, "", err
		}
	}
	if err := s.setLimits(ctx, d); err != nil {
		return 0, "", err
	}
	err := writeReady(DaemonDir(d), Ready{Version: ReadyVersion, UUID: uuid, MPSLimits: d.MPSLimits, PID: pid, Started: time.Now().UTC().Truncate(time.Second)})
	return pid, how, err
}

// exclusive puts the GPU in compute mode Exclusive_Process, which MPS
// needs: the MPS server is then the one process on the GPU, and every
// client runs through it. A MIG device is left as it is: a compute mode
// is set on whole GPUs only (NVIDIA's DRA driver, too, sets
// Exclusive_Process on the full GPUs of an MPS claim only), and the
// parent GPU's other MIG devices are not this daemon's.
func (s *Supervisor) exclusive(uuid string) error {
	if sharing.IsMIG(uuid) {
		return nil
	}
	if s.o.ComputeModes == nil {
		return errors.New("no NVML: the GPU's compute mode cannot be set to Exclusive_Process, which MPS needs")
	}
	m, err := s.o.ComputeModes.ComputeMode(uuid)
	if err != nil {
		return fmt.Errorf("reading the compute mode: %w", err)
	}
	if m == nvml.ComputeModeExclusiveProcess {
		return nil
	}
	if err := s.o.ComputeModes.SetComputeMode(uuid, nvml.ComputeModeExclusiveProcess); err != nil {
		return fmt.Errorf("setting compute mode Exclusive_Process (was %s), which MPS needs: %w", m, err)
	}
	s.log.WithField("gpu", uuid).Infof("compute mode %s -> %s", m, nvml.ComputeModeExclusiveProcess)
	return nil
}

// env is the daemon's and its clients' (nri-gpu's control commands)
// whole environment: nothing of nri-gpu's own.
// The daemon (uuid set) also gets CUDA_VISIBLE_DEVICES: its one GPU or
// MIG device (MIG-<uuid>), the only device it and its servers see.
func (s *Supervisor) env(uuid string, d *sharing.MPSDaemon) []string {
	env := []string{
		"PATH=" + filepath.Dir(s.o.Binary),
		"LD_LIBRARY_PATH=" + strings.Join(s.o.LibraryDirs, ":"),
		inventory.EnvMPSPipeDir + "=" + d.PipeDir,
		EnvMPSLogDir + "=" + d.LogDir,
	}
	if uuid != "" {
		env = append(env, "CUDA_VISIBLE_DEVICES="+uuid)
	}
	return env
}

// EnvMPSLogDir names the MPS control daemon's log directory.
const EnvMPSLogDir = "CUDA_MPS_LOG_DIRECTORY"

// commandTimeout bounds one run of the daemon's program (starting it, or
// one batch of control commands).
const commandTimeout = 10 * time.Second

// start starts the daemon (nvidia-cuda-mps-control -d, which returns once
// the daemon runs in the background) and returns its PID, from its PID
// file. Files a dead daemon left in the pipe directory go first.
func (s *Supervisor) start(ctx context.Context, uuid string, d *sharing.MPSDaemon) (int, error) {
	if pid := daemonPID(d.PipeDir); pid != 0 {
		return 0, fmt.Errorf("the MPS control daemon %d in %s does not answer; not starting another beside it", pid, d.PipeDir)
	}
	for _, f := range []string{"control", PIDFile} {
		if err := os.Remove(filepath.Join(d.PipeDir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("removing what a dead daemon left: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.o.Binary, "-d")
	cmd.Env = s.env(uuid, d)
	cmd.Dir = DaemonDir(d)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("starting %s -d: %w: %s", s.o.Binary, err, firstLine(out.String()))
	}
	for deadline := time.Now().Add(commandTimeout); ; {
		if pid := daemonPID(d.PipeDir); pid != 0 {
			return pid, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s -d returned, but no daemon runs in %s", s.o.Binary, d.PipeDir)
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// setLimits sets the daemon's default limits to those of one replica,
// and those of the servers it runs already (a daemon adopted with
// clients: a default reaches only the next server), then checks the
// thread percentage the daemon reports.
func (s *Supervisor) setLimits(ctx context.Context, d *sharing.MPSDaemon) error {
	threads, memory := d.Limits()
	cmds := []string{"set_default_active_thread_percentage " + threads}
	if memory != "" {
		// Device 0: the only GPU the daemon sees (CUDA_VISIBLE_DEVICES);
		// NVIDIA's device plugin sets limits by index, as the daemon
		// does not apply one set by UUID.
		cmds = append(cmds, "set_default_device_pinned_mem_limit 0 "+memory)
	}
	if err := s.control(ctx, d, cmds...); err != nil {
		return err
	}
	servers, err := s.output(ctx, d, "get_server_list")
	if err != nil {
		return err
	}
	for _, pid := range strings.Fields(servers) {
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		cmds := []string{"set_active_thread_percentage " + pid + " " + threads}
		if memory != "" {
			cmds = append(cmds, "set_device_pinned_mem_limit "+pid+" 0 "+memory)
		}
		if err := s.control(ctx, d, cmds...); err != nil {
			return err
		}
	}
	return s.checkLimits(ctx, d)
}

// checkLimits asks the daemon its default thread percentage and compares
// it with the plan's.
func (s *Supervisor) checkLimits(ctx context.Context, d *sharing.MPSDaemon) error {
	got, err := s.output(ctx, d, "get_default_active_thread_percentage")
	if err != nil {
		return err
	}
	if v, ok := firstNumber(got); ok && math.Abs(v-float64(d.ActiveThreadPercentage)) > 0.05 {
		return fmt.Errorf("the daemon reports a default active thread percentage of %s, not %d", strings.TrimSpace(got), d.ActiveThreadPercentage)
	}
	return nil
}

var number = regexp.MustCompile(`[0-9]+(\.[0-9]+)?`)

// firstNumber returns the first number in s.
func firstNumber(s string) (float64, bool) {
	m := number.FindString(s)
	if m == "" {
		return 0, false
	}
	v, err := strconv.ParseFloat(m, 64)
	return v, err == nil
}

// control sends commands to the daemon and fails if it does not answer
// or answers one of them with an error.
func (s *Supervisor) control(ctx context.Context, d *sharing.MPSDaemon, cmds ...string) error {
	out, err := s.output(ctx, d, cmds...)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(out, "\n") {
		if low := strings.ToLower(l); strings.Contains(low, "invalid") || strings.Contains(low, "error") || strings.Contains(low, "not found") {
			return fmt.Errorf("the MPS control daemon refused %q: %s", strings.Join(cmds, "; "), strings.TrimSpace(l))
		}
	}
	return nil
}

// maxOutput bounds what is read of a control client's output.
const maxOutput = 64 << 10

// output runs the daemon's program as a client with cmds on its standard
// input, one a line, and returns what it printed.
func (s *Supervisor) output(ctx context.Context, d *sharing.MPSDaemon, cmds ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.o.Binary)
	cmd.Env = s.env("", d)
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = maxOutput, 4096
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s (%s): %w: %s", strings.Join(cmds, "; "), d.PipeDir, err, firstLine(stderr.String()+stdout.String()))
	}
	return stdout.String(), nil
}

// watch checks the daemon every heartbeat and touches its ready file; it
// returns why the daemon is no longer ready (or when ctx ends).
func (s *Supervisor) watch(ctx context.Context, uuid string, d *sharing.MPSDaemon, pid int) string {
	t := time.NewTicker(s.o.Heartbeat)
	defer t.Stop()
	ready := filepath.Join(DaemonDir(d), ReadyFile)
	for beat := 1; ; beat++ {
		select {
		case <-ctx.Done():
			return "supervision stopped"
		case <-t.C:
		}
		if !alive(pid, ControlBinary) {
			return "exited"
		}
		if beat%s.o.CheckEvery == 0 {
			if err := s.checkLimits(ctx, d); err != nil {
				return "stopped answering with its limits: " + err.Error()
			}
			if err := s.exclusive(uuid); err != nil {
				return "runs on a GPU whose compute mode changed (a reset?): " + err.Error()
			}
		}
		now := time.Now()
		if err := os.Chtimes(ready, now, now); err != nil {
			return "lost its ready file: " + err.Error()
		}
	}
}

// daemonPID returns the PID of the live MPS control daemon of the pipe
// directory pipe, else 0: the PID the ready file recorded (its directory
// is nri-gpu's alone), or else the one in the pipe directory's PID file,
// when that process is an MPS control daemon started with this pipe
// directory. Client containers can write in the pipe directory: a PID
// file they wrote names no such process.
func daemonPID(pipe string) int {
	var candidates []int
	if r, _, err := readReady(filepath.Dir(pipe)); err == nil {
		candidates = append(candidates, r.PID)
	}
	if data, err := os.ReadFile(filepath.Join(pipe, PIDFile)); err == nil && len(data) <= 32 {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			candidates = append(candidates, pid)
		}
	}
	for _, pid := range candidates {
		if pid > 1 && alive(pid, ControlBinary) && startedWith(pid, inventory.EnvMPSPipeDir+"="+pipe) {
			return pid
		}
	}
	return 0
}

// startedWith reports whether process pid was started with the
// environment entry env.
func startedWith(pid int, env string) bool {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return false
	}
	for e := range bytes.SplitSeq(data, []byte{0}) {
		if string(e) == env {
			return true
		}
	}
	return false
}

// alive reports whether pid is a running process (not a zombie) whose
// program is named name. A zombie that is this process's child (a daemon
// reparented to nri-gpu mps running as a container's PID 1) is reaped.
func alive(pid int, name string) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	fields := strings.Fields(string(stat[i+1:]))
	if i < 0 || len(fields) < 2 {
		return false
	}
	if fields[0] == "Z" || fields[0] == "X" {
		if ppid, _ := strconv.Atoi(fields[1]); ppid == os.Getpid() {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		return false
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	argv0, _, _ := bytes.Cut(cmdline, []byte{0})
	return filepath.Base(string(argv0)) == name
}

// limitedBuffer keeps at most max bytes of what is written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

var _ io.Writer = (*limitedBuffer)(nil)

// firstLine returns the first line of s, cut for a message.
func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Retire undoes MPS for the GPUs and MIG devices that have a daemon
// directory under root (from an earlier configuration) but are not among
// keep: when a daemon that nri-gpu started still runs there and serves
// no client (no MPS server runs), it is told to quit, its ready file
// goes, and a GPU's compute mode is set back to Default. A daemon with servers is left
// alone, with a warning: quitting it would end its clients.
func (s *Supervisor) Retire(ctx context.Context, root string, keep map[string]*sharing.MPSDaemon) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		uuid := e.Name()
		if !e.IsDir() || !strings.HasPrefix(uuid, "GPU-") && !sharing.IsMIG(uuid) || keep[uuid] != nil {
			continue
		}
		s.retire(ctx, root, uuid)
	}
}

// retire undoes MPS for the GPU uuid (see Retire); it reports whether
// the daemon is gone and the compute mode Default.
func (s *Supervisor) retire(ctx context.Context, root, uuid string) bool {
	d := &sharing.MPSDaemon{PipeDir: filepath.Join(root, uuid, "pipe"), LogDir: filepath.Join(root, uuid, "log")}
	log := s.log.WithField("gpu", uuid)
	if pid := daemonPID(d.PipeDir); pid != 0 {
		servers, err := s.output(ctx, d, "get_server_list")
		if err != nil || strings.TrimSpace(servers) != "" {
			log.WithError(err).Warnf("MPS is no longer configured for this GPU, but its MPS control daemon %d serves clients (servers %q): left running; quit it when they are done", pid, strings.TrimSpace(servers))
			return false
		}
		if err := s.control(ctx, d, "quit"); err != nil {
			log.WithError(err).Warn("MPS is no longer configured for this GPU: quitting its MPS control daemon")
			return false
		}
	}
	if err := removeReady(filepath.Join(root, uuid)); err != nil {
		log.WithError(err).Warn("MPS")
	}
	if sharing.IsMIG(uuid) {
		log.Info("MPS is no longer configured for this MIG device: its daemon quit")
		return true
	}
	if s.o.ComputeModes != nil {
		if m, err := s.o.ComputeModes.ComputeMode(uuid); err == nil && m == nvml.ComputeModeExclusiveProcess {
			if err := s.o.ComputeModes.SetComputeMode(uuid, nvml.ComputeModeDefault); err != nil {
				log.WithError(err).Warn("MPS is no longer configured for this GPU: setting its compute mode back to Default")
				return false
			}
		}
	}
	log.Info("MPS is no longer configured for this GPU: its daemon quit, compute mode Default")
	return true
}

// Follow supervises the daemons that want returns (by GPU UUID), asked
// at start and again at every wake-up (Watch on the file want reads),
// until ctx ends: a daemon it names is brought up and supervised as Run
// does; one it no longer names (its DRA claims were unprepared) stops
// being supervised and is retired (Retire: quit when it serves no client,
// compute mode Default), as is one whose limits changed, before it is
// brought up with the new ones (an adopted daemon gets the new limits).
// want returns nil when it cannot tell (a checkpoint that cannot be
// read): nothing changes then. Bounded: one call of want per wake-up and
// one goroutine per daemon.
func (s *Supervisor) Follow(ctx context.Context, root string, wake <-chan struct{}, want func() map[string]*sharing.MPSDaemon) {
	type running struct {
		d      *sharing.MPSDaemon
		cancel context.CancelFunc
		done   chan struct{}
	}
	cur := map[string]*running{}
	defer func() {
		for _, r := range cur {
			r.cancel()
			<-r.done
		}
	}()
	for ctx.Err() == nil {
		if w := want(); w != nil {
			for uuid, r := range cur {
				nd, ok := w[uuid]
				if ok && sharing.SameDaemon(nd, r.d) {
					continue
				}
				r.cancel()
				<-r.done
				delete(cur, uuid)
				if !ok {
					s.retire(ctx, root, uuid)
				}
			}
			for uuid, d := range w {
				if cur[uuid] != nil {
					continue
				}
				sctx, cancel := context.WithCancel(ctx)
				r := &running{d: d, cancel: cancel, done: make(chan struct{})}
				cur[uuid] = r
				go func() {
					defer close(r.done)
					s.supervise(sctx, uuid, d)
				}()
			}
		}
		select {
		case <-ctx.Done():
		case <-wake:
		}
	}
}

// capsDir is where the nvidia-caps device nodes are, the same path on
// the host and here.
const capsDir = "/dev/nvidia-caps"

// migNodes makes the nvidia-caps nodes of MIG device uuid that are
// missing under DevRoot (Options.MIGNodes), character devices of
// discovery's numbers with its mode (0444 without one, as nvidia-modprobe
// makes them). Only nodes directly in /dev/nvidia-caps are made; one
// that exists is left as it is when it is that character device, and
// fails the daemon otherwise. Nothing for a GPU.
func (s *Supervisor) migNodes(uuid string) error {
	if !sharing.IsMIG(uuid) || s.o.MIGNodes == nil {
		return nil
	}
	nodes, err := s.o.MIGNodes(uuid)
	if err != nil {
		return fmt.Errorf("the nvidia-caps device nodes of MIG device %s: %w", uuid, err)
	}
	for _, n := range nodes {
		if filepath.Dir(n.Path) != capsDir || !strings.HasPrefix(filepath.Base(n.Path), "nvidia-cap") || n.Major <= 0 || n.Minor < 0 {
			return fmt.Errorf("MIG device %s: discovery gives device node %s (%d:%d), not one of %s: not made", uuid, n.Path, n.Major, n.Minor, capsDir)
		}
		p := filepath.Join(s.o.DevRoot, strings.TrimPrefix(n.Path, "/dev/"))
		dev := unix.Mkdev(uint32(n.Major), uint32(n.Minor))
		var st unix.Stat_t
		switch err := unix.Lstat(p, &st); {
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == dev:
			continue
		case err == nil:
			return fmt.Errorf("MIG device %s: %s is not the character device %d:%d that discovery found", uuid, p, n.Major, n.Minor)
		case !errors.Is(err, unix.ENOENT):
			return fmt.Errorf("MIG device %s: %w", uuid, err)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("MIG device %s: %w", uuid, err)
		}
		mode := n.Mode & 0o777
		if mode == 0 {
			mode = 0o444
		}
		if err := unix.Mknod(p, unix.S_IFCHR|mode, int(dev)); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("MIG device %s: making %s (%d:%d): %w", uuid, p, n.Major, n.Minor, err)
		}
		// The umask may have narrowed the mode.
		if err := os.Chmod(p, os.FileMode(mode)); err != nil {
			return fmt.Errorf("MIG device %s: %w", uuid, err)
		}
		s.log.WithField("gpu", uuid).Infof("made %s (%d:%d), which the MIG device's MPS servers open", p, n.Major, n.Minor)
	}
	return nil
}
