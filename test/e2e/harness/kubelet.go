package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// KubeletVersion is the kubelet release the harness builds (keep in sync with
// test/e2e/install-tools.sh).
const KubeletVersion = "v1.34.4"

// DevicePluginDir is the kubelet's device plugin directory. The kubelet
// hard-wires it (it is not under --root-dir), so only one harness kubelet may
// run at a time on a machine; StartKubelet holds a lock for its lifetime.
const DevicePluginDir = "/var/lib/kubelet/device-plugins"

// KubeletCheckpoint is the kubelet's device manager checkpoint file.
const KubeletCheckpoint = DevicePluginDir + "/kubelet_internal_checkpoint"

// containerLogLinkDir is where the kubelet links container logs, whatever
// its --root-dir and podLogsDir say.
const containerLogLinkDir = "/var/log/containers"

// InstallKubelet returns the kubelet at KubeletVersion: the cluster's
// (<cacheDir>/kubernetes-<version>/kubelet, see InstallKubernetes) when
// that is built, else <cacheDir>/kubelet-<version>/kubelet, building the
// kubelet alone on first use (about 4 min on 2 cores). An empty cacheDir
// means DefaultCacheDir().
func InstallKubelet(ctx context.Context, cacheDir string) (string, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	if p := filepath.Join(cacheDir, "kubernetes-"+KubeletVersion, "kubelet"); isExecutable(p) {
		return p, nil
	}
	dir := filepath.Join(cacheDir, "kubelet-"+KubeletVersion)
	if err := buildKubernetes(ctx, cacheDir, dir, KubeletVersion, "kubelet"); err != nil {
		return "", err
	}
	return filepath.Join(dir, "kubelet"), nil
}

// KubeletOptions configures StartKubelet.
type KubeletOptions struct {
	// Binary is the kubelet to run (required; see InstallKubelet).
	Binary string
	// Containerd is the runtime: its CRI socket is the kubelet's runtime and
	// image endpoint. Runtime, when set, is used instead (any runtime with a
	// CRI endpoint).
	Containerd *Containerd
	Runtime    CRIEndpointer
	// NodeName is --hostname-override (default "nri-gpu-e2e").
	NodeName string
	// Verbosity is the kubelet's -v (default 2).
	Verbosity int
}

// Kubelet is a running standalone kubelet (no API server): static pods from
// StaticPodDir, everything it writes under Dir except the hard-wired
// DevicePluginDir and /var/log/containers.
type Kubelet struct {
	Opts         KubeletOptions
	Dir          string // private temp dir
	RootDir      string // --root-dir
	CertDir      string // --cert-dir
	StaticPodDir string // staticPodPath
	PodLogsDir   string // podLogsDir
	ConfigPath   string // the KubeletConfiguration
	LogPath      string // the kubelet's stdout+stderr
	Port         int    // the authenticated (anonymous, AlwaysAllow) HTTPS port
	ReadOnlyPort int    // the read-only HTTP port (/pods)
	HealthzPort  int

	args    []string    // the kubelet's arguments
	ns      *Namespaces // a cluster node's, or nil: the host's
	cmd     *exec.Cmd
	exited  chan struct{}
	logFile *os.File
	unlock  func()
	created []string // hard-wired paths this kubelet created, removed at Stop
	stopped bool
}

