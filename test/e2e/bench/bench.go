// Package bench measures what users feel of a GPU injector: how long a
// container takes to create and start. It runs every injection path side by
// side on one private containerd (test/e2e/harness) and one simulated
// 8-GPU node (test/simnode), in interleaved rounds whose order is shuffled
// each round, and reports medians and per-round paired ratios.
//
// The paths:
//
//   - baseline: no GPU request;
//   - floor: an NRI plugin returning a precomputed adjustment, nri-gpu's
//     own answer computed once at start (the least any NRI plugin can do);
//   - nri-gpu: the built plugin, as users run it;
//   - cdi: containerd's own CDI injection of the same edits;
//   - toolkit: a CDI spec shaped like `nvidia-ctk cdi generate` output with
//     the nvidia-cdi-hook createContainer hooks, resolved by containerd;
//   - nvidia-runtime: nvidia-container-runtime in CDI mode wrapping runc,
//     with the same spec, on a second runtime handler.
//
// Both NRI plugins (nri-gpu and the floor) are connected all the time, so
// every path pays the same NRI round trips.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// ToolkitVersion is the NVIDIA Container Toolkit release measured beside
// nri-gpu (nvidia-cdi-hook and nvidia-container-runtime).
const ToolkitVersion = "v1.20.2"

const (
	toolkitModule = "github.com/NVIDIA/nvidia-container-toolkit"
	// benchContainer is the name of every measured container.
	benchContainer = "bench"
	// nvidiaHandler is the runtime handler of nvidia-container-runtime.
	nvidiaHandler = "nvidia"
	// nvidiaAnnotationPrefix is the CDI annotation prefix
	// nvidia-container-runtime is configured for: not cdi.k8s.io/, which
	// containerd would resolve itself before the wrapper sees the spec.
	nvidiaAnnotationPrefix = "cdi.bench.nri-gpu.dev/"
	// defaultCaps is nri-gpu's default capability set.
	defaultCaps = "compute,utility"
	numGPUs     = 8
)

// Path kinds.
const (
	Baseline      = "baseline"
	Floor         = "floor"
	NRIGPU        = "nri-gpu"
	CDI           = "cdi"
	Toolkit       = "toolkit"
	NVIDIARuntime = "nvidia-runtime"
)

// MainPaths are the paths of the main table, in report order.
var MainPaths = []string{Baseline, Floor, NRIGPU, NRIGPUToolkitLayout, CDI, CDIToolkitLayout, Toolkit, NVIDIARuntime}

// Diagnostic floor paths, not measured by default: the floor's adjustment
// without its mounts (device nodes only), without its single-file mounts
// (device nodes and the library directory), and with the GSP firmware
// directory that firmware: auto leaves out on this machine's kernel.
const (
	FloorDevices = "floor-devices"
	FloorLibDir  = "floor-libdir"
	// FloorFirmware is the floor with firmware: mount, to show what the
	// GSP firmware mount costs where the kernel needs it.
	FloorFirmware = "floor-firmware"
	// FloorToolkitLayout is the floor with layout: toolkit, the binaries
	// one mount each at /usr/bin instead of one directory on PATH.
	FloorToolkitLayout = "floor-toolkit-layout"
)

// Paths of the toolkit layout (layout: toolkit, binaries at /usr/bin),
// beside the default layout's nri-gpu and cdi in the main table.
const (
	// NRIGPUToolkitLayout is nri-gpu restarted with layout: toolkit.
	NRIGPUToolkitLayout = "nri-gpu-toolkit-layout"
	// CDIToolkitLayout is containerd's own CDI of nri-gpu's edits with
	// layout: toolkit.
	CDIToolkitLayout = "cdi-toolkit-layout"
)

// DiagnosticPaths can be added to the main table with -paths (NRIGPUCopy,
// nri-gpu with its library cache of copies, is in copy.go).
var DiagnosticPaths = []string{FloorDevices, FloorLibDir, FloorFirmware, FloorToolkitLayout, NRIGPUCopy}

