package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRI wraps the CRI runtime and image clients of one runtime (containerd or
// CRI-O) with helpers for tests. The raw clients are exported for anything the
// helpers do not cover.
type CRI struct {
	Runtime runtimeapi.RuntimeServiceClient
	Image   runtimeapi.ImageServiceClient
	// podLogDir is the parent of the pods' log directories; logTail the
	// runtime's log, for errors.
	podLogDir string
	logTail   func(n int64) string
	// killFirst: StopPod kills the pod's running containers first.
	killFirst bool
	mu        sync.Mutex
	pods      map[string]*runtimeapi.PodSandboxConfig
}

func newCRI(conn *grpc.ClientConn, podLogDir string, logTail func(int64) string) *CRI {
	return &CRI{
		Runtime:   runtimeapi.NewRuntimeServiceClient(conn),
		Image:     runtimeapi.NewImageServiceClient(conn),
		podLogDir: podLogDir,
		logTail:   logTail,
	}
}

// wrap adds the tail of the runtime's log to an error.
func (r *CRI) wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	msg := fmt.Sprintf(format, args...)
	return &CRIError{Op: msg, Err: err, LogTail: r.logTail(2500)}
}

// CRIError is a failed CRI call with the tail of the runtime's log at that time.
type CRIError struct {
	Op      string
	Err     error
	LogTail string
}

func (e *CRIError) Error() string {
	return fmt.Sprintf("%s: %v\n--- tail of the runtime's log ---\n%s", e.Op, e.Err, e.LogTail)
}

func (e *CRIError) Unwrap() error { return e.Err }

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// PodOptions are the less common pod settings.
type PodOptions struct {
	Namespace string            // default "default"
	Labels    map[string]string // pod labels
	// CgroupParent is linux.cgroup_parent; empty (the default) puts containers at
	// /<controller>/k8s.io/<container id> (containerd's default cgroupfs path).
	CgroupParent string
	// RuntimeHandler selects a runtime handler other than the default
	// ("runc"), e.g. one added through ContainerdOptions.ExtraConfig.
	RuntimeHandler string
	// Privileged lets the pod's containers be privileged (a
	// ContainerSpec's Privileged), as a privileged Kubernetes pod.
	Privileged bool
}

// RunPod runs a pod sandbox with host networking (no CNI needed) and returns its id.
func (r *CRI) RunPod(ctx context.Context, name string, annotations map[string]string) (string, error) {
	return r.RunPodWith(ctx, name, annotations, PodOptions{})
}

// RunPodWith is RunPod with more options.
func (r *CRI) RunPodWith(ctx context.Context, name string, annotations map[string]string, o PodOptions) (string, error) {
	cfg := r.podConfig(name, annotations, o)
	if err := os.MkdirAll(cfg.LogDirectory, 0o755); err != nil {
		return "", err
	}
	resp, err := r.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: o.RuntimeHandler})
	if err != nil {
		return "", r.wrap(err, "RunPodSandbox %s", name)
	}
	r.rememberPod(resp.PodSandboxId, cfg)
	return resp.PodSandboxId, nil
}

func (r *CRI) podConfig(name string, annotations map[string]string, o PodOptions) *runtimeapi.PodSandboxConfig {
	ns := o.Namespace
	if ns == "" {
		ns = "default"
	}
	uid := randomID()
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: ns},
		// No Hostname: a host-network pod shares the host's UTS namespace, and runc
		// refuses to set a hostname there.
		LogDirectory: filepath.Join(r.podLogDir, ns+"_"+name+"_"+uid),
		Labels:       o.Labels,
		Annotations:  annotations,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: o.CgroupParent,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				Privileged: o.Privileged,
				NamespaceOptions: &runtimeapi.NamespaceOption{
					Network: runtimeapi.NamespaceMode_NODE,
					Pid:     runtimeapi.NamespaceMode_CONTAINER,
					Ipc:     runtimeapi.NamespaceMode_POD,
				},
			},
		},
	}
}