// StartKubelet starts a standalone kubelet against opts.Containerd and waits
// until its read-only /pods endpoint answers. It creates DevicePluginDir and
// /var/log/containers when missing (Stop removes what it created) and
// refuses to start while another kubelet's socket is live there.
func StartKubelet(ctx context.Context, opts KubeletOptions) (*Kubelet, error) {
	if opts.Runtime == nil && opts.Containerd != nil {
		opts.Runtime = opts.Containerd
	}
	if opts.Binary == "" || opts.Runtime == nil {
		return nil, errors.New("KubeletOptions: Binary and Containerd (or Runtime) are required")
	}
	if opts.NodeName == "" {
		opts.NodeName = "nri-gpu-e2e"
	}
	if opts.Verbosity == 0 {
		opts.Verbosity = 2
	}
	unlock, err := lockFile(ctx, filepath.Join(os.TempDir(), "nri-gpu-e2e-kubelet.lock"))
	if err != nil {
		return nil, err
	}
	if c, err := net.DialTimeout("unix", filepath.Join(DevicePluginDir, "kubelet.sock"), time.Second); err == nil {
		c.Close()
		unlock()
		return nil, fmt.Errorf("%s/kubelet.sock answers: another kubelet uses the device plugin directory", DevicePluginDir)
	}
	dir, err := os.MkdirTemp("", "nrie2e-kubelet-")
	if err != nil {
		unlock()
		return nil, err
	}
	k := &Kubelet{
		Opts:         opts,
		Dir:          dir,
		RootDir:      filepath.Join(dir, "root"),
		CertDir:      filepath.Join(dir, "pki"),
		StaticPodDir: filepath.Join(dir, "manifests"),
		PodLogsDir:   filepath.Join(dir, "pod-logs"),
		ConfigPath:   filepath.Join(dir, "kubelet.yaml"),
		LogPath:      filepath.Join(dir, "kubelet.log"),
		exited:       make(chan struct{}),
		unlock:       unlock,
	}
	fail := func(err error) (*Kubelet, error) { return nil, errors.Join(err, k.Stop()) }
	for _, d := range []string{k.RootDir, k.CertDir, k.StaticPodDir, k.PodLogsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fail(err)
		}
	}
	for _, d := range []string{DevicePluginDir, containerLogLinkDir} {
		top, err := mkdirAllTop(d)
		if err != nil {
			return fail(err)
		}
		if top != "" {
			k.created = append(k.created, top)
		}
	}
	for _, f := range []string{"kubelet.sock", "kubelet_internal_checkpoint"} {
		p := filepath.Join(DevicePluginDir, f)
		if _, err := os.Lstat(p); os.IsNotExist(err) {
			k.created = append(k.created, p)
		}
	}
	ports, err := freePorts(3)
	if err != nil {
		return fail(err)
	}
	k.Port, k.ReadOnlyPort, k.HealthzPort = ports[0], ports[1], ports[2]
	endpoint := opts.Runtime.CRIEndpoint()
	cfg := map[string]any{
		"apiVersion":                       "kubelet.config.k8s.io/v1beta1",
		"kind":                             "KubeletConfiguration",
		"staticPodPath":                    k.StaticPodDir,
		"podLogsDir":                       k.PodLogsDir,
		"containerRuntimeEndpoint":         endpoint,
		"imageServiceEndpoint":             endpoint,
		"cgroupDriver":                     "cgroupfs",
		"cgroupsPerQOS":                    false,
		"enforceNodeAllocatable":           []string{},
		"failSwapOn":                       false,
		"failCgroupV1":                     false,
		"address":                          "127.0.0.1",
		"port":                             k.Port,
		"readOnlyPort":                     k.ReadOnlyPort,
		"healthzBindAddress":               "127.0.0.1",
		"healthzPort":                      k.HealthzPort,
		"authentication":                   map[string]any{"anonymous": map[string]any{"enabled": true}, "webhook": map[string]any{"enabled": false}},
		"authorization":                    map[string]any{"mode": "AlwaysAllow"},
		"syncFrequency":                    "2s",
		"fileCheckFrequency":               "1s",
		"nodeStatusUpdateFrequency":        "2s",
		"evictionHard":                     map[string]string{"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
		"evictionPressureTransitionPeriod": "1s",
		"imageGCHighThresholdPercent":      100,
		"imageGCLowThresholdPercent":       99,
		"resolvConf":                       "",
		"registerNode":                     false,
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(k.ConfigPath, data, 0o644); err != nil {
		return fail(err)
	}
	k.args = []string{"--config", k.ConfigPath, "--root-dir", k.RootDir, "--cert-dir", k.CertDir,
		"--hostname-override", k.Opts.NodeName, "-v", strconv.Itoa(k.Opts.Verbosity)}
	if err := k.start(); err != nil {
		return fail(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := k.Pods(ctx); err == nil {
			return k, nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			return fail(fmt.Errorf("kubelet /pods did not answer: %v\n--- tail of %s ---\n%s", err, k.LogPath, k.LogTail(6000)))
		}
		select {
		case <-k.exited:
			return fail(fmt.Errorf("kubelet exited\n--- tail of %s ---\n%s", k.LogPath, k.LogTail(6000)))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (k *Kubelet) start() error {
	lf, err := os.OpenFile(k.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	k.logFile = lf
	argv := k.ns.Wrap(append([]string{k.Opts.Binary}, k.args...))
	k.cmd = exec.Command(argv[0], argv[1:]...)
	k.cmd.Stdout, k.cmd.Stderr = lf, lf
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := k.cmd.Start(); err != nil {
		return err
	}
	cmd, exited := k.cmd, k.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	return nil
}

// mkdirAllTop creates dir with its missing parents and returns the topmost
// directory it created ("" if dir existed).
func mkdirAllTop(dir string) (string, error) {
	top := ""
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !os.IsNotExist(err) {
			return "", err
		}
		top = d
		if d == filepath.Dir(d) {
			break
		}
	}
	return top, os.MkdirAll(dir, 0o755)
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// AddStaticPod writes a static pod manifest (JSON or YAML) named name into
// StaticPodDir; the kubelet picks it up within fileCheckFrequency. The
// kubelet names the pod <metadata.name>-<NodeName>.
func (k *Kubelet) AddStaticPod(name string, manifest []byte) error {
	tmp := filepath.Join(k.StaticPodDir, "."+name+".tmp")
	if err := os.WriteFile(tmp, manifest, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(k.StaticPodDir, name+".json"))
}

// RemoveStaticPod removes a manifest written by AddStaticPod.
func (k *Kubelet) RemoveStaticPod(name string) error {
	return os.Remove(filepath.Join(k.StaticPodDir, name+".json"))
}

// KubeletPod is the part of a v1.Pod the harness reads from /pods.
type KubeletPod struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		UID       string `json:"uid"`
	} `json:"metadata"`
	Status struct {
		Phase             string `json:"phase"`
		Reason            string `json:"reason"`
		Message           string `json:"message"`
		ContainerStatuses []struct {
			Name        string          `json:"name"`
			ContainerID string          `json:"containerID"`
			Ready       bool            `json:"ready"`
			State       json.RawMessage `json:"state"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

// Pods returns the kubelet's pods from its read-only /pods endpoint (static
// pods carry the status the kubelet gave them, admission rejections
// included).
func (k *Kubelet) Pods(ctx context.Context) ([]KubeletPod, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/pods", k.ReadOnlyPort), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /pods: %s: %s", resp.Status, tail(string(body), 500))
	}
	var list struct {
		Items []KubeletPod `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("GET /pods: %w", err)
	}
	return list.Items, nil
}

// Pod returns the kubelet's pod whose name is name (the static pod's
// metadata.name; the node name suffix is added here).
func (k *Kubelet) Pod(ctx context.Context, name string) (*KubeletPod, error) {
	pods, err := k.Pods(ctx)
	if err != nil {
		return nil, err
	}
	full := name + "-" + k.Opts.NodeName
	for i := range pods {
		if pods[i].Metadata.Name == full {
			return &pods[i], nil
		}
	}
	return nil, fmt.Errorf("kubelet has no pod %s", full)
}

// DeviceCheckpoint is the kubelet's device manager checkpoint.
type DeviceCheckpoint struct {
	// Entries are the kubelet's assignments: pod UID, container, resource,
	// device IDs (all NUMA nodes together).
	Entries []DeviceEntry
	// Registered lists each resource's registered device IDs.
	Registered map[string][]string
}

// DeviceEntry is one container's assignment in the checkpoint.
type DeviceEntry struct {
	PodUID, ContainerName, ResourceName string
	DeviceIDs                           []string
}

// ReadDeviceCheckpoint reads and decodes KubeletCheckpoint.
func ReadDeviceCheckpoint() (*DeviceCheckpoint, error) {
	return ReadDeviceCheckpointAt(KubeletCheckpoint)
}

// ReadDeviceCheckpointAt reads and decodes a kubelet's device manager
// checkpoint at path (a cluster node's: Node.HostPath(KubeletCheckpoint)).
func ReadDeviceCheckpointAt(path string) (*DeviceCheckpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw struct {
		Data struct {
			PodDeviceEntries []struct {
				PodUID        string
				ContainerName string
				ResourceName  string
				DeviceIDs     json.RawMessage
			}
			RegisteredDevices map[string][]string
		}
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cp := &DeviceCheckpoint{Registered: raw.Data.RegisteredDevices}
	for _, e := range raw.Data.PodDeviceEntries {
		de := DeviceEntry{PodUID: e.PodUID, ContainerName: e.ContainerName, ResourceName: e.ResourceName}
		// DeviceIDs is {"<numa node>": [ids]} since 1.20, a plain list before.
		var byNUMA map[string][]string
		if err := json.Unmarshal(e.DeviceIDs, &byNUMA); err == nil {
			for _, ids := range byNUMA {
				de.DeviceIDs = append(de.DeviceIDs, ids...)
			}
		} else if err := json.Unmarshal(e.DeviceIDs, &de.DeviceIDs); err != nil {
			return nil, fmt.Errorf("%s: DeviceIDs %s: %w", path, e.DeviceIDs, err)
		}
		cp.Entries = append(cp.Entries, de)
	}
	return cp, nil
}

// LogTail returns the last n bytes of the kubelet's log.
func (k *Kubelet) LogTail(n int64) string { return fileTail(k.LogPath, n) }

// Grep returns the kubelet log lines matching re.
func (k *Kubelet) Grep(re string) []string {
	data, _ := os.ReadFile(k.LogPath)
	rx := regexp.MustCompile(re)
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if rx.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

// Stop kills the kubelet (SIGTERM, then SIGKILL after 10 s), unmounts what
// is mounted under Dir, removes Dir and the hard-wired paths it created.
// The pods' containers stay with containerd (its Stop removes them). Safe
// to call more than once.
func (k *Kubelet) Stop() error {
	if k.stopped {
		return nil
	}
	k.stopped = true
	k.terminate()
	var errs []error
	if err := k.removeDir(); err != nil {
		errs = append(errs, err)
	}
	for i := len(k.created) - 1; i >= 0; i-- {
		if err := os.RemoveAll(k.created[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if k.unlock != nil {
		k.unlock()
	}
	return errors.Join(errs...)
}

// terminate ends the kubelet's process (SIGTERM, then SIGKILL after 10 s)
// and closes its log.
func (k *Kubelet) terminate() {
	if k.cmd != nil && k.cmd.Process != nil {
		_ = k.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-k.exited:
		case <-time.After(10 * time.Second):
			_ = k.cmd.Process.Kill()
			<-k.exited
		}
	}
	if k.logFile != nil {
		k.logFile.Close()
	}
}

// removeDir unmounts and removes the kubelet's directory. The kubelet
// makes its root directory a shared bind mount of itself, and a mount
// namespace made meanwhile by another process (a runtime's container, a
// test's unshare) holds a peer of it that can propagate back: the root is
// then seen as a mount point again just after it was unmounted ("unlinkat
// .../root: device or resource busy", seen with two runtimes' suites running
// side by side). So unmount and remove again, a few times, before giving up.
func (k *Kubelet) removeDir() error {
	var err error
	for try := 0; try < 10; try++ {
		if try > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		if err = UnmountAll(k.Dir); err != nil {
			continue
		}
		if err = os.RemoveAll(k.Dir); err == nil {
			return nil
		}
	}
	return err
}

// Restart stops the kubelet (SIGTERM, then SIGKILL after 10 s) and starts it
// again on the same directories, configuration and ports, as a node's
// service manager restarts it: the pods' containers keep running, the
// kubelet empties DevicePluginDir of sockets and makes its kubelet.sock
// anew (device plugins register again), and it reads its checkpoint. It
// returns once /pods answers again.
func (k *Kubelet) Restart(ctx context.Context) error {
	if k.stopped {
		return errors.New("kubelet: Restart after Stop")
	}
	k.terminate()
	k.exited = make(chan struct{})
	if err := k.start(); err != nil {
		return err
	}
	if k.ReadOnlyPort == 0 {
		return nil // a cluster node's: the cluster waits for the Node's Ready condition
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := k.Pods(ctx); err == nil {
			return nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("restarted kubelet: /pods did not answer: %v\n--- tail of %s ---\n%s", err, k.LogPath, k.LogTail(6000))
		}
		select {
		case <-k.exited:
			return fmt.Errorf("restarted kubelet exited\n--- tail of %s ---\n%s", k.LogPath, k.LogTail(6000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