// Case is one kind of container measured: a path with a request.
type Case struct {
	Name string // row label, unique within a phase
	Path string // one of the path kinds
	GPUs int    // GPUs requested (0 for the baseline)
	Caps string // driver capabilities (nri-gpu's request); "" = default
	Mode string // nri-gpu libraryMode: "auto" or "files"
	// Strip makes a floor case return only part of the adjustment (see
	// fixedCase.Strip), to measure what each part costs.
	Strip string
}

func (c *Case) key() string {
	caps := c.Caps
	if caps == "" {
		caps = defaultCaps
	}
	k := fmt.Sprintf("%s-%dgpu-%s", c.Mode, c.GPUs, strings.ReplaceAll(caps, ",", "_"))
	if c.Strip != "" {
		k += "-strip-" + c.Strip
	}
	return k
}

// request is nri-gpu's annotation value for the case: GPUs 0..n-1 by
// index and the capabilities, in `docker run --gpus` syntax.
func (c *Case) request() string {
	var ids []string
	for i := 0; i < c.GPUs; i++ {
		ids = append(ids, fmt.Sprint(i))
	}
	dev := "device=" + strings.Join(ids, ",")
	if c.GPUs > 1 {
		dev = `"` + dev + `"`
	}
	caps := c.Caps
	if caps == "" {
		caps = defaultCaps
	}
	capf := "capabilities=" + caps
	if strings.Contains(caps, ",") {
		capf = `"` + capf + `"`
	}
	return dev + "," + capf
}

func (c *Case) toolkitDevices() []string {
	var d []string
	for i := 0; i < c.GPUs; i++ {
		d = append(d, fmt.Sprintf("%s=%d", toolkitKind, i))
	}
	return d
}

// Sample is one container's create, start, stop and remove times.
type Sample struct {
	Create, Start, Stop, Remove time.Duration
}

// CreateStart is create + start.
func (s Sample) CreateStart() time.Duration { return s.Create + s.Start }

// Total is create + start + stop + remove.
func (s Sample) Total() time.Duration { return s.Create + s.Start + s.Stop + s.Remove }

// Options configure Setup.
type Options struct {
	// NRIGPU is the nri-gpu binary (required).
	NRIGPU string
	// CacheDir is the tool cache (default harness.DefaultCacheDir()).
	CacheDir string
	// NVIDIARuntime adds nvidia-container-runtime (path 6): installs it and
	// configures the second runtime handler.
	NVIDIARuntime bool
	// Log receives progress lines (default stderr).
	Log io.Writer
	// Nice, when not 0, is the nice value given to containerd and the
	// plugins (and so to shims, runc and hooks), see Renice.
	Nice int
	// Runtime is the runtime measured, one of harness.Runtimes (default
	// harness.RuntimeContainerd24); NVIDIARuntime needs a containerd.
	Runtime string
}

// Env is a running benchmark setup: containerd, the simulated node and both
// NRI plugins.
type Env struct {
	Opts       Options
	Dir        string
	Node       *simnode.Node
	C          harness.Runtime
	Tools      *harness.Tools
	Hook       string // nvidia-cdi-hook
	NVRuntime  string // nvidia-container-runtime ("" when not installed)
	configs    map[string]string
	adj        map[string]*api.ContainerAdjustment
	toolkit    *cdiSpec
	fixedFile  string
	nriGPU     *proc
	nriGPUMode string
	// copyMount is CopyMode's libraryCacheMount, a bind mount ("" when
	// not mounted).
	copyMount string
	fixed     *proc
	pods      map[string]string
}

// proc is a plugin process with its output.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (e *Env) logf(format string, args ...any) {
	fmt.Fprintf(e.Opts.Log, "bench-e2e: "+format+"\n", args...)
}

