package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdispec"
	"github.com/nri-gpu/nri-gpu/internal/ops/metrics"
)

// runtimeFacts is what the runtime's configuration says about NRI.
type runtimeFacts struct {
	ctd  *containerdConfig
	crio *crioConfig
	// Socket, PluginDir and CDIDirs are paths as this process reads them.
	Socket    string
	PluginDir string
	CDIDirs   []string
}

// checkInjection checks the injection layer.
func checkInjection(o *Options, out *[]Result) {
	f := runtimeFacts{
		Socket:    o.host("/var/run/nri/nri.sock"),
		PluginDir: o.host("/opt/nri/plugins"),
		CDIDirs:   []string{o.host("/etc/cdi"), o.host("/var/run/cdi")},
	}
	checkRuntimeConfig(o, &f, out)
	if o.Socket != "" {
		f.Socket = o.Socket
	}
	if len(o.CDIDirs) > 0 {
		f.CDIDirs = o.CDIDirs
	}
	checkSocket(&f, out)
	checkRegistered(o, &f, out)
	checkOtherInjectors(o, &f, out)
	checkRequiredPlugins(o, &f, out)
}

const nriTable = `[plugins."io.containerd.nri.v1.nri"]`

// checkRuntimeConfig reads containerd's and CRI-O's configuration and
// checks that NRI is enabled in them.
func checkRuntimeConfig(o *Options, f *runtimeFacts, out *[]Result) {
	found := false
	ctd, err := loadContainerd(o.ContainerdConfig, o.Config.HostRoot)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		found = true
		add(out, Injection, "runtime config", Fail, "containerd: "+err.Error(), "fix the file's TOML syntax and restart containerd")
	default:
		found = true
		f.ctd = ctd
		files := strings.Join(ctd.Files, ", ")
		nri := ctd.nri()
		disable, set := getBool(nri, "disable")
		switch {
		case set && disable:
			add(out, Injection, "runtime config", Fail, "containerd: NRI is disabled (disable = true) in "+files,
				"set disable = false under "+nriTable+" (deploy/containerd/10-nri.toml, imported from config.toml) and restart containerd")
		case set:
			add(out, Injection, "runtime config", Pass, "containerd: NRI enabled (disable = false) in "+files, "")
		case ctd.Version >= 3:
			add(out, Injection, "runtime config", Pass, "containerd: NRI on by default (config version 3: containerd 2.x) in "+files, "")
		default:
			add(out, Injection, "runtime config", Warn, "containerd: "+files+" does not set "+nriTable+" disable: NRI is on by default in containerd 2.x but off in 1.7",
				"set disable = false under "+nriTable+" (deploy/containerd/10-nri.toml, imported from config.toml) and restart containerd")
		}
		if len(ctd.V3Imports) > 0 {
			add(out, Injection, "runtime config", Warn, fmt.Sprintf("containerd: %s imports %s, of config version 3: containerd 1.7 refuses to start with it (unsupported config version `3`); containerd 2.x reads it",
				ctd.Files[0], strings.Join(ctd.V3Imports, ", ")),
				"on containerd 1.7 import only version 2 files (deploy/containerd/10-nri.toml; the default validator of 20-nri-validator.toml needs containerd 2.2 or later)")
		}
		if p := getString(nri, "socket_path"); p != "" {
			f.Socket = o.host(p)
		}
		if p := getString(nri, "plugin_path"); p != "" {
			f.PluginDir = o.host(p)
		}
		if dirs := getStrings(ctd.criRuntime(), "cdi_spec_dirs"); len(dirs) > 0 {
			f.CDIDirs = nil
			for _, d := range dirs {
				f.CDIDirs = append(f.CDIDirs, o.host(d))
			}
		}
	}

	crio, err := loadCRIO(o.CRIOConfig)
	switch {
	case err != nil:
		found = true
		add(out, Injection, "runtime config", Fail, "CRI-O: "+err.Error(), "fix the file's TOML syntax and restart CRI-O")
	case crio != nil:
		found = true
		f.crio = crio
		files := strings.Join(crio.Files, ", ")
		enabled, set := getBool(crio.Tree, "crio", "nri", "enable_nri")
		switch {
		case set && enabled:
			add(out, Injection, "runtime config", Pass, "CRI-O: NRI enabled (enable_nri = true) in "+files, "")
		case set:
			add(out, Injection, "runtime config", Fail, "CRI-O: NRI is disabled (enable_nri = false) in "+files,
				"set [crio.nri] enable_nri = true (deploy/crio/10-nri.conf in /etc/crio/crio.conf.d/) and restart CRI-O")
		default:
			add(out, Injection, "runtime config", Warn, "CRI-O: "+files+" does not set [crio.nri] enable_nri; its default differs between CRI-O versions",
				"set [crio.nri] enable_nri = true (deploy/crio/10-nri.conf in /etc/crio/crio.conf.d/) and restart CRI-O")
		}
		if p := getString(crio.Tree, "crio", "nri", "nri_listen"); p != "" {
			f.Socket = o.host(p)
		}
		if p := getString(crio.Tree, "crio", "nri", "nri_plugin_dir"); p != "" {
			f.PluginDir = o.host(p)
		}
	}
	if !found {
		add(out, Injection, "runtime config", Warn,
			fmt.Sprintf("no containerd (%s) or CRI-O (%s) configuration: the runtime runs on its defaults (NRI on in containerd 2.x only)", o.ContainerdConfig, o.CRIOConfig),
			"point --containerd-config or --crio-config at the runtime's configuration, or add deploy/containerd/10-nri.toml")
	}
}

