// Package integration runs the built nri-gpu binary as a real plugin process
// against NRI's runtime side (github.com/containerd/nri/pkg/adaptation, the
// code containerd and CRI-O embed) over a real socket, on a simulated node.
package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	rgen "github.com/opencontainers/runtime-tools/generate"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// binary is the nri-gpu binary under test, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if b := os.Getenv("NRI_GPU_BIN"); b != "" {
		binary = b
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "nri-gpu-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "nri-gpu")
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-race", "-o", binary, "./cmd/nri-gpu")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building nri-gpu:", err)
		return 1
	}
	return m.Run()
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the simulated node has real device nodes (mknod); CI runs as root")
	}
}

// runtimeSide is NRI's runtime side started in the test process.
//
// Plugins reach it through a proxy on socket, so that stopping it closes
// their connections as a runtime that exits does (an in-process Adaptation
// leaves external plugins' connections open when stopped).
type runtimeSide struct {
	t      *testing.T
	dir    string
	socket string
	nri    *nri.Adaptation
	synced chan string // receives a value each time a plugin synchronizes
	proxy  *proxy
	// kept are the pods and containers the runtime has, passed to plugins
	// when they synchronize.
	kept *store
}

// proxy forwards unix socket connections from one path to another, and
// drops them all when closed.
type proxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startProxy(t *testing.T, from, to string) *proxy {
	t.Helper()
	os.Remove(from)
	l, err := net.Listen("unix", from)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("unix", to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) close() {
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// startRuntime starts an adaptation on a short temporary socket path.
func startRuntime(t *testing.T, dir string) *runtimeSide {
	t.Helper()
	return startRuntimeWith(t, dir, newStore())
}

// startRuntimeWith starts an adaptation that has the pods and containers
// of kept (those of a runtime that restarted, say), with options.
func startRuntimeWith(t *testing.T, dir string, kept *store, opts ...nri.Option) *runtimeSide {
	t.Helper()
	return startRuntimeAs(t, dir, "test-runtime", "0.0.1", kept, opts...)
}

// startRuntimeAs is startRuntimeWith for a runtime that names itself name
// and version in Configure, as containerd and CRI-O do.
func startRuntimeAs(t *testing.T, dir, name, version string, kept *store, opts ...nri.Option) *runtimeSide {
	t.Helper()
	r := &runtimeSide{t: t, dir: dir, socket: filepath.Join(dir, "nri.sock"), synced: make(chan string, 16), kept: kept}
	for _, d := range []string{"plugins", "conf.d"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	syncFn := func(ctx context.Context, cb nri.SyncCB) error {
		pods, ctrs := r.kept.list()
		_, err := cb(ctx, pods, ctrs)
		r.synced <- "synced"
		return err
	}
	updateFn := func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil }
	a, err := nri.New(name, version, syncFn, updateFn, append([]nri.Option{
		nri.WithPluginPath(filepath.Join(dir, "plugins")),
		nri.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		nri.WithSocketPath(filepath.Join(dir, "runtime.sock")),
	}, opts...)...)
	if err != nil {
		t.Fatalf("nri.New: %v", err)
	}
	if err := a.Start(); err != nil {
		t.Fatalf("starting NRI: %v", err)
	}
	// Start synchronizes the (pre-registered and built-in) plugins; what
	// counts from now on are the connections of external plugins.
	for len(r.synced) > 0 {
		<-r.synced
	}
	r.nri = a
	r.proxy = startProxy(t, r.socket, filepath.Join(dir, "runtime.sock"))
	return r
}

func (r *runtimeSide) stop() {
	r.nri.Stop()
	r.proxy.close()
}

// waitSynced waits for a plugin to connect and synchronize, then until
// the runtime has added it to the plugins it calls (just after the sync).
func (r *runtimeSide) waitSynced(timeout time.Duration) {
	r.t.Helper()
	select {
	case <-r.synced:
	case <-time.After(timeout):
		r.t.Fatal("the plugin did not connect and synchronize")
	}
	// The probe asks for the driver alone, so that it books no GPU and
	// works whatever the allocation table holds.
	r.waitAnswer(timeout, nil, "NVIDIA_VISIBLE_DEVICES=none")
}

// waitAnswer sends the probe request until the plugin answers it with
// device nodes.
func (r *runtimeSide) waitAnswer(timeout time.Duration, ann map[string]string, env ...string) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		adj, err := r.create(ann, "probe", env...)
		if err == nil && len(adj.GetLinux().GetDevices()) > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.t.Fatal("the plugin synchronized but does not answer")
}

// create sends a CreateContainer request as the runtime does.
func (r *runtimeSide) create(annotations map[string]string, name string, env ...string) (*api.ContainerAdjustment, error) {
	pod := &api.PodSandbox{Id: "pod-" + name, Name: "pod-" + name, Namespace: "default", Uid: "uid-" + name, Annotations: annotations}
	ctr := &api.Container{Id: "ctr-" + name, PodSandboxId: pod.Id, Name: name, Env: append([]string{"PATH=/usr/bin:/bin"}, env...)}
	rpl, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return nil, err
	}
	return rpl.GetAdjust(), nil
}