// ContainerSpec describes a container to create.
type ContainerSpec struct {
	Name        string
	Image       string   // e.g. BusyboxImage
	Command     []string // entrypoint override; empty: the image's
	Args        []string // arguments; empty: the image's Cmd (if Command is empty too)
	Env         map[string]string
	Annotations map[string]string
	// Labels are the container's CRI labels. The kubelet's
	// io.kubernetes.container.name (ContainerNameLabel = Name) is added
	// unless Labels sets it or NoNameLabel is set: CRI-O gives NRI the
	// container's name only from that label.
	Labels      map[string]string
	NoNameLabel bool
	Mounts      []*runtimeapi.Mount
	Devices     []*runtimeapi.Device
	CDIDevices  []string // CDI device names (e.g. nvidia.com/gpu=0)

	RunAsUser      *int64
	RunAsGroup     *int64
	ReadOnlyRootfs bool
	DropAllCaps    bool
	// AddCaps are capabilities added to the runtime's default set (e.g.
	// "MKNOD", which CRI-O's default set leaves out).
	AddCaps    []string
	Privileged bool
}

// ContainerNameLabel is the CRI label with the container's name that the
// kubelet sets on every container.
const ContainerNameLabel = "io.kubernetes.container.name"

// CreateContainer creates a container in a pod made by RunPod and returns its id.
func (r *CRI) CreateContainer(ctx context.Context, podID string, spec ContainerSpec) (string, error) {
	podCfg := r.podConfigOf(podID)
	if podCfg == nil {
		return "", fmt.Errorf("unknown pod %s (not created by this harness)", podID)
	}
	var envs []*runtimeapi.KeyValue
	keys := make([]string, 0, len(spec.Env))
	for k := range spec.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		envs = append(envs, &runtimeapi.KeyValue{Key: k, Value: []byte(spec.Env[k])})
	}
	sc := &runtimeapi.LinuxContainerSecurityContext{
		NamespaceOptions: podCfg.Linux.SecurityContext.NamespaceOptions,
		ReadonlyRootfs:   spec.ReadOnlyRootfs,
		Privileged:       spec.Privileged,
	}
	if spec.RunAsUser != nil {
		sc.RunAsUser = &runtimeapi.Int64Value{Value: *spec.RunAsUser}
	}
	if spec.RunAsGroup != nil {
		sc.RunAsGroup = &runtimeapi.Int64Value{Value: *spec.RunAsGroup}
	}
	if spec.DropAllCaps {
		sc.Capabilities = &runtimeapi.Capability{DropCapabilities: []string{"ALL"}}
	}
	if len(spec.AddCaps) > 0 {
		if sc.Capabilities == nil {
			sc.Capabilities = &runtimeapi.Capability{}
		}
		sc.Capabilities.AddCapabilities = spec.AddCaps
	}
	labels := spec.Labels
	if _, set := labels[ContainerNameLabel]; !set && !spec.NoNameLabel {
		labels = make(map[string]string, len(spec.Labels)+1)
		for k, v := range spec.Labels {
			labels[k] = v
		}
		labels[ContainerNameLabel] = spec.Name
	}
	var cdi []*runtimeapi.CDIDevice
	for _, n := range spec.CDIDevices {
		cdi = append(cdi, &runtimeapi.CDIDevice{Name: n})
	}
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: spec.Name},
		// UserSpecifiedImage as the kubelet sets it: CRI-O 1.34 refuses a
		// container without it (it checks the image's signature policy).
		Image:       &runtimeapi.ImageSpec{Image: spec.Image, UserSpecifiedImage: spec.Image},
		Command:     spec.Command,
		Args:        spec.Args,
		Envs:        envs,
		Labels:      labels,
		Annotations: spec.Annotations,
		Mounts:      spec.Mounts,
		Devices:     spec.Devices,
		CDIDevices:  cdi,
		LogPath:     spec.Name + ".log",
		Linux:       &runtimeapi.LinuxContainerConfig{SecurityContext: sc},
	}
	resp, err := r.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  podID,
		Config:        cfg,
		SandboxConfig: podCfg,
	})
	if err != nil {
		return "", r.wrap(err, "CreateContainer %s", spec.Name)
	}
	return resp.ContainerId, nil
}

