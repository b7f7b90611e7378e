package doctor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/plugin"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// fixture is a simulated node that passes every check: a 2-GPU driver,
// containerd's config.toml importing deploy/containerd's drop-ins (2.x
// defaults and the default validator), a listening NRI socket, and an
// nri-gpu that reports itself ready.
//
// Where this process cannot mknod (not root), the node's /dev/nvidia* are
// regular files (noNodes): then the "device nodes" check fails by
// construction, and the fixture passes every other check (see ok).
type fixture struct {
	n       *simnode.Node
	noNodes bool
	o       Options
	sock    *net.UnixListener
	ready   int // status /readyz answers
	health  *httptest.Server
}

// deployDir is the repository's deploy/ directory.
func deployDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy")
}

func newFixture(t *testing.T, opts simnode.Options) *fixture {
	t.Helper()
	dir, err := os.MkdirTemp("", "nri-doc-") // short: the socket path must fit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	mknodErr := simnode.CanMknod()
	opts.DeviceNodes = mknodErr == nil
	if mknodErr != nil {
		t.Logf("the node has no device nodes (the device nodes check fails): %v", mknodErr)
	}
	if opts.NumGPUs == 0 {
		opts.NumGPUs = 2
	}
	n, err := simnode.Generate(filepath.Join(dir, "n"), opts)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{n: n, noNodes: !opts.DeviceNodes, ready: http.StatusOK}
	f.write(t, "/etc/containerd/config.toml", "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n")
	for _, name := range []string{"10-nri-v3.toml", "20-nri-validator.toml"} {
		data, err := os.ReadFile(filepath.Join(deployDir(), "containerd", name))
		if err != nil {
			t.Fatal(err)
		}
		f.write(t, "/etc/containerd/conf.d/"+name, string(data))
	}
	sockPath := n.HostPath("/var/run/nri/nri.sock")
	os.MkdirAll(filepath.Dir(sockPath), 0o700)
	f.sock, err = net.ListenUnix("unix", &net.UnixAddr{Name: sockPath, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := f.sock.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { f.sock.Close() })
	f.health = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(f.ready)
		fmt.Fprintln(w, map[bool]string{true: "ready", false: "not ready: not connected to the runtime, or not synchronized yet"}[f.ready == 200])
	}))
	t.Cleanup(f.health.Close)
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = n.Root, n.Root, n.Root
	f.o = Options{Config: cfg, HealthURL: f.health.URL, Self: os.Getpid()}
	return f
}

// needNodes skips a test of the device nodes check where the fixture has
// none.
func needNodes(t *testing.T) {
	t.Helper()
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: checks the verdict on the /dev/nvidia* character devices, made with mknod: %v", err)
	}
}

// ok is OK(results) for f. On a fixture without device nodes the "device
// nodes" verdict, which fails there by construction, must be that failure
// (or a skip), and OK is over the other verdicts.
func (f *fixture) ok(t *testing.T, results []Result) bool {
	t.Helper()
	if !f.noNodes {
		return OK(results)
	}
	var rest []Result
	for _, r := range results {
		if r.Name != "device nodes" {
			rest = append(rest, r)
		} else if r.Status != Skip && (r.Status != Fail || !strings.Contains(r.Verdict, "/dev/nvidiactl is not a character device")) {
			t.Errorf("device nodes on a node without them: %s %q, want a failure for /dev/nvidiactl", r.Status, r.Verdict)
		}
	}
	return OK(rest)
}

