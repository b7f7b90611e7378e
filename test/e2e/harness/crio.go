package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pelletier/go-toml/v2"
	"google.golang.org/grpc"
)

// CRIOOptions configures StartCRIO.
type CRIOOptions struct {
	// Tools gives runc (required); CRIO the CRI-O binaries (required).
	Tools *Tools
	CRIO  *CRIOTools
	// Images to copy into CRI-O's storage before it starts (may be nil). The
	// Busybox image is also the pause image.
	Images      *Images
	ExtraImages []*Image

	// DisableNRI turns NRI off in the main config (a drop-in may turn it on).
	DisableNRI bool
	// NRIRegistrationTimeout and NRIRequestTimeout override CRI-O's defaults
	// when non-zero.
	NRIRegistrationTimeout time.Duration
	NRIRequestTimeout      time.Duration
	// ExtraConfig is TOML merged over the generated crio.conf.
	ExtraConfig string
	// Prepare, when set, runs once the private directories and crio.conf
	// exist and before CRI-O starts: to write drop-ins into ConfigDir
	// (crio.conf.d, read after crio.conf in name order) or pre-registered
	// plugins into NRIPluginPath, which need the private paths.
	Prepare func(c *CRIO) error
	// Env is added to CRI-O's environment.
	Env []string
	// Debug sets CRI-O's log level to debug.
	Debug bool
	// StartTimeout bounds the wait for CRI to answer (default 60 s).
	StartTimeout time.Duration
}

// CRIO is a running private CRI-O. All its paths are under Dir.
type CRIO struct {
	Opts CRIOOptions

	Dir             string // the private temp dir
	Root            string // containers/storage root
	RunRoot         string // containers/storage runroot and CRI-O's run state
	Address         string // CRI socket
	NRISocket       string // NRI socket for external plugins
	NRIPluginPath   string // pre-registered plugins
	NRIPluginConfig string // their configs
	CDISpecDir      string // the only CDI spec dir
	RuncRoot        string // runc's --root
	ConfigPath      string // the generated crio.conf
	ConfigDir       string // its drop-in dir (crio.conf.d)
	LogPath         string // CRI-O's stdout+stderr
	PodLogDir       string // parent of the pods' log directories
	StartupDuration time.Duration
	ImportDuration  time.Duration

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
	logFile *os.File
	conn    *grpc.ClientConn
	cri     *CRI
	stopped bool
}

var _ Runtime = (*CRIO)(nil)

// StartCRIO starts a private CRI-O under a fresh short temp dir: the images are
// copied into its storage first, then it runs until CRI reports the runtime
// ready. On error everything started is cleaned up again.
func StartCRIO(ctx context.Context, opts CRIOOptions) (*CRIO, error) {
	if opts.Tools == nil || opts.CRIO == nil {
		return nil, errors.New("CRIOOptions.Tools and CRIOOptions.CRIO are required")
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	dir, err := os.MkdirTemp("", "nrie2e-")
	if err != nil {
		return nil, err
	}
	c := &CRIO{
		Opts:            opts,
		Dir:             dir,
		Root:            filepath.Join(dir, "root"),
		RunRoot:         filepath.Join(dir, "run"),
		Address:         filepath.Join(dir, "crio.sock"),
		NRISocket:       filepath.Join(dir, "nri.sock"),
		NRIPluginPath:   filepath.Join(dir, "nri", "plugins"),
		NRIPluginConfig: filepath.Join(dir, "nri", "conf.d"),
		CDISpecDir:      filepath.Join(dir, "cdi"),
		RuncRoot:        filepath.Join(dir, "runc", "crio"),
		ConfigPath:      filepath.Join(dir, "crio.conf"),
		ConfigDir:       filepath.Join(dir, "crio.conf.d"),
		LogPath:         filepath.Join(dir, "crio.log"),
		PodLogDir:       filepath.Join(dir, "pods"),
	}
	fail := func(err error) (*CRIO, error) { return nil, errors.Join(err, CleanupDir(dir, opts.Tools.Runc)) }
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fail(err)
	}
	for _, d := range []string{c.Root, c.RunRoot, c.NRIPluginPath, c.NRIPluginConfig, c.CDISpecDir, c.RuncRoot, c.ConfigDir, c.PodLogDir,
		c.path("ns"), c.path("exits"), c.path("attach"), c.path("hooks"), c.path("cni", "bin"), c.path("cni", "conf"), c.path("tmp"), c.path("lib")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fail(err)
		}
	}
	if err := os.WriteFile(c.path("policy.json"), []byte(`{"default":[{"type":"insecureAcceptAnything"}]}`), 0o644); err != nil {
		return fail(err)
	}
	cfg, err := c.config()
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(c.ConfigPath, cfg, 0o644); err != nil {
		return fail(err)
	}
	if opts.Prepare != nil {
		if err := opts.Prepare(c); err != nil {
			return fail(err)
		}
	}
	start := time.Now()
	var imgs []*Image
	if opts.Images != nil {
		imgs = append(imgs, opts.Images.All()...)
	}
	imgs = append(imgs, opts.ExtraImages...)
	if err := c.ImportImages(ctx, imgs...); err != nil {
		return fail(err)
	}
	c.ImportDuration = time.Since(start)
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