// Start starts a created container.
func (r *CRI) Start(ctx context.Context, id string) error {
	_, err := r.Runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
	return r.wrap(err, "StartContainer %s", id)
}

// Run creates and starts a container.
func (r *CRI) Run(ctx context.Context, podID string, spec ContainerSpec) (string, error) {
	id, err := r.CreateContainer(ctx, podID, spec)
	if err != nil {
		return "", err
	}
	return id, r.Start(ctx, id)
}

// ExecTimeout bounds Exec calls (ExecSync's timeout).
var ExecTimeout = 30 * time.Second

// Exec runs cmd in a running container through ExecSync. A non-zero exit code is
// not an error; err is for failures to run it at all.
func (r *CRI) Exec(ctx context.Context, id string, cmd ...string) (stdout, stderr string, exitCode int, err error) {
	resp, err := r.Runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: int64(ExecTimeout / time.Second)})
	if err != nil {
		return "", "", -1, r.wrap(err, "ExecSync %s %q", id, cmd)
	}
	return string(resp.Stdout), string(resp.Stderr), int(resp.ExitCode), nil
}

// StopContainer stops a container, giving it timeout to exit after SIGTERM.
func (r *CRI) StopContainer(ctx context.Context, id string, timeout time.Duration) error {
	_, err := r.Runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: int64(timeout / time.Second)})
	return r.wrap(err, "StopContainer %s", id)
}

// RemoveContainer removes a container (stopping it if needed).
func (r *CRI) RemoveContainer(ctx context.Context, id string) error {
	_, err := r.Runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
	return r.wrap(err, "RemoveContainer %s", id)
}

// StopPod stops a pod sandbox and its containers.
func (r *CRI) StopPod(ctx context.Context, podID string) error {
	if r.killFirst {
		// CRI-O gives each container the caller's deadline (default 10 s)
		// to exit after SIGTERM, which sleep as PID 1 ignores; the kubelet
		// stops them before. Kill them (timeout 0), as containerd does.
		if ctrs, err := r.ListContainers(ctx, podID); err == nil {
			for _, c := range ctrs {
				if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
					_ = r.StopContainer(ctx, c.Id, 0)
				}
			}
		}
	}
	_, err := r.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: podID})
	return r.wrap(err, "StopPodSandbox %s", podID)
}

// RemovePod removes a pod sandbox and its containers.
func (r *CRI) RemovePod(ctx context.Context, podID string) error {
	_, err := r.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: podID})
	if err == nil {
		r.forgetPod(podID)
	}
	return r.wrap(err, "RemovePodSandbox %s", podID)
}

// ListContainers lists containers, optionally only those of one pod ("" for all).
func (r *CRI) ListContainers(ctx context.Context, podID string) ([]*runtimeapi.Container, error) {
	var f *runtimeapi.ContainerFilter
	if podID != "" {
		f = &runtimeapi.ContainerFilter{PodSandboxId: podID}
	}
	resp, err := r.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: f})
	if err != nil {
		return nil, r.wrap(err, "ListContainers")
	}
	return resp.Containers, nil
}

// ListPods lists all pod sandboxes.
func (r *CRI) ListPods(ctx context.Context) ([]*runtimeapi.PodSandbox, error) {
	resp, err := r.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, r.wrap(err, "ListPodSandbox")
	}
	return resp.Items, nil
}