// checkSocket checks that the NRI socket exists and accepts connections.
func checkSocket(f *runtimeFacts, out *[]Result) {
	fix := "enable NRI in the runtime's configuration and restart the runtime; check that the socket path matches (--socket)"
	fi, err := os.Stat(f.Socket)
	switch {
	case err != nil:
		add(out, Injection, "NRI socket", Fail, fmt.Sprintf("%s: %v: NRI is off or the runtime is not running", f.Socket, errors.Unwrap(err)), fix)
		return
	case fi.Mode().Type() != fs.ModeSocket:
		add(out, Injection, "NRI socket", Fail, f.Socket+" is not a socket", fix)
		return
	}
	c, err := net.DialTimeout("unix", f.Socket, 2*time.Second)
	if err != nil {
		add(out, Injection, "NRI socket", Fail, fmt.Sprintf("%s refuses connections: %v", f.Socket, err), "restart the runtime (the socket is stale)")
		return
	}
	c.Close()
	add(out, Injection, "NRI socket", Pass, f.Socket+" accepts connections", "")
}

// process is a running nri-gpu.
type process struct {
	pid         int
	args        []string
	metricsAddr string
}

// findProcesses lists the nri-gpu processes under <hostRoot>/proc other
// than o.Self and other than `nri-gpu doctor` runs: those whose command
// name is nri-gpu, or NN-nri-gpu for a pre-registered one, and whose
// every uid (real, effective, saved, file system: /proc/<pid>/status) is
// trusted (trustedUID): any user can name a process nri-gpu. ignored says
// which processes had the name but not the user.
func findProcesses(o *Options) (out []process, ignored []string) {
	entries, _ := os.ReadDir(o.host("/proc"))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == o.Self {
			continue
		}
		comm, err := os.ReadFile(o.host(fmt.Sprintf("/proc/%d/comm", pid)))
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		if name != o.Name && name != o.Index+"-"+o.Name {
			continue
		}
		cmdline, _ := os.ReadFile(o.host(fmt.Sprintf("/proc/%d/cmdline", pid)))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(args) > 1 && args[1] == "doctor" {
			continue
		}
		uids, err := processUIDs(o.host(fmt.Sprintf("/proc/%d/status", pid)))
		if err != nil {
			ignored = append(ignored, fmt.Sprintf("pid %d: %v", pid, err))
			continue
		}
		if i := slices.IndexFunc(uids, func(u uint32) bool { return !trustedUID(u) }); i >= 0 {
			ignored = append(ignored, fmt.Sprintf("pid %d, named %s but run by uid %d, not %s", pid, name, uids[i], trustedUsers()))
			continue
		}
		p := process{pid: pid, args: args}
		for i, a := range args {
			if v, ok := strings.CutPrefix(strings.TrimLeft(a, "-"), "metrics-addr="); ok && strings.HasPrefix(a, "-") {
				p.metricsAddr = v
			} else if strings.TrimLeft(a, "-") == "metrics-addr" && strings.HasPrefix(a, "-") && i+1 < len(args) {
				p.metricsAddr = args[i+1]
			}
		}
		out = append(out, p)
	}
	return out, ignored
}

