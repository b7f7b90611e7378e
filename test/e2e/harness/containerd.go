package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pelletier/go-toml/v2"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ContainerdOptions configures StartContainerd.
type ContainerdOptions struct {
	// Tools to run (required).
	Tools *Tools
	// Images to import into the k8s.io namespace after start (may be nil). The
	// Busybox image is also the sandbox (pause) image; without Images the sandbox
	// image is SandboxImage.
	Images *Images
	// ExtraImages are imported too.
	ExtraImages []*Image
	// SandboxImage overrides the sandbox image (default BusyboxImage).
	SandboxImage string

	// DefaultValidator enables NRI's built-in default validator, which can require
	// named plugins per pod (annotation required-plugins.noderesource.dev/...).
	DefaultValidator bool
	// DisableNRI turns NRI off.
	DisableNRI bool
	// NRIRegistrationTimeout and NRIRequestTimeout override containerd's defaults
	// (5 s and 2 s) when non-zero.
	NRIRegistrationTimeout time.Duration
	NRIRequestTimeout      time.Duration

	// RuntimeBinary is the OCI runtime the runc shim runs (its BinaryName), e.g. a
	// wrapper such as nvidia-container-runtime. Default: Tools.Runc.
	RuntimeBinary string
	// ExtraConfig is TOML merged over the generated config (tables merge key by
	// key, so it may override generated keys as well as add new ones).
	ExtraConfig string
	// Env is added to containerd's environment (and so to the shims').
	Env []string
	// Debug sets containerd's log level to debug.
	Debug bool
	// StartTimeout bounds the wait for CRI to answer (default 60 s).
	StartTimeout time.Duration
	// Node, when set, runs containerd in a cluster node's namespaces with
	// the node's NRI socket and CNI configuration.
	Node *NodeRuntime
}

// Containerd is a running private containerd. All its paths are under Dir.
type Containerd struct {
	Opts ContainerdOptions

	Dir             string // the private temp dir, e.g. /tmp/nrie2e-123
	Root            string // containerd root
	State           string // containerd state
	Address         string // gRPC (and CRI) unix socket
	NRISocket       string // NRI socket for external plugins
	NRIPluginPath   string // pre-registered plugins (NN-name executables)
	NRIPluginConfig string // their configs (NN-name.conf)
	CDISpecDir      string // the only CDI spec dir
	RuncRoot        string // runc's state root (--root)
	ConfigPath      string // the generated config.toml
	LogPath         string // containerd's stdout+stderr
	PodLogDir       string // parent of the pods' log directories
	ImportDuration  time.Duration
	features        features
	// daemon starts, connects to, restarts and stops the process.
	daemon
}

var _ Runtime = (*Containerd)(nil)

// Name is "containerd-" and the version without its v, e.g. "containerd-1.7.36".
func (c *Containerd) Name() string {
	return "containerd-" + strings.TrimPrefix(c.Opts.Tools.ContainerdVersion, "v")
}

// NRISocketPath is the NRI socket for external plugins.
func (c *Containerd) NRISocketPath() string { return c.NRISocket }

// NRIPluginDir is the pre-registered plugins' directory (NN-name executables).
func (c *Containerd) NRIPluginDir() string { return c.NRIPluginPath }

// NRIPluginConfigDir is the pre-registered plugins' config dir (NN-name.conf).
func (c *Containerd) NRIPluginConfigDir() string { return c.NRIPluginConfig }

// CDIDir is the only CDI spec directory containerd reads.
func (c *Containerd) CDIDir() string { return c.CDISpecDir }

// CRIEndpoint is containerd's CRI endpoint, for a kubelet.
func (c *Containerd) CRIEndpoint() string { return "unix://" + c.Address }

// TempDir is the private directory everything of this containerd is under.
func (c *Containerd) TempDir() string { return c.Dir }

// features are config differences between containerd releases.
type features struct {
	shimSocketDir bool // [plugins.'io.containerd.shim.v1.manager'] socket_dir (2.4+)
	enableCDIKey  bool // [plugins.'io.containerd.cri.v1.runtime'] enable_cdi (before 2.3)
	configV2      bool // config version 2, CRI under io.containerd.grpc.v1.cri (1.x)
}

func featuresFor(version string) features {
	major, minor := parseVersion(version)
	after := func(ma, mi int) bool { return major > ma || major == ma && minor >= mi }
	return features{
		shimSocketDir: after(2, 4),
		enableCDIKey:  !after(2, 3),
		configV2:      !after(2, 0),
	}
}

func parseVersion(v string) (major, minor int) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) >= 2 {
		major, _ = strconv.Atoi(parts[0])
		minor, _ = strconv.Atoi(parts[1])
	}
	return major, minor
}