// ContainerInfo is a container's CRI status plus the decoded verbose info.
type ContainerInfo struct {
	Status *runtimeapi.ContainerStatus
	// Info is the raw verbose info map (key "info" holds containerd's JSON).
	Info map[string]string
	// Pid is the container's init process as seen from the host (0 if not running).
	Pid int
	// Spec is the OCI runtime spec containerd generated (after NRI adjustments).
	Spec *rspec.Spec
	// RuntimeOptions, SnapshotKey and Snapshotter as containerd reports them.
	Snapshotter string
	SnapshotKey string
}

// Inspect returns a container's status and verbose info, with the OCI spec decoded.
func (r *CRI) Inspect(ctx context.Context, id string) (*ContainerInfo, error) {
	resp, err := r.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return nil, r.wrap(err, "ContainerStatus %s", id)
	}
	ci := &ContainerInfo{Status: resp.Status, Info: resp.Info}
	if raw, ok := resp.Info["info"]; ok {
		var v struct {
			Pid         int         `json:"pid"`
			RuntimeSpec *rspec.Spec `json:"runtimeSpec"`
			Snapshotter string      `json:"snapshotter"`
			SnapshotKey string      `json:"snapshotKey"`
		}
		if err := json.Unmarshal([]byte(raw), &v); err != nil {
			return nil, fmt.Errorf("decode verbose info of %s: %w", id, err)
		}
		ci.Pid, ci.Spec, ci.Snapshotter, ci.SnapshotKey = v.Pid, v.RuntimeSpec, v.Snapshotter, v.SnapshotKey
	}
	return ci, nil
}

// RuntimeSpec returns the OCI spec of a container (decoded from the verbose
// ContainerStatus info).
func (r *CRI) RuntimeSpec(ctx context.Context, id string) (*rspec.Spec, error) {
	ci, err := r.Inspect(ctx, id)
	if err != nil {
		return nil, err
	}
	if ci.Spec == nil {
		return nil, fmt.Errorf("container %s: no runtimeSpec in verbose info", id)
	}
	return ci.Spec, nil
}

// PodPid returns the pid of a pod's sandbox (pause) process.
func (r *CRI) PodPid(ctx context.Context, podID string) (int, error) {
	resp, err := r.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: podID, Verbose: true})
	if err != nil {
		return 0, r.wrap(err, "PodSandboxStatus %s", podID)
	}
	var v struct {
		Pid int `json:"pid"`
	}
	if raw, ok := resp.Info["info"]; ok {
		_ = json.Unmarshal([]byte(raw), &v)
	}
	return v.Pid, nil
}

// ContainerLog returns what a container wrote to stdout/stderr (CRI log format:
// one "<time> <stream> <tag> <line>" per line).
func (r *CRI) ContainerLog(ctx context.Context, id string) (string, error) {
	ci, err := r.Inspect(ctx, id)
	if err != nil {
		return "", err
	}
	if ci.Status.LogPath == "" {
		return "", errors.New("container has no log path")
	}
	b, err := os.ReadFile(ci.Status.LogPath)
	return string(b), err
}

// WaitExit waits until a container has exited and returns its exit code.
func (r *CRI) WaitExit(ctx context.Context, id string, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := r.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return -1, r.wrap(err, "ContainerStatus %s", id)
		}
		if resp.Status.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			return int(resp.Status.ExitCode), nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("container %s still %s after %s", id, resp.Status.State, timeout)
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// CleanupAll stops and removes every pod sandbox (and so every container).
func (r *CRI) CleanupAll(ctx context.Context) error {
	pods, err := r.ListPods(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pods {
		if err := r.StopPod(ctx, p.Id); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := r.RemovePod(ctx, p.Id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Pod configs by id: CreateContainer must send the sandbox config again.
func (r *CRI) rememberPod(id string, cfg *runtimeapi.PodSandboxConfig) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pods == nil {
		r.pods = map[string]*runtimeapi.PodSandboxConfig{}
	}
	r.pods[id] = cfg
}

func (r *CRI) forgetPod(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pods, id)
}

func (r *CRI) podConfigOf(id string) *runtimeapi.PodSandboxConfig {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pods[id]
}