// healthURL turns a --metrics-addr value into a URL this process can
// reach: a wildcard host becomes the loopback address.
func healthURL(addr string) string {
	a, err := metrics.NormalizeAddr(addr)
	if err != nil {
		return ""
	}
	host, port, _ := net.SplitHostPort(a)
	switch host {
	case "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// readyz asks nri-gpu's /readyz.
func readyz(url string) (bool, string) {
	return ask(http.Client{Timeout: 3 * time.Second}, strings.TrimRight(url, "/")+"/readyz")
}

// statusReady asks nri-gpu's status socket for its readiness (GET /ready),
// from a process of a trusted user only (dialTrusted): untrusted says
// otherwise.
func statusReady(socket string) (ok bool, msg string, untrusted *untrustedPeer) {
	c := http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := dialTrusted(ctx, socket)
			if u := (*untrustedPeer)(nil); errors.As(err, &u) {
				untrusted = u
			}
			return c, err
		},
	}}
	ok, msg = ask(c, "http://nri-gpu/ready")
	if untrusted != nil {
		return false, "", untrusted
	}
	return ok, msg, nil
}

// ask GETs url: whether it answered 200, and its first line or the error.
func ask(c http.Client, url string) (bool, string) {
	resp, err := c.Get(url)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return resp.StatusCode == http.StatusOK, strings.TrimSpace(string(b))
}

// checkRegistered checks that nri-gpu is registered with the runtime.
// The definite answer is nri-gpu's own readiness (connected and
// synchronized), asked at --health-url, on its status socket (owned and
// served by root or this user), or at the --metrics-addr of a running
// nri-gpu (run by root or this user). Without a listener, a pre-registered binary (the
// runtime starts it and hands it its connection) passes, and a running
// process is a warning: alive, but its connection cannot be seen from
// outside.
func checkRegistered(o *Options, f *runtimeFacts, out *[]Result) {
	const name = "registration"
	fixDeploy := "run nri-gpu: the DaemonSet (deploy/kubernetes), the systemd unit (deploy/systemd) or make install (pre-registered)"
	if o.HealthURL != "" {
		if ok, msg := readyz(o.HealthURL); ok {
			add(out, Injection, name, Pass, fmt.Sprintf("nri-gpu reports itself connected and synchronized (%s/readyz)", o.HealthURL), "")
		} else {
			add(out, Injection, name, Fail, fmt.Sprintf("%s/readyz: %s", o.HealthURL, msg), "see nri-gpu's log; "+fixDeploy)
		}
		return
	}
	if _, err := os.Stat(o.StatusSocket); err == nil {
		fixImpostor := "remove it and find what created it: nri-gpu's status socket is made by nri-gpu, which runs as root"
		if why := socketOwner(o.StatusSocket); why != "" {
			add(out, Injection, name, Fail, fmt.Sprintf("status socket %s is %s: not nri-gpu's, its answer is not believed", o.StatusSocket, why), fixImpostor)
			return
		}
		ok, msg, untrusted := statusReady(o.StatusSocket)
		if untrusted != nil {
			add(out, Injection, name, Fail, fmt.Sprintf("status socket %s is %v: not nri-gpu's, its answer is not believed", o.StatusSocket, untrusted), fixImpostor)
			return
		}
		if ok {
			add(out, Injection, name, Pass, fmt.Sprintf("nri-gpu reports itself connected and synchronized (status socket %s)", o.StatusSocket), "")
		} else {
			add(out, Injection, name, Fail, fmt.Sprintf("status socket %s: %s", o.StatusSocket, msg),
				"see nri-gpu's log: it keeps reconnecting until the runtime's NRI socket accepts it; a stale socket means nri-gpu is not running: "+fixDeploy)
		}
		return
	}
	procs, ignored := findProcesses(o)
	notTrusted := ""
	if len(ignored) > 0 {
		notTrusted = " (not believed: " + firstLines(ignored, 2) + ")"
	}
	for _, p := range procs {
		if p.metricsAddr == "" {
			continue
		}
		url := healthURL(p.metricsAddr)
		if ok, msg := readyz(url); ok {
			add(out, Injection, name, Pass, fmt.Sprintf("nri-gpu (pid %d) reports itself connected and synchronized (%s/readyz)", p.pid, url), "")
		} else {
			add(out, Injection, name, Fail, fmt.Sprintf("nri-gpu (pid %d) runs but %s/readyz says: %s", p.pid, url, msg),
				"see its log: it keeps reconnecting until the runtime's NRI socket accepts it")
		}
		return
	}
	pre := filepath.Join(f.PluginDir, o.Index+"-"+o.Name)
	fi, err := os.Stat(pre)
	preRegistered := err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
	switch {
	case preRegistered && len(procs) > 0:
		add(out, Injection, name, Pass, fmt.Sprintf("pre-registered as %s and running (pid %d): the runtime started it", pre, procs[0].pid), "")
	case preRegistered:
		add(out, Injection, name, Warn, fmt.Sprintf("pre-registered as %s, but no process of it runs%s: the runtime starts it when the runtime starts", pre, notTrusted),
			"restart the runtime; if it still does not run, see the runtime's log")
	case len(procs) > 0:
		add(out, Injection, name, Warn, fmt.Sprintf("nri-gpu runs (pid %d) but has no --metrics-addr: whether it is connected cannot be seen", procs[0].pid),
			"run it with --metrics-addr (or pass --health-url) for a definite answer")
	default:
		add(out, Injection, name, Fail, fmt.Sprintf("nri-gpu is not running and not pre-registered (%s)%s", pre, notTrusted), fixDeploy)
	}
}