// Setup installs what is missing, lays out an 8-GPU simulated node, writes
// the CDI specs, starts containerd and connects nri-gpu (libraryMode auto)
// and the floor plugin. Close undoes it all.
func Setup(ctx context.Context, o Options) (_ *Env, err error) {
	if o.Log == nil {
		o.Log = os.Stderr
	}
	if o.NRIGPU == "" {
		return nil, errors.New("bench: Options.NRIGPU is required")
	}
	e := &Env{Opts: o, configs: map[string]string{}, pods: map[string]string{}}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if o.Runtime == "" {
		o.Runtime = harness.RuntimeContainerd24
		e.Opts.Runtime = o.Runtime
	}
	if !slices.Contains(harness.Runtimes, o.Runtime) {
		return nil, fmt.Errorf("bench: unknown runtime %q (valid: %s)", o.Runtime, strings.Join(harness.Runtimes, ", "))
	}
	if o.NVIDIARuntime && o.Runtime == harness.RuntimeCRIO {
		return nil, errors.New("bench: the nvidia-runtime path runs on containerd only")
	}
	// ContainerdVersionOf is "" for CRI-O: the default tools (runc).
	if e.Tools, err = harness.InstallTools(ctx, o.CacheDir, harness.ContainerdVersionOf(o.Runtime)); err != nil {
		return nil, err
	}
	imgs, err := harness.BuildImages(ctx, "")
	if err != nil {
		return nil, err
	}
	cache := o.CacheDir
	if cache == "" {
		cache = harness.DefaultCacheDir()
	}
	tkDir := filepath.Join(cache, "nvidia-container-toolkit-"+ToolkitVersion)
	if e.Hook, err = harness.GoInstall(ctx, tkDir, toolkitModule+"/cmd/nvidia-cdi-hook@"+ToolkitVersion, "nvidia-cdi-hook", nil, nil); err != nil {
		return nil, err
	}
	if o.NVIDIARuntime {
		if e.NVRuntime, err = harness.GoInstall(ctx, tkDir, toolkitModule+"/cmd/nvidia-container-runtime@"+ToolkitVersion, "nvidia-container-runtime", nil, nil); err != nil {
			return nil, err
		}
	}

	if e.Dir, err = os.MkdirTemp("", "nri-gpu-bench-"); err != nil {
		return nil, err
	}
	// The simulated node runs this machine's kernel, which decides
	// whether nri-gpu mounts the GSP firmware (firmware: auto).
	kernel, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return nil, err
	}
	if e.Node, err = simnode.Generate(filepath.Join(e.Dir, "node"), simnode.Options{NumGPUs: numGPUs, DeviceNodes: true, Layout: simnode.LayoutRHEL, KernelRelease: strings.TrimSpace(string(kernel))}); err != nil {
		return nil, err
	}
	for _, mode := range []string{"auto", "files", EmitCDIMode, FirmwareMountMode, ToolkitLayoutMode} { // and CopyMode below
		p := filepath.Join(e.Dir, "nri-gpu-"+mode+".yaml")
		data := fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\nlibraryMode: %s\n", e.Node.Root, e.Node.Root, mode)
		switch mode {
		case FirmwareMountMode:
			data = fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\nfirmware: mount\n", e.Node.Root, e.Node.Root)
		case ToolkitLayoutMode:
			data = fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\nlayout: toolkit\n", e.Node.Root, e.Node.Root)
		case EmitCDIMode:
			// libraryMode auto, answering with CDI device references
			// that containerd resolves from the spec in its spec
			// directory, which nri-gpu reads under hostRoot.
			data = fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\nemit: cdi\ncdiSpecDirs: [/var/run/cdi]\n", e.Node.Root, e.Node.Root)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			return nil, err
		}
		e.configs[mode] = p
	}
	copyCfg, err := e.setupCopyCache()
	if err != nil {
		return nil, err
	}
	e.configs[CopyMode] = filepath.Join(e.Dir, "nri-gpu-"+CopyMode+".yaml")
	if err := os.WriteFile(e.configs[CopyMode], []byte(copyCfg), 0o644); err != nil {
		return nil, err
	}
	if e.toolkit, err = toolkitSpec(e.Node, e.Hook); err != nil {
		return nil, err
	}

	copts := harness.ContainerdOptions{Tools: e.Tools, Images: imgs}
	if o.NVIDIARuntime {
		if err := e.configureNVIDIARuntime(&copts); err != nil {
			return nil, err
		}
	}
	var pid int
	if o.Runtime == harness.RuntimeCRIO {
		ct, err := harness.InstallCRIO(ctx, o.CacheDir)
		if err != nil {
			return nil, err
		}
		e.logf("starting CRI-O %s", ct.Version)
		c, err := harness.StartCRIO(ctx, harness.CRIOOptions{Tools: e.Tools, CRIO: ct, Images: imgs})
		if err != nil {
			return nil, err
		}
		e.C, pid = c, c.PID()
	} else {
		e.logf("starting containerd %s", e.Tools.ContainerdVersion)
		c, err := harness.StartContainerd(ctx, copts)
		if err != nil {
			return nil, err
		}
		e.C, pid = c, c.PID()
	}
	if o.Nice != 0 {
		if err := Renice(pid, o.Nice); err != nil {
			return nil, fmt.Errorf("renice the runtime: %w", err)
		}
	}
	if err := writeSpec(e.C.CDIDir(), "nvidia.json", e.toolkit); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(e.Node.Root, "var/run"), 0o755); err != nil {
		return nil, err
	}
	if err := os.Symlink(e.C.CDIDir(), filepath.Join(e.Node.Root, "var/run/cdi")); err != nil {
		return nil, err
	}
	if err := e.StartNRIGPU("auto"); err != nil {
		return nil, err
	}
	return e, nil
}