func (c *CRIO) path(elem ...string) string {
	return filepath.Join(append([]string{c.Dir}, elem...)...)
}

// storageRef is the containers-storage reference of CRI-O's storage.
func (c *CRIO) storageRef(name string) string {
	return "containers-storage:[vfs@" + c.Root + "+" + c.RunRoot + "]" + name
}

// ImportImages copies OCI layout archives (the images the containerd harness
// imports) into CRI-O's storage with skopeo, one at a time.
func (c *CRIO) ImportImages(ctx context.Context, imgs ...*Image) error {
	for _, img := range imgs {
		if img == nil {
			continue
		}
		cmd := exec.CommandContext(ctx, c.Opts.CRIO.Skopeo, "--policy", c.path("policy.json"), "copy", "--quiet",
			"oci-archive:"+img.Tar, c.storageRef(img.Name))
		cmd.Env = append(os.Environ(), "TMPDIR="+c.path("tmp"))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("skopeo copy %s into CRI-O's storage: %w\n%s", img.Name, err, out)
		}
	}
	return nil
}

// config renders crio.conf: every path private, NRI on (unless disabled),
// runc as the only runtime, cgroupfs, vfs storage, no CNI (pods use the host
// network), the busybox image as the pause image.
func (c *CRIO) config() ([]byte, error) {
	o := c.Opts
	nri := map[string]any{
		"enable_nri":            !o.DisableNRI,
		"nri_listen":            c.NRISocket,
		"nri_plugin_dir":        c.NRIPluginPath,
		"nri_plugin_config_dir": c.NRIPluginConfig,
	}
	if o.NRIRegistrationTimeout > 0 {
		nri["nri_plugin_registration_timeout"] = o.NRIRegistrationTimeout.String()
	}
	if o.NRIRequestTimeout > 0 {
		nri["nri_plugin_request_timeout"] = o.NRIRequestTimeout.String()
	}
	level := "info"
	if o.Debug {
		level = "debug"
	}
	crio := map[string]any{
		"root":                 c.Root,
		"runroot":              c.RunRoot,
		"storage_driver":       "vfs",
		"log_dir":              c.PodLogDir,
		"version_file":         c.path("run", "crio-version"),
		"version_file_persist": c.path("lib", "version"),
		"clean_shutdown_file":  c.path("lib", "clean.shutdown"),
		"api": map[string]any{
			"listen":         c.Address,
			"stream_address": "127.0.0.1",
			"stream_port":    "0",
		},
		"runtime": map[string]any{
			"default_runtime":                "runc",
			"cgroup_manager":                 "cgroupfs",
			"conmon_cgroup":                  "pod",
			"log_level":                      level,
			"pinns_path":                     o.CRIO.Pinns,
			"namespaces_dir":                 c.path("ns"),
			"container_exits_dir":            c.path("exits"),
			"container_attach_socket_dir":    c.path("attach"),
			"hooks_dir":                      []string{c.path("hooks")},
			"cdi_spec_dirs":                  []string{c.CDISpecDir},
			"irqbalance_config_file":         c.path("irqbalance"),
			"irqbalance_config_restore_file": "disable",
			"decryption_keys_path":           c.path("keys"),
			"default_mounts_file":            "",
			"runtimes": map[string]any{
				"runc": map[string]any{
					"runtime_path": o.Tools.Runc,
					"runtime_type": "oci",
					"runtime_root": c.RuncRoot,
					"monitor_path": o.CRIO.Conmon,
					"monitor_env":  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
				},
			},
		},
		"image": map[string]any{
			"signature_policy":     c.path("policy.json"),
			"signature_policy_dir": c.path("policies"),
			"pause_image":          BusyboxImage,
			// "": the pause image's own entrypoint and command.
			"pause_command":           "",
			"big_files_temporary_dir": c.path("tmp"),
		},
		"network": map[string]any{
			"network_dir": c.path("cni", "conf"),
			"plugin_dirs": []string{c.path("cni", "bin")},
		},
		"nri":     nri,
		"metrics": map[string]any{"enable_metrics": false},
	}
	cfg := map[string]any{"crio": crio}
	if strings.TrimSpace(o.ExtraConfig) != "" {
		var extra map[string]any
		if err := toml.Unmarshal([]byte(o.ExtraConfig), &extra); err != nil {
			return nil, fmt.Errorf("ExtraConfig: %w", err)
		}
		mergeTOML(cfg, extra)
	}
	return toml.Marshal(cfg)
}

