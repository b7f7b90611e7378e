package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
)

// daemon is a CRI runtime process the harness runs: containerd and CRI-O
// share how it is started (in the host's namespaces or a node's), waited
// for on its CRI socket, connected to once for its whole life, stopped
// (leaving its containers) and torn down with everything under its
// directory.
type daemon struct {
	name    string   // "containerd", "crio": log lines and errors
	version string   // "v2.4.2", "v1.34.0"
	dir     string   // its private directory; Stop removes it
	address string   // CRI socket
	logPath string   // its stdout and stderr
	argv    []string // the command
	env     []string // its whole environment
	sockets []string // removed before each start (a killed daemon leaves them)
	// runc is the runc that CleanupDir uses to delete the containers.
	runc string
	// podLogDir and killFirst configure the CRI client (see newCRI).
	podLogDir string
	killFirst bool
	// ns, when set, is the node the daemon runs in (its mount and network
	// namespaces); nil is the host's.
	ns           *Namespaces
	startTimeout time.Duration
	// StartupDuration is how long the last start took until CRI was ready.
	StartupDuration time.Duration

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
	logFile *os.File
	conn    *grpc.ClientConn
	cri     *CRI
	stopped bool
}

// daemonEnv is the environment of a daemon: PATH with dirs first, the
// test's environment less PATH, systemd's socket variables and the keys
// in drop, then extra.
func daemonEnv(dirs []string, drop []string, extra ...string) []string {
	env := []string{"PATH=" + strings.Join(append(dirs, os.Getenv("PATH")), ":")}
	for _, e := range os.Environ() {
		k, _, _ := strings.Cut(e, "=")
		if k == "PATH" || k == "NOTIFY_SOCKET" || strings.HasPrefix(k, "LISTEN_") || containsString(drop, k) {
			continue
		}
		env = append(env, e)
	}
	return append(env, extra...)
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// start runs the daemon and waits until CRI answers and the runtime is
// ready.
func (d *daemon) start(ctx context.Context) error {
	begin := time.Now()
	for _, s := range d.sockets {
		_ = os.Remove(s)
	}
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== nri-gpu-e2e: starting %s %s at %s\n", d.argv[0], d.version, time.Now().Format(time.RFC3339Nano))
	argv := d.ns.Wrap(d.argv)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = d.dir
	cmd.Env = d.env
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", d.name, err)
	}
	exited := make(chan struct{})
	d.mu.Lock()
	d.cmd, d.exited, d.logFile, d.exitErr = cmd, exited, logf, nil
	d.mu.Unlock()
	go func() {
		err := cmd.Wait()
		d.mu.Lock()
		d.exitErr = err
		d.mu.Unlock()
		close(exited)
	}()
	// nsenter execs the daemon in the same process: the pid is the daemon's.
	if err := os.WriteFile(filepath.Join(d.dir, d.name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, d.startTimeout)
	defer cancel()
	if err := waitCRI(wctx, d.name, d.address, exited, d.exitError, d.connect, func(ctx context.Context) error { return criReady(ctx, d.CRI()) }); err != nil {
		return fmt.Errorf("%s %s did not become ready: %w\n--- tail of %s ---\n%s", d.name, d.version, err, d.logPath, d.LogTail(6000))
	}
	d.StartupDuration = time.Since(begin)
	return nil
}

// exitError is the error the daemon's process exited with.
func (d *daemon) exitError() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.exitErr
}

// connect makes the one connection for the life of the daemon (see
// dialCRI), so CRI() stays valid across Restart.
func (d *daemon) connect() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil {
		return nil
	}
	conn, err := dialCRI(d.address)
	if err != nil {
		return err
	}
	d.conn = conn
	d.cri = newCRI(conn, d.podLogDir, d.LogTail)
	d.cri.killFirst = d.killFirst
	return nil
}

// CRI returns the CRI client of the runtime.
func (d *daemon) CRI() *CRI {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cri
}

// PID returns the runtime's process id (0 when not running).
func (d *daemon) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.cmd.Process == nil {
		return 0
	}
	select {
	case <-d.exited:
		return 0
	default:
	}
	return d.cmd.Process.Pid
}

// LogTail returns the last n bytes of the runtime's log.
func (d *daemon) LogTail(n int64) string { return fileTail(d.logPath, n) }

// stopDaemon stops the runtime's process (SIGTERM, then SIGKILL after
// grace), leaving its shims or monitors and the containers alone.
func (d *daemon) stopDaemon(grace time.Duration) {
	d.mu.Lock()
	cmd, exited := d.cmd, d.exited
	d.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	select {
	case <-exited:
	default:
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(grace):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	d.mu.Lock()
	if d.logFile != nil {
		d.logFile.Close()
		d.logFile = nil
	}
	d.mu.Unlock()
}

// Restart stops the runtime the way a real restart does (containers and
// their shims or monitors keep running) and starts it again on the same
// state; it returns once CRI answers again. The CRI client stays valid (it
// reconnects).
func (d *daemon) Restart(ctx context.Context) error {
	d.stopDaemon(10 * time.Second)
	return d.start(ctx)
}

// Stop removes every pod through CRI (best effort, bounded), stops the
// runtime, kills its containers and every shim or monitor started for its
// directory by PID, unmounts everything under the directory and removes
// it. It is safe to call more than once. It returns what it could not
// clean up.
func (d *daemon) Stop() error {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return nil
	}
	d.stopped = true
	cri := d.cri
	d.mu.Unlock()
	if cri != nil && d.PID() != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_ = cri.CleanupAll(ctx)
		cancel()
	}
	d.stopDaemon(10 * time.Second)
	d.mu.Lock()
	if d.conn != nil {
		d.conn.Close()
	}
	d.mu.Unlock()
	return CleanupDir(d.dir, d.runc)
}