// EmitCDIMode is the nri-gpu mode of the emit-cdi phase: the default
// configuration with emit: cdi.
const EmitCDIMode = "emit-cdi"

// FirmwareMountMode is the default configuration with firmware: mount.
const FirmwareMountMode = "firmware-mount"

// ToolkitLayoutMode is the default configuration with layout: toolkit
// (binaries at /usr/bin, one mount each).
const ToolkitLayoutMode = "toolkit-layout"

// benchBinDir is the default layout's binary directory: nvidia-docker
// 1.0's place, still on the PATH of nvidia/cuda images.
const benchBinDir = "/usr/local/nvidia/bin"

// useEmitCDISpec puts nri-gpu's own generated CDI spec (kind
// nvidia.com/gpu) in containerd's spec directory for the emit-cdi phase,
// setting the toolkit's spec of the same kind aside (two specs defining
// the same devices would make them unresolvable); on false it restores the
// toolkit's.
func (e *Env) useEmitCDISpec(on bool) error {
	toolkit := filepath.Join(e.C.CDIDir(), "nvidia.json")
	ours := filepath.Join(e.C.CDIDir(), "nri-gpu.yaml")
	if !on {
		os.Remove(ours)
		if _, err := os.Stat(toolkit + ".off"); err == nil {
			return os.Rename(toolkit+".off", toolkit)
		}
		return nil
	}
	if err := os.Rename(toolkit, toolkit+".off"); err != nil && !os.IsNotExist(err) {
		return err
	}
	out, err := exec.Command(e.Opts.NRIGPU, "cdi", "generate", "--config", e.configs[EmitCDIMode], "-o", ours).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nri-gpu cdi generate: %v\n%s", err, out)
	}
	// containerd's CDI cache picks new spec files up asynchronously.
	time.Sleep(500 * time.Millisecond)
	return nil
}

// configureNVIDIARuntime writes nvidia-container-runtime's config.toml (CDI
// mode, our spec dir, runc, our annotation prefix) and adds the "nvidia"
// runtime handler to containerd.
func (e *Env) configureNVIDIARuntime(o *harness.ContainerdOptions) error {
	specDir := filepath.Join(e.Dir, "cdi-nvidia")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		return err
	}
	if err := writeSpec(specDir, "nvidia.json", e.toolkit); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`[nvidia-container-runtime]
debug = %q
log-level = "info"
mode = "cdi"
runtimes = [%q]

[nvidia-container-runtime.modes.cdi]
spec-dirs = [%q]
default-kind = %q
annotation-prefixes = [%q]
`, filepath.Join(e.Dir, "nvidia-container-runtime.log"), e.Tools.Runc, specDir, toolkitKind, nvidiaAnnotationPrefix)
	cfgPath := filepath.Join(e.Dir, "nvidia-container-runtime.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	runcRoot := filepath.Join(e.Dir, "runc-nvidia")
	cri := "'io.containerd.cri.v1.runtime'"
	if strings.HasPrefix(e.Tools.ContainerdVersion, "v1.") {
		cri = `"io.containerd.grpc.v1.cri"` // config version 2
	}
	o.ExtraConfig = strings.ReplaceAll(fmt.Sprintf(`
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%s]
runtime_type = "io.containerd.runc.v2"
runtime_path = %q
container_annotations = [%q]

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%s.options]
BinaryName = %q
Root = %q
SystemdCgroup = false
`, nvidiaHandler, e.Tools.Shim, nvidiaAnnotationPrefix+"*", nvidiaHandler, e.NVRuntime, runcRoot), "'io.containerd.cri.v1.runtime'", cri)
	// The shims inherit containerd's environment and pass it on to the
	// runtime binary.
	o.Env = append(o.Env, "NVIDIA_CTK_CONFIG_FILE_PATH="+cfgPath)
	return nil
}

