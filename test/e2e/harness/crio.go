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
	"time"

	"github.com/pelletier/go-toml/v2"
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
	// Node, when set, runs CRI-O in a cluster node's namespaces with the
	// node's NRI socket and CNI configuration.
	Node *NodeRuntime
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
	ImportDuration  time.Duration
	// daemon starts, connects to, restarts and stops the process.
	daemon
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
	if opts.Node != nil && opts.Node.NRISocket != "" {
		c.NRISocket = opts.Node.NRISocket
	}
	c.daemon = daemon{
		name: "crio", version: opts.CRIO.Version, dir: dir, address: c.Address, logPath: c.LogPath,
		argv:    []string{opts.CRIO.CRIO, "--config", c.ConfigPath, "--config-dir", c.ConfigDir},
		env:     daemonEnv(opts.Tools.Dirs(), []string{"TMPDIR"}, append([]string{"TMPDIR=" + c.path("tmp")}, opts.Env...)...),
		sockets: []string{c.Address, c.NRISocket},
		runc:    opts.Tools.Runc, podLogDir: c.PodLogDir, killFirst: true, ns: opts.Node.namespaces(), startTimeout: opts.StartTimeout,
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
	if opts.Node != nil {
		clamp, err := buildE2ECommand(ctx, "runc-clamp", c.path("bin"))
		if err != nil {
			return fail(err)
		}
		if err := os.WriteFile(c.runcPath(), []byte(fmt.Sprintf(runcWrapper, clamp, opts.Tools.Runc)), 0o755); err != nil {
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
			"cdi_spec_dirs":                  o.Node.cdiDirs(c.CDISpecDir),
			"irqbalance_config_file":         c.path("irqbalance"),
			"irqbalance_config_restore_file": "disable",
			"decryption_keys_path":           c.path("keys"),
			"default_mounts_file":            "",
			"runtimes": map[string]any{
				"runc": map[string]any{
					"runtime_path": c.runcPath(),
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
		"network": c.networkConfig(),
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

// runcWrapper runs runc through test/e2e/cmd/runc-clamp on a cluster
// node: it clamps a negative oomScoreAdj to 0 and drops hugepage limits
// this hybrid-cgroup machine cannot apply (the program says why), as
// containerd's settings do for containerd; CRI-O has no such settings.
const runcWrapper = `#!/bin/sh
exec %s %s "$@"
`

// runcPath is the OCI runtime CRI-O runs: runc, or on a cluster node
// runcWrapper (written by StartCRIO).
func (c *CRIO) runcPath() string {
	if c.Opts.Node != nil {
		return c.path("runc-oom-clamp")
	}
	return c.Opts.Tools.Runc
}

// networkConfig is crio.conf's network table: the node's CNI plugins and
// configuration, or empty private directories (host-network pods only).
func (c *CRIO) networkConfig() map[string]any {
	conf, bins := c.path("cni", "conf"), []string{c.path("cni", "bin")}
	if n := c.Opts.Node; n != nil && n.CNIConfDir != "" {
		conf, bins = n.CNIConfDir, n.CNIBinDirs
	}
	return map[string]any{"network_dir": conf, "plugin_dirs": bins}
}

// Name is "crio-" and the version without its "v", e.g. "crio-1.34.0".
func (c *CRIO) Name() string { return "crio-" + strings.TrimPrefix(c.Opts.CRIO.Version, "v") }

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