func (f *fixture) write(t *testing.T, p, data string) {
	t.Helper()
	full := f.n.HostPath(p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) remove(t *testing.T, p string) {
	t.Helper()
	if err := os.RemoveAll(f.n.HostPath(p)); err != nil {
		t.Fatal(err)
	}
}

func report(results []Result) string {
	var b bytes.Buffer
	Print(&b, results)
	return b.String()
}

// expect checks that the check named name has status s and a verdict
// containing want.
func expect(t *testing.T, results []Result, name string, s Status, want string) {
	t.Helper()
	for _, r := range results {
		if r.Name == name {
			if r.Status != s || !strings.Contains(r.Verdict, want) {
				t.Errorf("%s: %s %q; want %s containing %q\n%s", name, r.Status, r.Verdict, s, want, report(results))
			}
			if s != Pass && s != Skip && r.Fix == "" {
				t.Errorf("%s: %s without a fix", name, r.Status)
			}
			return
		}
	}
	t.Errorf("no check %q in\n%s", name, report(results))
}

func TestHealthyNode(t *testing.T) {
	needNodes(t)
	f := newFixture(t, simnode.Options{})
	results := Run(f.o)
	for _, r := range results {
		if r.Status != Pass && (r.Name != "device plugin" || r.Status != Skip) {
			t.Errorf("%s/%s: %s %s", r.Layer, r.Name, r.Status, r.Verdict)
		}
	}
	var layers []string
	for _, r := range results {
		if len(layers) == 0 || layers[len(layers)-1] != r.Layer {
			layers = append(layers, r.Layer)
		}
	}
	if strings.Join(layers, ",") != "kernel,user space,injection" {
		t.Errorf("layers in order %v", layers)
	}
	if !OK(results) || !strings.Contains(report(results), "all checks passed") {
		t.Errorf("not OK:\n%s", report(results))
	}
	expect(t, results, "driver", Pass, "NVIDIA kernel module 580.126.09 loaded")
	expect(t, results, "majors", Pass, "nvidia 195, nvidia-uvm 510")
	expect(t, results, "device nodes", Pass, "2 GPUs")
	expect(t, results, "device files", Pass, "ModifyDeviceFiles: 1 (the driver's default): nvidia-smi run as root in a container may create device nodes")
	expect(t, results, "libraries", Pass, "driver libraries of 580.126.09")
	expect(t, results, "runtime config", Pass, "containerd: NRI enabled (disable = false)")
	expect(t, results, "NRI socket", Pass, "accepts connections")
	expect(t, results, "registration", Pass, "reports itself connected and synchronized")
	expect(t, results, "other injectors", Pass, "no NVIDIA runtime")
	expect(t, results, "required plugins", Pass, "default validator on")
	expect(t, results, "device plugin", Skip, "devicePlugin.enabled is off")
}

// failureCase is one thing broken on an otherwise good node, and the
// verdict of the check that must name it.
type failureCase struct {
	name string
	// opts lay out the node, and breakIt (when set) breaks it.
	opts    simnode.Options
	breakIt func(t *testing.T, f *fixture)
	// check is the check that must say so, with status and a verdict
	// that holds want.
	check  string
	status Status
	want   string
}

// failureCases are the things TestEachFailure breaks, one at a time.
func failureCases() []failureCase {
	nvidiaRuntime := func(def string) string {
		return `version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = '` + def + `'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
  runtime_type = 'io.containerd.runc.v2'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
  BinaryName = '/usr/bin/nvidia-container-runtime'
`
	}
	return []failureCase{
		{"driver not loaded", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.remove(t, "/proc/driver/nvidia/version")
			f.remove(t, "/sys/module/nvidia/version")
		}, "driver", Fail, "no NVIDIA kernel driver loaded"},
		{"nvidia-uvm not loaded", simnode.Options{}, func(t *testing.T, f *fixture) {
			data, _ := os.ReadFile(f.n.HostPath("/proc/devices"))
			f.write(t, "/proc/devices", strings.Replace(string(data), "510 nvidia-uvm\n", "", 1))
		}, "majors", Fail, "nvidia-uvm is not loaded"},
		{"device node missing", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.remove(t, fmt.Sprintf("/dev/nvidia%d", f.n.GPUs[1].Minor))
		}, "device nodes", Fail, "1 GPUs usable, but GPU 0000:38:00.0 (index 1): device node /dev/nvidia1 is missing"},
		{"no GPU usable", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.remove(t, "/dev/nvidia0")
			f.remove(t, "/dev/nvidia1")
		}, "device nodes", Fail, "no usable GPU"},
		{"no libraries", simnode.Options{NoDriver: true}, nil, "libraries", Fail, "no driver library was found"},
		{"libraries of another version", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.44.01  Release Build  (dvs-builder@U16)  Thu Nov 20 2025\n")
		}, "libraries", Fail, "do not carry the kernel module's version 590.44.01"},
		{"NRI disabled", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/etc/containerd/conf.d/90-off.toml", "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n")
		}, "runtime config", Fail, "NRI is disabled (disable = true)"},
		{"containerd 1.7 config without NRI", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/etc/containerd/config.toml", "version = 2\n")
		}, "runtime config", Warn, "NRI is on by default in containerd 2.x but off in 1.7"},
		{"containerd 1.7 with the drop-in", simnode.Options{}, func(t *testing.T, f *fixture) {
			data, _ := os.ReadFile(filepath.Join(deployDir(), "containerd", "10-nri.toml"))
			f.write(t, "/etc/containerd/config.toml", "version = 2\nimports = [\"conf.d/1.7/*.toml\"]\n")
			f.write(t, "/etc/containerd/conf.d/1.7/10-nri.toml", string(data))
		}, "runtime config", Pass, "NRI enabled (disable = false)"},
		{"broken TOML", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/etc/containerd/config.toml", "version = 3\n[plugins\n")
		}, "runtime config", Fail, "config.toml:2:"},
		{"CRI-O with NRI off", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.remove(t, "/etc/containerd")
			f.write(t, "/etc/crio/crio.conf", "[crio.nri]\nenable_nri = false\n")
		}, "runtime config", Fail, "CRI-O: NRI is disabled"},
		{"CRI-O with the drop-in", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.remove(t, "/etc/containerd")
			f.write(t, "/etc/crio/crio.conf", "[crio.nri]\nenable_nri = false\n")
			data, _ := os.ReadFile(filepath.Join(deployDir(), "crio", "10-nri.conf"))
			f.write(t, "/etc/crio/crio.conf.d/10-nri.conf", string(data))
		}, "runtime config", Pass, "CRI-O: NRI enabled (enable_nri = true)"},
		{"no runtime config", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.remove(t, "/etc/containerd")
		}, "runtime config", Warn, "no containerd"},
		{"no socket", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.sock.Close()
		}, "NRI socket", Fail, "no such file or directory: NRI is off or the runtime is not running"},
		{"stale socket", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.sock.SetUnlinkOnClose(false)
			f.sock.Close()
		}, "NRI socket", Fail, "refuses connections"},
		{"socket path from the runtime's config", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/etc/containerd/conf.d/90-sock.toml", "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  socket_path = '/run/other/nri.sock'\n")
		}, "NRI socket", Fail, "/run/other/nri.sock"},
		{"nri-gpu not ready", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.ready = http.StatusServiceUnavailable
		}, "registration", Fail, "not ready: not connected to the runtime"},
		{"status socket: not ready", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.o.HealthURL = ""
			log := logrus.New()
			log.SetOutput(io.Discard)
			p, err := plugin.New(f.o.Config, log)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			if err := status.Serve(ctx, f.n.HostPath(status.DefaultSocket), p, log); err != nil {
				t.Fatal(err)
			}
		}, "registration", Fail, "not ready: not connected to the runtime"},
		{"status socket: stale", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.o.HealthURL = ""
			f.write(t, "/run/nri-gpu/.keep", "")
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: f.n.HostPath(status.DefaultSocket), Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
		}, "registration", Fail, "connection refused"},
		{"nri-gpu not running", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.o.HealthURL = ""
		}, "registration", Fail, "nri-gpu is not running and not pre-registered"},
		{"nri-gpu pre-registered, not running", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.o.HealthURL = ""
			f.write(t, "/opt/nri/plugins/10-nri-gpu", "#!/bin/sh\n")
			os.Chmod(f.n.HostPath("/opt/nri/plugins/10-nri-gpu"), 0o755)
		}, "registration", Warn, "no process of it runs"},
		{"nri-gpu running with --metrics-addr", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.o.HealthURL = ""
			f.write(t, "/proc/4242/comm", "nri-gpu\n")
			f.write(t, "/proc/4242/status", "Name:\tnri-gpu\nUid:\t0\t0\t0\t0\n")
			f.write(t, "/proc/4242/cmdline", "/usr/local/bin/nri-gpu\x00run\x00--metrics-addr\x00"+strings.TrimPrefix(f.health.URL, "http://")+"\x00")
			f.write(t, "/proc/4243/comm", "nri-gpu\n") // a doctor run: ignored
			f.write(t, "/proc/4243/cmdline", "nri-gpu\x00doctor\x00")
		}, "registration", Pass, "nri-gpu (pid 4242) reports itself connected"},
		{"nri-gpu running without --metrics-addr", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.o.HealthURL = ""
			f.write(t, "/proc/4242/comm", "nri-gpu\n")
			f.write(t, "/proc/4242/status", "Name:\tnri-gpu\nUid:\t0\t0\t0\t0\n")
			f.write(t, "/proc/4242/cmdline", "nri-gpu\x00run\x00")
		}, "registration", Warn, "whether it is connected cannot be seen"},
		{"nvidia default runtime", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/etc/containerd/conf.d/50-nvidia.toml", nvidiaRuntime("nvidia"))
		}, "other injectors", Fail, `containerd's default runtime "nvidia" is NVIDIA's`},
		{"nvidia runtime class", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/etc/containerd/conf.d/50-nvidia.toml", nvidiaRuntime("runc"))
		}, "other injectors", Warn, `containerd runtime "nvidia" is NVIDIA's: pods of its runtime class`},
		{"CDI spec", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/var/run/cdi/nvidia.yaml", "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices: []\n")
		}, "other injectors", Fail, "nvidia.yaml defines nvidia.com/gpu devices"},
		{"CDI spec with emit: cdi", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.o.Config.Emit = "cdi"
			f.write(t, "/var/run/cdi/nri-gpu.yaml", "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices: []\n")
		}, "other injectors", Pass, "are what nri-gpu names (emit: cdi)"},
		{"CDI spec in the runtime's cdi_spec_dirs", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/etc/containerd/conf.d/60-cdi.toml", "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  cdi_spec_dirs = ['/srv/cdi']\n")
			f.write(t, "/srv/cdi/gpu.json", `{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[]}`)
		}, "other injectors", Fail, "gpu.json defines nvidia.com/gpu devices"},
		{"CDI spec in containerd 1.7's cdi_spec_dirs", simnode.Options{}, func(t *testing.T, f *fixture) {
			data, _ := os.ReadFile(filepath.Join(deployDir(), "containerd", "10-nri.toml"))
			f.write(t, "/etc/containerd/config.toml", "version = 2\nimports = [\"conf.d/1.7/*.toml\"]\n"+
				"[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = true\n  cdi_spec_dirs = [\"/srv/cdi\"]\n")
			f.write(t, "/etc/containerd/conf.d/1.7/10-nri.toml", string(data))
			f.write(t, "/srv/cdi/gpu.json", `{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[]}`)
		}, "other injectors", Fail, "gpu.json defines nvidia.com/gpu devices"},
		{"CRI-O OCI hook", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/etc/crio/crio.conf.d/10-nri.conf", "[crio.nri]\nenable_nri = true\n")
			f.write(t, "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json", `{"version":"1.0.0","hook":{"path":"/usr/bin/nvidia-container-toolkit","args":["nvidia-container-toolkit","prestart"]},"when":{"always":true},"stages":["prestart"]}`)
		}, "other injectors", Fail, "OCI hook"},
		{"default validator off", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.remove(t, "/etc/containerd/conf.d/20-nri-validator.toml")
		}, "required plugins", Warn, "default validator off"},
		{"nri-gpu required globally", simnode.Options{}, func(t *testing.T, f *fixture) {
			f.write(t, "/etc/containerd/conf.d/30-req.toml", "version = 3\n[plugins.'io.containerd.nri.v1.nri'.default_validator]\n  enable = true\n  required_plugins = ['nri-gpu']\n")
		}, "required plugins", Pass, "requires nri-gpu for every container"},
	}
}