// startProc starts a plugin process and waits until its output holds ready.
func startProc(cmd *exec.Cmd, ready string) (*proc, error) {
	p := &proc{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(p.done) }() // its exit shows in the output
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.out.String(), ready) {
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited:\n%s", cmd.Path, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s not ready after 60s:\n%s", cmd.Path, p.out.String())
		}
	}
	return p, nil
}

func (p *proc) stop() {
	if p == nil {
		return
	}
	// A process that already exited has nothing to signal: done is closed.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// StartNRIGPU (re)starts nri-gpu with libraryMode mode ("auto" or
// "files") and waits until containerd has synchronized it.
func (e *Env) StartNRIGPU(mode string) error {
	if e.nriGPU != nil && e.nriGPUMode == mode {
		return nil
	}
	e.nriGPU.stop()
	e.nriGPU = nil
	if err := e.useEmitCDISpec(mode == EmitCDIMode); err != nil {
		return err
	}
	p, err := startProc(exec.Command(e.Opts.NRIGPU, "run", "--config", e.configs[mode], "--socket", e.C.NRISocketPath()), "synchronized with the runtime")
	if err != nil {
		return fmt.Errorf("nri-gpu (libraryMode %s): %w", mode, err)
	}
	e.nriGPU, e.nriGPUMode = p, mode
	if e.Opts.Nice != 0 {
		if err := Renice(p.cmd.Process.Pid, e.Opts.Nice); err != nil {
			return fmt.Errorf("renice nri-gpu: %w", err)
		}
	}
	e.logf("nri-gpu connected (libraryMode %s)", mode)
	return nil
}

// Prepare computes, once, the fixed adjustments the cases need (nri-gpu's
// own answers), writes the CDI spec with the same edits, and (re)starts
// the floor plugin with them.
func (e *Env) Prepare(cases []*Case) error {
	var fixed []fixedCase
	seen := map[string]bool{}
	for _, c := range cases {
		if c.Path != Floor && c.Path != CDI {
			continue
		}
		if k := c.key(); !seen[k] {
			seen[k] = true
			fixed = append(fixed, fixedCase{Key: k, Config: e.configs[c.Mode], Request: c.request(), Strip: c.Strip})
		}
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	adj, err := computeAdjustments(fixed, log)
	if err != nil {
		return err
	}
	e.adj = adj
	spec := &cdiSpec{Version: "0.6.0", Kind: adjustmentKind}
	for _, f := range fixed {
		spec.Devices = append(spec.Devices, adjustmentDevice(f.Key, adj[f.Key]))
	}
	if err := writeSpec(e.C.CDIDir(), "nri-gpu-adjustment.json", spec); err != nil {
		return err
	}
	e.fixedFile = filepath.Join(e.Dir, "fixed.json")
	b, _ := json.Marshal(fixedFile{Socket: e.C.NRISocketPath(), Cases: fixed})
	if err := os.WriteFile(e.fixedFile, b, 0o644); err != nil {
		return err
	}
	e.fixed.stop()
	e.fixed = nil
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), FixedPluginEnv+"="+e.fixedFile)
	if e.fixed, err = startProc(cmd, "bench-fixed: synchronized with the runtime"); err != nil {
		return fmt.Errorf("floor plugin: %w", err)
	}
	if e.Opts.Nice != 0 {
		if err := Renice(e.fixed.cmd.Process.Pid, e.Opts.Nice); err != nil {
			return fmt.Errorf("renice the floor plugin: %w", err)
		}
	}
	e.logf("floor plugin connected with %d precomputed adjustments", len(adj))
	// containerd's CDI cache picks new spec files up asynchronously.
	time.Sleep(500 * time.Millisecond)
	return nil
}