// pluginProc is a running nri-gpu process.
type pluginProc struct {
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan error
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

func startPlugin(t *testing.T, args ...string) *pluginProc {
	t.Helper()
	return startCommand(t, binary, args...)
}

// startCommand starts the plugin through another program (such as
// setpriv) that execs it.
func startCommand(t *testing.T, path string, args ...string) *pluginProc {
	t.Helper()
	p := &pluginProc{log: &syncBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(path, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
		if t.Failed() {
			t.Logf("plugin log:\n%s", p.log.String())
		}
	})
	return p
}

// simNode generates a 4-GPU node whose index order differs from its minor
// order, and writes a config file for it.
func simNode(t *testing.T, dir string, layout simnode.Layout, extraConfig ...string) (*simnode.Node, string) {
	t.Helper()
	n, err := simnode.Generate(filepath.Join(dir, "node"), simnode.Options{NumGPUs: 4, SwapMinors: true, DeviceNodes: true, Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	data := fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\n%s", n.Root, n.Root, strings.Join(extraConfig, ""))
	if err := os.WriteFile(cfg, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return n, cfg
}

func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// applyToSpec applies an adjustment to a default OCI spec the way
// containerd does (NRI's runtime-tools generator over runtime-tools').
func applyToSpec(t *testing.T, adj *api.ContainerAdjustment) *rspec.Spec {
	t.Helper()
	g, err := rgen.New("linux")
	if err != nil {
		t.Fatal(err)
	}
	g.ClearProcessEnv()
	g.AddProcessEnv("PATH", "/usr/bin:/bin")
	if err := nrigen.SpecGenerator(&g).Adjust(adj); err != nil {
		t.Fatalf("applying the adjustment: %v", err)
	}
	return g.Config
}

// TestCreateContainerOverNRI runs the plugin with each way of delivering
// libraries: one mount per library, and one mount of a prepared directory.
// The first runs on a RHEL 8 kernel (4.18: firmware is read through the
// root of the process that opens the GPU, so containers get it), the
// second on simnode's default 6.8 kernel (firmware read from the host's
// mount namespace, so containers go without it).
func TestCreateContainerOverNRI(t *testing.T) {
	needRoot(t)
	for _, mode := range []string{"files", "directory"} {
		t.Run(mode, func(t *testing.T) { testCreateContainerOverNRI(t, mode) })
	}
}

func testCreateContainerOverNRI(t *testing.T, mode string) {
	dir := shortTempDir(t)
	n, cfg := simNode(t, dir, simnode.LayoutRHEL, "libraryMode: "+mode+"\n")
	wantFirmware := mode == "files"
	if wantFirmware {
		if err := os.WriteFile(n.HostPath("/proc/sys/kernel/osrelease"), []byte("4.18.0-553.el8_10.x86_64\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := startRuntime(t, dir)
	defer r.stop()
	p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--log-level", "debug")
	r.waitSynced(20 * time.Second)

	t.Run("annotation device=0,2", func(t *testing.T) {
		adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/container.train": `"device=0,2"`}, "train")
		if err != nil {
			t.Fatalf("CreateContainer: %v", err)
		}
		g0, g2 := n.GPUs[0], n.GPUs[2]
		spec := applyToSpec(t, adj)
		checkDevices(t, spec, map[string][2]int64{
			fmt.Sprintf("/dev/nvidia%d", g0.Minor): {195, int64(g0.Minor)},
			fmt.Sprintf("/dev/nvidia%d", g2.Minor): {195, int64(g2.Minor)},
			"/dev/nvidiactl":                       {195, 255},
			"/dev/nvidia-uvm":                      {int64(n.UVMMajor), 0},
			"/dev/nvidia-uvm-tools":                {int64(n.UVMMajor), 1},
		})
		env := strings.Join(spec.Process.Env, "\n")
		if want := "NVIDIA_VISIBLE_DEVICES=" + g0.UUID + "," + g2.UUID; !strings.Contains(env, want) {
			t.Errorf("env lacks %s:\n%s", want, env)
		}
		if !strings.Contains(env, "LD_LIBRARY_PATH=/usr/local/nvidia/lib64") {
			t.Errorf("env lacks LD_LIBRARY_PATH:\n%s", env)
		}
		// The default layout: binaries in /usr/local/nvidia/bin, on PATH.
		if !strings.Contains("\n"+env+"\n", "\nPATH=/usr/bin:/bin:/usr/local/nvidia/bin\n") {
			t.Errorf("env lacks PATH with /usr/local/nvidia/bin appended:\n%s", env)
		}
		wantMounts := driverMounts(n, wantFirmware)
		if mode == "directory" {
			checkDirectories(t, spec, n, wantMounts)
		}
		checkMounts(t, spec, n, wantMounts)
		if !strings.Contains(p.log.String(), "injected") {
			t.Errorf("no injection log line in:\n%s", p.log.String())
		}
	})

	t.Run("env all", func(t *testing.T) {
		adj, err := r.create(nil, "cuda", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility")
		if err != nil {
			t.Fatal(err)
		}
		spec := applyToSpec(t, adj)
		var gpus int
		for _, d := range spec.Linux.Devices {
			if d.Major == 195 && d.Minor < 254 {
				gpus++
			}
			if strings.HasPrefix(d.Path, "/dev/nvidia-uvm") {
				t.Errorf("utility-only request got %s", d.Path)
			}
		}
		if gpus != 4 {
			t.Errorf("got %d GPU nodes, want 4", gpus)
		}
		for _, m := range spec.Mounts {
			if strings.Contains(m.Destination, "libcuda") || strings.Contains(m.Destination, "mps") {
				t.Errorf("utility-only request got compute file %s", m.Destination)
			}
		}
	})

	t.Run("no request and void", func(t *testing.T) {
		for _, env := range [][]string{nil, {"NVIDIA_VISIBLE_DEVICES=void"}, {"NVIDIA_VISIBLE_DEVICES="}} {
			adj, err := r.create(nil, "plain", env...)
			if err != nil {
				t.Fatal(err)
			}
			if len(adj.GetMounts()) > 0 || len(adj.GetLinux().GetDevices()) > 0 || len(adj.GetEnv()) > 0 {
				t.Errorf("env %q: container changed: %v", env, adj)
			}
		}
	})

	t.Run("bad requests fail with the plugin's message", func(t *testing.T) {
		for _, tc := range []struct {
			ann  map[string]string
			env  []string
			want string
		}{
			{map[string]string{"gpus.nri-gpu.dev/container.bad": "device=7"}, nil,
				`nri-gpu: annotation gpus.nri-gpu.dev/container.bad: unknown GPU "7" (node has 0-3)`},
			{map[string]string{"gpus.nri-gpu.dev/pod": "9"}, nil,
				`nri-gpu: annotation gpus.nri-gpu.dev/pod: count 9 exceeds the node's 4 GPUs (0-3)`},
			{map[string]string{"gpus.nri-gpu.dev/container.bad": "device=0,1"}, nil,
				`quote a device list that has commas`},
			{nil, []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,warp"},
				`nri-gpu: env NVIDIA_DRIVER_CAPABILITIES: unsupported capability "warp"`},
		} {
			adj, err := r.create(tc.ann, "bad", tc.env...)
			if err == nil {
				t.Errorf("%v %v: CreateContainer succeeded with %v", tc.ann, tc.env, adj)
				continue
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		}
	})

	t.Run("reconnects after a runtime restart", func(t *testing.T) {
		r.stop()
		time.Sleep(300 * time.Millisecond)
		r2 := startRuntime(t, dir)
		defer r2.stop()
		r2.waitSynced(20 * time.Second)
		adj, err := r2.create(map[string]string{"gpus.nri-gpu.dev/pod": "1"}, "again")
		if err != nil || len(adj.GetLinux().GetDevices()) == 0 {
			t.Fatalf("after reconnect: %v, %v", adj, err)
		}
		if !strings.Contains(p.log.String(), "reconnecting") {
			t.Errorf("no reconnection log line")
		}

		// SIGTERM stops the plugin cleanly.
		if err := stopPlugin(t, p); err != nil {
			t.Errorf("plugin exited with %v after SIGTERM", err)
		}
	})
}

// checkDevices checks the spec's device nodes against want (path ->
// major, minor): exactly those, character devices of mode 0666, each with
// its cgroup allow rule.
func checkDevices(t *testing.T, spec *rspec.Spec, want map[string][2]int64) {
	t.Helper()
	if len(spec.Linux.Devices) != len(want) {
		t.Errorf("spec has %d devices, want %d: %+v", len(spec.Linux.Devices), len(want), spec.Linux.Devices)
	}
	for _, d := range spec.Linux.Devices {
		w, ok := want[d.Path]
		if !ok || d.Type != "c" || d.Major != w[0] || d.Minor != w[1] || d.FileMode == nil || *d.FileMode != 0o666 {
			t.Errorf("unexpected device %+v (mode %v)", d, d.FileMode)
		}
		allowed := slices.ContainsFunc(spec.Linux.Resources.Devices, func(r rspec.LinuxDeviceCgroup) bool {
			return r.Allow && r.Type == "c" && r.Major != nil && *r.Major == d.Major && r.Minor != nil && *r.Minor == d.Minor && strings.Contains(r.Access, "rw")
		})
		if !allowed {
			t.Errorf("no cgroup allow rule for %s in %+v", d.Path, spec.Linux.Resources.Devices)
		}
	}
}

// driverMounts are the mounts (destination -> source) of the compute and
// utility files of the node's driver root, one by one, and its firmware
// when firmware is set.
func driverMounts(n *simnode.Node, firmware bool) map[string]string {
	want := map[string]string{}
	for _, f := range n.Files {
		switch f.Capability {
		case simnode.CapCompute, simnode.CapUtility:
			if f.SONAME != "" {
				want["/usr/local/nvidia/lib64/"+f.SONAME] = filepath.Join(n.Root, f.Path)
				if f.SONAME == "libcuda.so.1" { // and the development name -lcuda looks for
					want["/usr/local/nvidia/lib64/libcuda.so"] = filepath.Join(n.Root, f.Path)
				}
			} else {
				want["/usr/local/nvidia/bin/"+filepath.Base(f.Path)] = filepath.Join(n.Root, f.Path)
			}
		}
	}
	if firmware {
		want["/lib/firmware/nvidia/"+n.DriverVersion] = filepath.Join(n.Root, "usr/lib/firmware/nvidia", n.DriverVersion)
	}
	return want
}

// checkDirectories checks libraryMode: directory's mounts: the libraries
// and the binaries come as one directory each of the cache, holding hard
// links to exactly the files of want under it (libcuda.so a link to
// libcuda.so.1). It replaces those files in want by the directories.
func checkDirectories(t *testing.T, spec *rspec.Spec, n *simnode.Node, want map[string]string) {
	t.Helper()
	for _, dir := range []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/bin"} {
		var hostDir string
		for _, m := range spec.Mounts {
			if m.Destination == dir {
				hostDir = m.Source
			}
		}
		if !strings.HasPrefix(hostDir, filepath.Join(n.Root, "var/lib/nri-gpu")+"/") {
			t.Fatalf("%s mounted from %q, want a directory in the cache", dir, hostDir)
		}
		entries, _ := os.ReadDir(hostDir)
		files := 0
		for dst, src := range want {
			if name, ok := strings.CutPrefix(dst, dir+"/"); ok {
				files++
				if !sameFile(t, filepath.Join(hostDir, name), src) {
					t.Errorf("%s/%s is not %s", hostDir, name, src)
				}
				delete(want, dst)
			}
		}
		if len(entries) != files {
			t.Errorf("%s has %d entries, want %d", hostDir, len(entries), files)
		}
		want[dir] = hostDir
	}
}

// checkMounts checks the spec's mounts from the node against want
// (destination -> source): exactly those, read-only nosuid nodev binds.
// The default spec's own mounts (/proc, /dev, ...) are left out.
func checkMounts(t *testing.T, spec *rspec.Spec, n *simnode.Node, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, m := range spec.Mounts {
		if _, ok := want[m.Destination]; !ok && !strings.HasPrefix(m.Source, n.Root) {
			continue
		}
		got[m.Destination] = m.Source
		if m.Type != "bind" || !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "nosuid") || !slices.Contains(m.Options, "nodev") {
			t.Errorf("mount %s is not a read-only nosuid nodev bind: %+v", m.Destination, m)
		}
	}
	for dst, src := range want {
		if got[dst] != src {
			t.Errorf("mount %s: source %q, want %q", dst, got[dst], src)
		}
	}
	for dst := range got {
		if _, ok := want[dst]; !ok {
			t.Errorf("unexpected mount %s", dst)
		}
	}
}

// TestPreRegisteredPlugin installs nri-gpu as /opt/nri/plugins/10-nri-gpu
// with its config in /etc/nri/conf.d/10-nri-gpu.conf: the runtime starts
// it with the connection on a file descriptor and no PATH, and passes the
// config through Configure.
func TestPreRegisteredPlugin(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	n, cfg := simNode(t, dir, simnode.LayoutDebian)
	for _, d := range []string{"plugins", "conf.d"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins", "10-nri-gpu"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	conf, _ := os.ReadFile(cfg)
	if err := os.WriteFile(filepath.Join(dir, "conf.d", "10-nri-gpu.conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	r := startRuntime(t, dir)
	defer r.stop()
	adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/pod": "all"}, "pre")
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	var uuids []string
	for _, g := range n.GPUs {
		uuids = append(uuids, g.UUID)
	}
	found := false
	for _, e := range adj.GetEnv() {
		if e.Key == "NVIDIA_VISIBLE_DEVICES" {
			found = e.Value == strings.Join(uuids, ",")
		}
	}
	if !found {
		t.Errorf("pre-registered plugin did not inject all GPUs: %v", adj)
	}
}

// TestRunFailsOnBadConfig checks that `nri-gpu run` stops at start, naming
// the file and key, when its configuration is wrong.
func TestRunFailsOnBadConfig(t *testing.T) {
	dir := shortTempDir(t)
	for _, tc := range []struct{ name, cfg, want string }{
		{"unknown key", "hostRoot: /\ndriverRoots: /x\n", `unknown field "driverRoots"`},
		{"relative path", "hostRoot: host\n", `key hostRoot: "host" must be an absolute, clean path`},
		{"missing root", "hostRoot: /does/not/exist\n", `opening hostRoot`},
		{"bad sharing", "sharing: solo\n", `key sharing: unknown policy "solo" (valid: shared, exclusive)`},
		{"bad policy", "policy:\n  visibleDevices: sometimes\n", `key policy.visibleDevices: "sometimes" is not a valid mode (valid: allow, deny, namespaces)`},
		{"misspelt policy key", "policy:\n  envnamespaces: [a]\n", `key policy: unknown field "envnamespaces"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(dir, tc.name+".yaml")
			os.WriteFile(cfg, []byte(tc.cfg), 0o644)
			out, err := exec.Command(binary, "run", "--config", cfg, "--socket", filepath.Join(dir, "none.sock")).CombinedOutput()
			if err == nil {
				t.Fatalf("nri-gpu run succeeded:\n%s", out)
			}
			if !strings.Contains(string(out), tc.want) || (tc.name != "missing root" && !strings.Contains(string(out), cfg)) {
				t.Errorf("output does not name %q and the file:\n%s", tc.want, out)
			}
		})
	}
	out, err := exec.Command(binary, "run", "--config", filepath.Join(dir, "absent.yaml")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "absent.yaml") {
		t.Errorf("missing config file: %v\n%s", err, out)
	}
}

// sameFile reports whether a and b are the same file (inode).
func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err := os.Stat(a)
	if err != nil {
		t.Error(err)
		return false
	}
	fb, err := os.Stat(b)
	if err != nil {
		t.Error(err)
		return false
	}
	return os.SameFile(fa, fb)
}