// TestEachFailure breaks one thing at a time and checks the verdict that
// names it, and that the report fails (or warns) for it.
func TestEachFailure(t *testing.T) {
	for _, tc := range failureCases() {
		t.Run(tc.name, func(t *testing.T) {
			if tc.check == "device nodes" {
				needNodes(t)
			}
			f := newFixture(t, tc.opts)
			if tc.breakIt != nil {
				tc.breakIt(t, f)
			}
			results := Run(f.o)
			if len(results) < 9 { // two runtime config lines with both runtimes
				t.Errorf("%d verdicts, want one per check (9 or more):\n%s", len(results), report(results))
			}
			expect(t, results, tc.check, tc.status, tc.want)
			if tc.status == Fail && f.ok(t, results) {
				t.Errorf("OK with a failed check:\n%s", report(results))
			}
			if tc.status != Fail && !f.ok(t, results) {
				t.Errorf("not OK:\n%s", report(results))
			}
		})
	}
}

// TestImportedDevices checks the node layers of a node that serves
// another vendor's CDI devices (cdiImport): judged by its specs, not by
// NVIDIA's kernel module and libraries, which such a node does not have.
func TestImportedDevices(t *testing.T) {
	v, err := simnode.GenerateVendorHostNodes(t.TempDir(), 2)
	if err != nil {
		t.Fatal(err)
	}
	check := func(specDirs ...string) []Result {
		cfg := config.Default()
		cfg.CDIImport = &config.CDIImport{Kind: "amd.com/gpu", SpecDirs: specDirs}
		var out []Result
		checkImported(&Options{Config: cfg}, &out)
		return out
	}
	out := check(filepath.Dir(v.SpecPath))
	if len(out) != 2 || out[0].Name != "devices" || out[0].Status != Pass || !strings.Contains(out[0].Verdict, "2 amd.com/gpu devices from CDI specs: 0 1") ||
		out[1].Status != Skip {
		t.Errorf("a node with two devices: %+v", out)
	}
	out = check(t.TempDir())
	if out[0].Status != Fail || !strings.Contains(out[0].Verdict, "no usable amd.com/gpu device") || !strings.Contains(out[0].Fix, "cdiImport.specDirs") {
		t.Errorf("a node without specs: %+v", out)
	}
	// The NVIDIA checks are not run on such a node.
	var names []string
	for _, r := range Run(Options{Config: func() config.Config {
		c := config.Default()
		c.HostRoot = t.TempDir()
		c.CDIImport = &config.CDIImport{Kind: "amd.com/gpu", SpecDirs: []string{"/etc/cdi"}}
		return c
	}()}) {
		names = append(names, r.Layer+"/"+r.Name)
	}
	if strings.Contains(strings.Join(names, " "), "kernel/majors") || !strings.Contains(strings.Join(names, " "), "kernel/devices") {
		t.Errorf("checks on an imported node: %q", names)
	}
}