// Close stops the plugins and containerd and removes the node.
func (e *Env) Close() {
	e.fixed.stop()
	e.nriGPU.stop()
	if e.C != nil {
		if err := e.C.Stop(); err != nil {
			e.logf("cleanup: %v", err)
		}
	}
	e.unmountCopyCache()
	if e.Dir != "" {
		if e.Tools != nil {
			if err := harness.CleanupDir(filepath.Join(e.Dir, "runc-nvidia"), e.Tools.Runc); err != nil {
				e.logf("cleaning up: %v", err)
			}
		}
		os.RemoveAll(e.Dir)
	}
}

// podFor returns the pod of a case, creating it on first use.
func (e *Env) podFor(ctx context.Context, c *Case) (string, error) {
	if id, ok := e.pods[c.Name]; ok {
		return id, nil
	}
	ann := map[string]string{}
	var po harness.PodOptions
	switch c.Path {
	case Floor:
		ann[FixedAnnotation] = c.key()
	case NRIGPU:
		ann["gpus.nri-gpu.dev/container."+benchContainer] = c.request()
	case NVIDIARuntime:
		po.RuntimeHandler = nvidiaHandler
	}
	name := "bench-" + regexp.MustCompile(`[^a-z0-9-]+`).ReplaceAllString(strings.ToLower(c.Name), "-")
	id, err := e.C.CRI().RunPodWith(ctx, name, ann, po)
	if err != nil {
		return "", err
	}
	e.pods[c.Name] = id
	return id, nil
}

func (e *Env) containerSpec(c *Case) harness.ContainerSpec {
	s := harness.ContainerSpec{Name: benchContainer, Image: harness.GlibcImage, Command: []string{"sleep", "3600"}}
	switch c.Path {
	case CDI:
		s.CDIDevices = []string{adjustmentKind + "=" + c.key()}
	case Toolkit:
		s.CDIDevices = c.toolkitDevices()
	case NVIDIARuntime:
		s.Annotations = map[string]string{nvidiaAnnotationPrefix + "gpus": strings.Join(c.toolkitDevices(), ",")}
	}
	return s
}

// once creates, starts, stops and removes one container of case c; with
// check it also verifies, while the container runs, that it got what the
// case asks for.
func (e *Env) once(ctx context.Context, c *Case, check bool) (Sample, string, error) {
	cri := e.C.CRI()
	pod, err := e.podFor(ctx, c)
	if err != nil {
		return Sample{}, "", err
	}
	var s Sample
	t0 := time.Now()
	id, err := cri.CreateContainer(ctx, pod, e.containerSpec(c))
	t1 := time.Now()
	if err != nil {
		return s, "", fmt.Errorf("%s: %w", c.Name, err)
	}
	err = cri.Start(ctx, id)
	t2 := time.Now()
	var info string
	if err == nil && check {
		info, err = e.verify(ctx, c, id)
	}
	t3 := time.Now()
	serr := cri.StopContainer(ctx, id, 0)
	t4 := time.Now()
	rerr := cri.RemoveContainer(ctx, id)
	t5 := time.Now()
	s = Sample{Create: t1.Sub(t0), Start: t2.Sub(t1), Stop: t4.Sub(t3), Remove: t5.Sub(t4)}
	if err = errors.Join(err, serr, rerr); err != nil {
		return s, info, fmt.Errorf("%s: %w", c.Name, err)
	}
	return s, info, nil
}

var gpuNode = regexp.MustCompile(`^nvidia[0-9]+$`)