// start runs CRI-O and waits until CRI is ready.
func (c *CRIO) start(ctx context.Context) error {
	begin := time.Now()
	for _, s := range []string{c.Address, c.NRISocket} {
		_ = os.Remove(s)
	}
	logf, err := os.OpenFile(c.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== nri-gpu-e2e: starting %s %s at %s\n", c.Opts.CRIO.CRIO, c.Opts.CRIO.Version, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.Opts.CRIO.CRIO, "--config", c.ConfigPath, "--config-dir", c.ConfigDir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.Dir
	env := []string{"PATH=" + strings.Join(append(c.Opts.Tools.Dirs(), os.Getenv("PATH")), ":"), "TMPDIR=" + c.path("tmp")}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PATH=") && !strings.HasPrefix(e, "TMPDIR=") && !strings.HasPrefix(e, "NOTIFY_SOCKET=") && !strings.HasPrefix(e, "LISTEN_") {
			env = append(env, e)
		}
	}
	env = append(env, c.Opts.Env...)
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start crio: %w", err)
	}
	exited := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.exited, c.logFile, c.exitErr = cmd, exited, logf, nil
	c.mu.Unlock()
	go func() {
		err := cmd.Wait()
		c.mu.Lock()
		c.exitErr = err
		c.mu.Unlock()
		close(exited)
	}()
	if err := os.WriteFile(c.path("crio.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, c.Opts.StartTimeout)
	defer cancel()
	if err := c.waitReady(wctx, exited); err != nil {
		return fmt.Errorf("crio %s did not become ready: %w\n--- tail of %s ---\n%s", c.Opts.CRIO.Version, err, c.LogPath, c.LogTail(6000))
	}
	c.StartupDuration = time.Since(begin)
	return nil
}

func (c *CRIO) waitReady(ctx context.Context, exited chan struct{}) error {
	return waitCRI(ctx, "crio", c.Address, exited, c.exitError, c.connect, func(ctx context.Context) error { return criReady(ctx, c.cri) })
}

// exitError is the error crio's process exited with.
func (c *CRIO) exitError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exitErr
}

// connect makes the one connection for the life of this CRIO (see
// dialCRI), so CRI() stays valid across Restart.
func (c *CRIO) connect() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		return nil
	}
	conn, err := dialCRI(c.Address)
	if err != nil {
		return err
	}
	c.conn = conn
	c.cri = newCRI(conn, c.PodLogDir, c.LogTail)
	c.cri.killFirst = true
	return nil
}

// Name is "crio-" and the version without its "v", e.g. "crio-1.34.0".
func (c *CRIO) Name() string { return "crio-" + strings.TrimPrefix(c.Opts.CRIO.Version, "v") }

// CRI returns the CRI client of this CRI-O.
func (c *CRIO) CRI() *CRI {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cri
}

// NRISocketPath is the NRI socket for external plugins.
func (c *CRIO) NRISocketPath() string { return c.NRISocket }

// NRIPluginDir is the directory of pre-registered plugins.
func (c *CRIO) NRIPluginDir() string { return c.NRIPluginPath }

// NRIPluginConfigDir is the directory of their configs.
func (c *CRIO) NRIPluginConfigDir() string { return c.NRIPluginConfig }

// CDIDir is the only CDI spec directory CRI-O reads.
func (c *CRIO) CDIDir() string { return c.CDISpecDir }

// CRIEndpoint is CRI-O's CRI endpoint, for a kubelet.
func (c *CRIO) CRIEndpoint() string { return "unix://" + c.Address }

// TempDir is CRI-O's private directory.
func (c *CRIO) TempDir() string { return c.Dir }

// LogTail returns the last n bytes of CRI-O's log.
func (c *CRIO) LogTail(n int64) string { return fileTail(c.LogPath, n) }

// PID returns CRI-O's process id (0 when not running).
func (c *CRIO) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	select {
	case <-c.exited:
		return 0
	default:
	}
	return c.cmd.Process.Pid
}

// stopDaemon stops the crio process (SIGTERM, then SIGKILL after grace),
// leaving conmon and the containers alone.
func (c *CRIO) stopDaemon(grace time.Duration) {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
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
	c.mu.Lock()
	if c.logFile != nil {
		c.logFile.Close()
		c.logFile = nil
	}
	c.mu.Unlock()
}

// Restart stops CRI-O as a real restart does (containers and their conmon
// keep running) and starts it again on the same state; it returns once CRI
// answers again.
func (c *CRIO) Restart(ctx context.Context) error {
	c.stopDaemon(10 * time.Second)
	return c.start(ctx)
}

// Stop removes every pod through CRI (best effort, bounded), kills CRI-O, the
// containers and every conmon started for this dir by PID, unmounts
// everything under Dir and removes Dir. It is safe to call more than once.
func (c *CRIO) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	cri := c.cri
	c.mu.Unlock()
	if cri != nil && c.PID() != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_ = cri.CleanupAll(ctx)
		cancel()
	}
	c.stopDaemon(10 * time.Second)
	c.mu.Lock()
	if c.conn != nil {
		c.conn.Close()
	}
	c.mu.Unlock()
	return CleanupDir(c.Dir, c.Opts.Tools.Runc)
}