// TestDeviceFilesSetting checks the report of the kernel module's
// ModifyDeviceFiles parameter, read from /proc/driver/nvidia/params under
// hostRoot: 1 (simnode writes the driver's defaults) and 0 pass with what
// each means, an unreadable report warns, no driver skips.
func TestDeviceFilesSetting(t *testing.T) {
	for _, tc := range []struct {
		name    string
		params  *string // nil: remove the file
		version bool    // keep the driver loaded
		status  Status
		want    string
	}{
		{"default", nil, true, Pass, "ModifyDeviceFiles: 1 (the driver's default)"},
		{"off", ptr("ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 0\nDeviceFileUID: 0\n"), true, Pass, "ModifyDeviceFiles: 0: the driver creates no device nodes"},
		{"no such line", ptr("ResmanDebugLevel: 4294967295\n"), true, Warn, "/proc/driver/nvidia/params has no ModifyDeviceFiles line"},
		{"no params file", ptr(""), true, Warn, "cannot read /proc/driver/nvidia/params"},
		{"no driver", nil, false, Skip, "no kernel driver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, simnode.Options{})
			switch {
			case tc.params != nil && *tc.params == "":
				f.remove(t, "/proc/driver/nvidia/params")
			case tc.params != nil:
				f.write(t, "/proc/driver/nvidia/params", *tc.params)
			}
			if !tc.version {
				f.remove(t, "/proc/driver/nvidia/version")
				f.remove(t, "/sys/module/nvidia/version")
			}
			expect(t, Run(f.o), "device files", tc.status, tc.want)
		})
	}
}