// verify checks from inside the running container that it has exactly the
// GPU nodes the case asks for, and that the driver libraries load; it
// returns a one-line description of what the container got.
func (e *Env) verify(ctx context.Context, c *Case, id string) (string, error) {
	cri := e.C.CRI()
	spec, err := cri.RuntimeSpec(ctx, id)
	if err != nil {
		return "", err
	}
	hooks := 0
	if spec.Hooks != nil {
		hooks = len(spec.Hooks.CreateContainer) + len(spec.Hooks.CreateRuntime) + len(spec.Hooks.Prestart) + //nolint:staticcheck // old runtimes still run prestart hooks: count them
			len(spec.Hooks.StartContainer)
	}
	devs := 0
	if spec.Linux != nil {
		devs = len(spec.Linux.Devices)
	}
	out, _, _, err := cri.Exec(ctx, id, "ls", "/dev")
	if err != nil {
		return "", err
	}
	gpus := 0
	for _, f := range strings.Fields(out) {
		if gpuNode.MatchString(f) {
			gpus++
		}
	}
	if c.Path == NVIDIARuntime {
		// The wrapper edits the spec runc gets, not the one containerd
		// keeps: count what the container really has.
		m, _, _, err := cri.Exec(ctx, id, "cat", "/proc/self/mountinfo")
		if err != nil {
			return "", err
		}
		info := fmt.Sprintf("%d GPU nodes, %d mountinfo lines (spec edited by the wrapper)", gpus, strings.Count(m, "\n"))
		if err := e.checkLDCache(ctx, id); err != nil {
			return info, fmt.Errorf("%s: %w", c.Name, err)
		}
		info += ", ld.so.cache updated by the hook"
		if gpus != c.GPUs {
			return info, fmt.Errorf("%s: container sees %d GPU nodes, want %d\n%s", c.Name, gpus, c.GPUs, out)
		}
		return info, e.checkLibs(ctx, c, id)
	}
	info := fmt.Sprintf("%d GPU nodes, %d devices, %d mounts, %d hooks", gpus, devs, len(spec.Mounts), hooks)
	if c.Path == Toolkit {
		if err := e.checkLDCache(ctx, id); err != nil {
			return info, fmt.Errorf("%s: %w", c.Name, err)
		}
		info += ", ld.so.cache updated by the hook"
	}
	if gpus != c.GPUs {
		return info, fmt.Errorf("%s: container sees %d GPU nodes, want %d\n%s", c.Name, gpus, c.GPUs, out)
	}
	if c.Caps == "" && c.Strip == "" && c.GPUs > 0 && (c.Path == Floor || c.Path == NRIGPU || c.Path == CDI) {
		// nvidia-smi runs by name: from the directory on PATH in the
		// default layout, from /usr/bin in the toolkit layout (and with
		// emit: cdi, whose spec uses it).
		dir, what := benchBinDir, ", binaries on PATH"
		if c.Mode == ToolkitLayoutMode || c.Mode == EmitCDIMode {
			dir, what = "/usr/bin", ", binaries at /usr/bin"
		}
		smi, _, code, err := cri.Exec(ctx, id, "sh", "-c", "command -v nvidia-smi && nvidia-smi")
		if err != nil || code != 0 || !strings.HasPrefix(smi, dir+"/nvidia-smi") {
			return info, fmt.Errorf("%s: nvidia-smi not run from %s: %q (exit %d, %v)", c.Name, dir, smi, code, err)
		}
		info += what
	}
	if c.Mode == CopyMode {
		more, err := e.checkCopyMount(ctx, c, id)
		if err != nil {
			return info, err
		}
		info += more
	}
	return info, e.checkLibs(ctx, c, id)
}

// checkLDCache checks that the update-ldcache hook of the toolkit ran: the
// image's /etc/ld.so.cache lists glibc only, so libcuda.so.1 in it comes from
// the hook (which runs the host's ldconfig on the container's root).
func (e *Env) checkLDCache(ctx context.Context, id string) error {
	out, _, code, err := e.C.CRI().Exec(ctx, id, "grep", "-c", "libcuda.so.1", "/etc/ld.so.cache")
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("libcuda.so.1 is not in the container's /etc/ld.so.cache: the update-ldcache hook did not run (%q)", out)
	}
	return nil
}

// checkLibs runs gpucheck in the container: NVML for every GPU case, CUDA
// too when the case has the compute capability (the toolkit paths always
// inject every library).
func (e *Env) checkLibs(ctx context.Context, c *Case, id string) error {
	if c.GPUs == 0 || c.Strip == "mounts" { // no libraries to load
		return nil
	}
	args := []string{"gpucheck", "nvml"}
	caps := c.Caps
	if caps == "" {
		caps = defaultCaps
	}
	if strings.Contains(caps, "compute") || caps == "all" || c.Path == Toolkit || c.Path == NVIDIARuntime {
		args = append(args, "cuda")
	}
	out, errOut, code, err := e.C.CRI().Exec(ctx, id, args...)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("%s: %v in the container exited %d:\n%s%s", c.Name, args, code, out, errOut)
	}
	return nil
}