// isNvidiaRuntime reports whether a runtime entry is NVIDIA's wrapper,
// which injects GPUs itself.
func isNvidiaRuntime(name, binary string) bool {
	return strings.HasPrefix(name, "nvidia") || strings.HasPrefix(filepath.Base(binary), "nvidia-container-runtime")
}

// checkOtherInjectors looks for a second GPU injector: NVIDIA's runtime
// wrapper as the default (or any) runtime, its OCI hook, or a CDI spec of
// nvidia.com devices.
func checkOtherInjectors(o *Options, f *runtimeFacts, out *[]Result) {
	const name = "other injectors"
	fails, warns := containerdInjectors(f)
	crioFails, crioWarns := crioInjectors(o, f)
	cdiFails, cdiUsed := cdiInjectors(o, f)
	fails = slices.Concat(fails, crioFails, cdiFails)
	warns = append(warns, crioWarns...)
	switch {
	case len(fails) > 0:
		add(out, Injection, name, Fail, firstLines(append(fails, warns...), 2),
			"remove NVIDIA's runtime from the runtime's default (default_runtime_name = \"runc\"), its OCI hook, and the nvidia.com CDI specs (and what regenerates them: nvidia-ctk cdi generate, nvidia-cdi-refresh); nri-gpu replaces them (or, to keep a spec of nri-gpu cdi generate, set emit: cdi)")
	case len(warns) > 0:
		add(out, Injection, name, Warn, firstLines(warns, 2), "remove the runtime class, or keep GPU pods off it")
	case len(cdiUsed) > 0:
		add(out, Injection, name, Pass, "no NVIDIA runtime or OCI hook; the CDI specs "+strings.Join(cdiUsed, ", ")+" are what nri-gpu names (emit: cdi)", "")
	default:
		add(out, Injection, name, Pass, "no NVIDIA runtime, OCI hook or nvidia.com CDI spec", "")
	}
}

// containerdInjectors finds NVIDIA's runtime among containerd's CRI
// runtimes: a failure as the default, a warning otherwise.
func containerdInjectors(f *runtimeFacts) (fails, warns []string) {
	if f.ctd == nil {
		return nil, nil
	}
	cri := f.ctd.criRuntime()
	def := getString(cri, "containerd", "default_runtime_name")
	if def == "" {
		def = "runc"
	}
	runtimes, _ := getTable(cri, "containerd", "runtimes")
	for _, rn := range sortedKeys(runtimes) {
		bin := getString(runtimes, rn, "options", "BinaryName")
		if !isNvidiaRuntime(rn, bin) {
			continue
		}
		if rn == def {
			fails = append(fails, fmt.Sprintf("containerd's default runtime %q is NVIDIA's (%s): every container is injected twice", rn, orDefault(bin, "nvidia-container-runtime")))
		} else {
			warns = append(warns, fmt.Sprintf("containerd runtime %q is NVIDIA's: pods of its runtime class are injected twice", rn))
		}
	}
	return fails, warns
}