func ptr(s string) *string { return &s }

// TestContainerd17VersionThreeImport: containerd 1.7 does not start with a
// version 3 file among its imports ("unsupported config version `3`", seen
// with containerd 1.7.36 in the end-to-end suite's TestContainerdDropIns);
// doctor warns about such an import under a version 2 config.
func TestContainerd17VersionThreeImport(t *testing.T) {
	f := newFixture(t, simnode.Options{})
	nri, _ := os.ReadFile(filepath.Join(deployDir(), "containerd", "10-nri.toml"))
	validator, _ := os.ReadFile(filepath.Join(deployDir(), "containerd", "20-nri-validator.toml"))
	f.write(t, "/etc/containerd/config.toml", "version = 2\nimports = [\"conf.d/1.7/*.toml\"]\n")
	f.write(t, "/etc/containerd/conf.d/1.7/10-nri.toml", string(nri))
	f.write(t, "/etc/containerd/conf.d/1.7/20-nri-validator.toml", string(validator))
	results := Run(f.o)
	var warned, passed bool
	for _, r := range results {
		if r.Name != "runtime config" {
			continue
		}
		passed = passed || r.Status == Pass && strings.Contains(r.Verdict, "NRI enabled (disable = false)")
		if r.Status == Warn && strings.Contains(r.Verdict, "20-nri-validator.toml, of config version 3: containerd 1.7 refuses to start with it") {
			warned = r.Fix != ""
		}
	}
	if !warned || !passed {
		t.Errorf("want NRI enabled and a warning with a fix about the version 3 import:\n%s", report(results))
	}

	// The same drop-ins under a version 3 config (containerd 2.x): no warning.
	f.write(t, "/etc/containerd/config.toml", "version = 3\nimports = [\"conf.d/1.7/*.toml\"]\n")
	for _, r := range Run(f.o) {
		if r.Name == "runtime config" && r.Status != Pass {
			t.Errorf("version 3 config: %s %s", r.Status, r.Verdict)
		}
	}
}