// Result holds the samples of one phase, by case and round.
type Result struct {
	Cases   []*Case
	Samples map[string][]Sample // by case name; index = round
	Info    map[string]string   // by case name: what the container got
}

// Run measures cases in rounds after one warm-up round (which also
// verifies every case): each round runs every case once, in an order
// shuffled per round. nri-gpu runs in one mode at a time: when a case
// needs it in another mode than it runs in (the main table's nri-gpu and
// nri-gpu-copy), Run restarts it in that mode and runs one unmeasured
// container of the case first, so that no measured container is the first
// a fresh process serves.
func (e *Env) Run(ctx context.Context, cases []*Case, rounds int) (*Result, error) {
	r := &Result{Cases: cases, Samples: map[string][]Sample{}, Info: map[string]string{}}
	switchTo := func(c *Case) error {
		if c.Path != NRIGPU || c.Mode == e.nriGPUMode {
			return nil
		}
		if err := e.StartNRIGPU(c.Mode); err != nil {
			return err
		}
		_, _, err := e.once(ctx, c, false)
		return err
	}
	for _, c := range cases {
		if err := switchTo(c); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		_, info, err := e.once(ctx, c, true)
		if err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		r.Info[c.Name] = info
		e.logf("  %-28s %s", c.Name, info)
	}
	order := append([]*Case(nil), cases...)
	start := time.Now()
	for round := 0; round < rounds; round++ {
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, c := range order {
			if err := switchTo(c); err != nil {
				return nil, fmt.Errorf("round %d: %w", round, err)
			}
			s, _, err := e.once(ctx, c, false)
			if err != nil {
				return nil, fmt.Errorf("round %d: %w", round, err)
			}
			r.Samples[c.Name] = append(r.Samples[c.Name], s)
		}
		if (round+1)%10 == 0 || round+1 == rounds {
			e.logf("  round %d/%d (%s)", round+1, rounds, time.Since(start).Round(time.Second))
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Stat is a distribution summary.
type Stat struct{ P10, P50, P90 float64 }

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	pos := q * float64(len(s)-1)
	lo := int(pos)
	if lo+1 >= len(s) {
		return s[lo]
	}
	return s[lo] + (s[lo+1]-s[lo])*(pos-float64(lo))
}

func stat(xs []float64) Stat { return Stat{quantile(xs, 0.1), quantile(xs, 0.5), quantile(xs, 0.9)} }

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// Metric picks one time of a sample.
type Metric func(Sample) time.Duration

// Metrics reported.
var (
	Create      Metric = func(s Sample) time.Duration { return s.Create }
	Start       Metric = func(s Sample) time.Duration { return s.Start }
	CreateStart Metric = Sample.CreateStart
	Total       Metric = Sample.Total
)

// Stat summarizes metric m of case name in milliseconds.
func (r *Result) Stat(name string, m Metric) Stat {
	var xs []float64
	for _, s := range r.Samples[name] {
		xs = append(xs, ms(m(s)))
	}
	return stat(xs)
}

// Ratio is the median over rounds of metric m of case name divided by the
// same metric of case ref in the same round (paired), with the 95%
// confidence interval of that median (distribution-free, from order
// statistics).
func (r *Result) Ratio(name, ref string, m Metric) (p50, lo, hi float64) {
	a, b := r.Samples[name], r.Samples[ref]
	var xs []float64
	for i := range min(len(a), len(b)) {
		if d := m(b[i]); d > 0 {
			xs = append(xs, float64(m(a[i]))/float64(d))
		}
	}
	lo, hi = medianCI(xs)
	return quantile(xs, 0.5), lo, hi
}

// medianCI is the 95% confidence interval of the median of xs: the order
// statistics n/2 -+ 0.98 sqrt(n) (normal approximation of the binomial).
func medianCI(xs []float64) (lo, hi float64) {
	n := len(xs)
	if n == 0 {
		return 0, 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	h := 0.98 * math.Sqrt(float64(n))
	i := max(int(math.Floor(float64(n)/2-h)), 0)
	j := min(int(math.Ceil(float64(n)/2+h)), n-1)
	return s[i], s[j]
}