// crioInjectors finds NVIDIA's runtime among CRI-O's runtimes (a failure
// as the default, a warning otherwise) and NVIDIA's OCI hook in its hook
// directories (a failure).
func crioInjectors(o *Options, f *runtimeFacts) (fails, warns []string) {
	if f.crio == nil {
		return nil, nil
	}
	def := getString(f.crio.Tree, "crio", "runtime", "default_runtime")
	runtimes, _ := getTable(f.crio.Tree, "crio", "runtime", "runtimes")
	for _, rn := range sortedKeys(runtimes) {
		bin := getString(runtimes, rn, "runtime_path")
		if !isNvidiaRuntime(rn, bin) {
			continue
		}
		if rn == def {
			fails = append(fails, fmt.Sprintf("CRI-O's default runtime %q is NVIDIA's: every container is injected twice", rn))
		} else {
			warns = append(warns, fmt.Sprintf("CRI-O runtime %q is NVIDIA's: pods of its runtime class are injected twice", rn))
		}
	}
	hookDirs := getStrings(f.crio.Tree, "crio", "runtime", "hooks_dir")
	if len(hookDirs) == 0 {
		hookDirs = []string{"/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d"}
	}
	for _, d := range hookDirs {
		matches, _ := filepath.Glob(filepath.Join(o.host(d), "*.json"))
		for _, m := range matches {
			if data, err := os.ReadFile(m); err == nil && bytes.Contains(data, []byte("nvidia-container")) {
				fails = append(fails, fmt.Sprintf("OCI hook %s runs NVIDIA's toolkit on every container", m))
			}
		}
	}
	return fails, warns
}

// cdiInjectors finds CDI specs of nvidia.com devices in the runtime's CDI
// directories: a failure, except nri-gpu's own spec under emit: cdi
// (used).
func cdiInjectors(o *Options, f *runtimeFacts) (fails, used []string) {
	for _, d := range f.CDIDirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			ext := filepath.Ext(e.Name())
			if e.IsDir() || ext != ".json" && ext != ".yaml" && ext != ".yml" {
				continue
			}
			p := filepath.Join(d, e.Name())
			data, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			var spec struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal(data, &spec); err != nil {
				continue
			}
			switch {
			case !strings.HasPrefix(spec.Kind, "nvidia.com/"):
			case o.Config.Emit == "cdi" && spec.Kind == cdispec.Kind:
				// nri-gpu itself names these devices (emit: cdi).
				used = append(used, p)
			default:
				fails = append(fails, fmt.Sprintf("CDI spec %s defines %s devices: a pod that asks for them through CDI gets the driver twice, from a copy that goes stale at the next driver upgrade", p, spec.Kind))
			}
		}
	}
	return fails, used
}

// checkRequiredPlugins checks whether the runtime refuses GPU pods while
// nri-gpu is absent (containerd's NRI default validator, 2.2 and later),
// rather than starting them without GPUs.
func checkRequiredPlugins(o *Options, f *runtimeFacts, out *[]Result) {
	const name = "required plugins"
	if f.ctd == nil {
		if f.crio != nil {
			add(out, Injection, name, Warn, "CRI-O: not checked: a GPU pod created while nri-gpu is down may start without GPUs",
				"keep nri-gpu running before GPU pods are scheduled (DaemonSet readiness)")
			return
		}
		add(out, Injection, name, Skip, "no runtime configuration read", "")
		return
	}
	v, _ := getTable(f.ctd.nri(), "default_validator")
	enabled, _ := getBool(v, "enable")
	fix := `containerd 2.2 or later: set enable = true under [plugins."io.containerd.nri.v1.nri".default_validator] (deploy/containerd/20-nri-validator.toml) and annotate GPU pods with required-plugins.noderesource.dev/container.<name>: '["` + o.Name + `"]'`
	switch {
	case !enabled:
		add(out, Injection, name, Warn, "NRI default validator off: a GPU pod created while nri-gpu is down starts without GPUs", fix)
	case slices.Contains(getStrings(v, "required_plugins"), o.Name) || slices.Contains(getStrings(v, "required_plugins"), o.Index+"-"+o.Name):
		add(out, Injection, name, Pass, "default validator requires "+o.Name+" for every container", "")
	default:
		add(out, Injection, name, Pass, `default validator on: pods annotated required-plugins.noderesource.dev/container.<name>: '["`+o.Name+`"]' are refused while nri-gpu is absent`, "")
	}
}

func sortedKeys(t tree) []string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