// StartContainerd starts a private containerd under a fresh short temp dir, waits
// until CRI answers Version and reports the runtime ready, and imports the images.
// On error everything started is cleaned up again.
func StartContainerd(ctx context.Context, opts ContainerdOptions) (*Containerd, error) {
	if opts.Tools == nil {
		return nil, errors.New("ContainerdOptions.Tools is required")
	}
	if opts.RuntimeBinary == "" {
		opts.RuntimeBinary = opts.Tools.Runc
	}
	if opts.SandboxImage == "" {
		opts.SandboxImage = BusyboxImage
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	// Short, so that unix socket paths stay far below 108 bytes.
	dir, err := os.MkdirTemp("", "nrie2e-")
	if err != nil {
		return nil, err
	}
	c := &Containerd{
		Opts:            opts,
		Dir:             dir,
		Root:            filepath.Join(dir, "root"),
		State:           filepath.Join(dir, "state"),
		Address:         filepath.Join(dir, "c.sock"),
		NRISocket:       filepath.Join(dir, "nri.sock"),
		NRIPluginPath:   filepath.Join(dir, "nri", "plugins"),
		NRIPluginConfig: filepath.Join(dir, "nri", "conf.d"),
		CDISpecDir:      filepath.Join(dir, "cdi"),
		RuncRoot:        filepath.Join(dir, "runc"),
		ConfigPath:      filepath.Join(dir, "config.toml"),
		LogPath:         filepath.Join(dir, "containerd.log"),
		PodLogDir:       filepath.Join(dir, "pods"),
		features:        featuresFor(opts.Tools.ContainerdVersion),
	}
	if opts.Node != nil && opts.Node.NRISocket != "" {
		c.NRISocket = opts.Node.NRISocket
	}
	c.daemon = daemon{
		name: "containerd", version: opts.Tools.ContainerdVersion, dir: dir, address: c.Address, logPath: c.LogPath,
		argv:    []string{opts.Tools.Containerd, "--config", c.ConfigPath},
		env:     daemonEnv(opts.Tools.Dirs(), nil, opts.Env...),
		sockets: []string{c.Address, c.Address + ".ttrpc", c.NRISocket},
		runc:    opts.Tools.Runc, podLogDir: c.PodLogDir, ns: opts.Node.namespaces(), startTimeout: opts.StartTimeout,
	}
	// Who owns this dir, for ReapStale.
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for _, d := range []string{c.Root, c.State, c.NRIPluginPath, c.NRIPluginConfig, c.CDISpecDir, c.RuncRoot, c.PodLogDir,
		filepath.Join(dir, "tmp"), filepath.Join(dir, "s"), filepath.Join(dir, "opt"), filepath.Join(dir, "cni", "bin"), filepath.Join(dir, "cni", "conf")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	cfg, err := c.config()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := os.WriteFile(c.ConfigPath, cfg, 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	start := time.Now()
	var imgs []*Image
	if opts.Images != nil {
		imgs = append(imgs, opts.Images.All()...)
	}
	imgs = append(imgs, opts.ExtraImages...)
	if err := c.ImportImages(ctx, imgs...); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	c.ImportDuration = time.Since(start)
	return c, nil
}

// config renders the containerd config (version 3, containerd 2.x; version
// 2 for containerd 1.x).
func (c *Containerd) config() ([]byte, error) {
	o := c.Opts
	if c.features.configV2 {
		return c.configV2()
	}
	runtime := map[string]any{
		"restrict_oom_score_adj": true, // this machine lacks CAP_SYS_RESOURCE
		"cdi_spec_dirs":          o.Node.cdiDirs(c.CDISpecDir),
		"cni":                    c.cniConfig(),
		"containerd": map[string]any{
			"default_runtime_name": "runc",
			"runtimes":             map[string]any{"runc": c.runcRuntime()},
		},
	}
	if c.features.enableCDIKey {
		runtime["enable_cdi"] = true
	}
	if c.Opts.Node != nil {
		// Pods' network namespaces under the private state dir, not the
		// node's /run/netns.
		runtime["netns_mounts_under_state_dir"] = true
	}
	nri := c.nriConfig()
	if o.DefaultValidator {
		nri["default_validator"] = map[string]any{"enable": true}
	}
	plugins := map[string]any{
		"io.containerd.internal.v1.opt": map[string]any{"path": filepath.Join(c.Dir, "opt")},
		"io.containerd.cri.v1.images": map[string]any{
			"snapshotter":   "native",
			"pinned_images": map[string]any{"sandbox": o.SandboxImage},
		},
		"io.containerd.cri.v1.runtime": runtime,
		"io.containerd.grpc.v1.cri": map[string]any{
			"stream_server_address": "127.0.0.1",
			"stream_server_port":    "0",
		},
		"io.containerd.nri.v1.nri": nri,
		"io.containerd.transfer.v1.local": map[string]any{
			"unpack_config": []any{map[string]any{"platform": "linux/" + goarch(), "snapshotter": "native"}},
		},
	}
	if c.features.shimSocketDir {
		plugins["io.containerd.shim.v1.manager"] = map[string]any{"socket_dir": filepath.Join(c.Dir, "s")}
	}
	cfg := c.document(3, plugins)
	return c.render(cfg)
}

// cniConfig is the CRI plugin's cni table: the node's CNI plugins and
// configuration, or empty private directories (host-network pods only).
func (c *Containerd) cniConfig() map[string]any {
	bins, conf := []string{filepath.Join(c.Dir, "cni", "bin")}, filepath.Join(c.Dir, "cni", "conf")
	if n := c.Opts.Node; n != nil && n.CNIConfDir != "" {
		bins, conf = n.CNIBinDirs, n.CNIConfDir
	}
	return map[string]any{"bin_dirs": bins, "conf_dir": conf}
}

// render merges ExtraConfig over cfg and encodes it.
func (c *Containerd) render(cfg map[string]any) ([]byte, error) {
	if strings.TrimSpace(c.Opts.ExtraConfig) != "" {
		var extra map[string]any
		if err := toml.Unmarshal([]byte(c.Opts.ExtraConfig), &extra); err != nil {
			return nil, fmt.Errorf("ExtraConfig: %w", err)
		}
		mergeTOML(cfg, extra)
	}
	return toml.Marshal(cfg)
}

// mergeTOML merges src into dst: tables recursively, everything else replaced.
// document is a config's top level: version, containerd's private paths
// and sockets, the log level, and plugins.
func (c *Containerd) document(version int, plugins map[string]any) map[string]any {
	level := "info"
	if c.Opts.Debug {
		level = "debug"
	}
	return map[string]any{
		"version": version,
		"root":    c.Root,
		"state":   c.State,
		"temp":    filepath.Join(c.Dir, "tmp"),
		"grpc":    map[string]any{"address": c.Address},
		"ttrpc":   map[string]any{"address": c.Address + ".ttrpc"},
		"debug":   map[string]any{"level": level},
		"plugins": plugins,
	}
}

// nriConfig is the NRI plugin's table (the same keys in versions 2 and 3):
// on unless DisableNRI, private socket and plugin directories, the
// timeouts when set.
func (c *Containerd) nriConfig() map[string]any {
	o := c.Opts
	nri := map[string]any{
		"disable":            o.DisableNRI,
		"socket_path":        c.NRISocket,
		"plugin_path":        c.NRIPluginPath,
		"plugin_config_path": c.NRIPluginConfig,
	}
	if o.NRIRegistrationTimeout > 0 {
		nri["plugin_registration_timeout"] = o.NRIRegistrationTimeout.String()
	}
	if o.NRIRequestTimeout > 0 {
		nri["plugin_request_timeout"] = o.NRIRequestTimeout.String()
	}
	return nri
}

// runcRuntime is the runc runtime entry: the cached shim running
// RuntimeBinary with a private runc root, cgroupfs.
func (c *Containerd) runcRuntime() map[string]any {
	return map[string]any{
		"runtime_type": "io.containerd.runc.v2",
		"runtime_path": c.Opts.Tools.Shim,
		"options": map[string]any{
			"BinaryName":    c.Opts.RuntimeBinary,
			"Root":          c.RuncRoot,
			"SystemdCgroup": false,
		},
	}
}

func mergeTOML(dst, src map[string]any) {
	for k, v := range src {
		if sv, ok := v.(map[string]any); ok {
			if dv, ok := dst[k].(map[string]any); ok {
				mergeTOML(dv, sv)
				continue
			}
		}
		dst[k] = v
	}
}

// Ctr runs ctr against this containerd, in the k8s.io namespace.
func (c *Containerd) Ctr(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"--address", c.Address, "--namespace", "k8s.io"}, args...)
	out, err := exec.CommandContext(ctx, c.Opts.Tools.Ctr, full...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ImportImages imports image tarballs into the k8s.io namespace, unpacked for the
// native snapshotter, and waits until CRI sees each of them.
func (c *Containerd) ImportImages(ctx context.Context, imgs ...*Image) error {
	// In parallel: most of an import is unpacking the layer.
	errs := make([]error, len(imgs))
	var wg sync.WaitGroup
	for i, img := range imgs {
		if img == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// --local: import in the client, unpacking into the snapshotter named
			// here (the same in containerd 2.2 and 2.4, whatever the transfer
			// service's unpack platforms are).
			args := []string{"images", "import", "--local", "--snapshotter", "native", img.Tar}
			if c.features.configV2 {
				// ctr 1.7 always imports in the client (no transfer service).
				args = slices.Delete(args, 2, 3)
			}
			_, errs[i] = c.Ctr(ctx, args...)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, img := range imgs {
		if img == nil {
			continue
		}
		if err := c.waitImage(ctx, img.Name); err != nil {
			return err
		}
	}
	return nil
}

func (c *Containerd) waitImage(ctx context.Context, ref string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.CRI().Image.ImageStatus(cctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		cancel()
		if err == nil && resp.GetImage() != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("CRI does not see image %s after import (err %v)\n--- containerd log ---\n%s", ref, err, c.LogTail(3000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
