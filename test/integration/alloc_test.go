package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/adaptation/builtin"
	"github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	validator "github.com/containerd/nri/plugins/default-validator/builtin"
	rgen "github.com/opencontainers/runtime-tools/generate"
	"google.golang.org/protobuf/proto"

	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// store is what a runtime keeps of its pods and containers, and what it
// tells plugins when they synchronize. It outlives a runtimeSide, as
// containerd's metadata outlives containerd.
type store struct {
	mu   sync.Mutex
	pods map[string]*api.PodSandbox
	ctrs map[string]*api.Container
}

func newStore() *store {
	return &store{pods: map[string]*api.PodSandbox{}, ctrs: map[string]*api.Container{}}
}

// list returns copies of the pods and containers, ordered by ID.
func (s *store) list() ([]*api.PodSandbox, []*api.Container) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pods []*api.PodSandbox
	var ctrs []*api.Container
	for _, p := range s.pods {
		pods = append(pods, proto.Clone(p).(*api.PodSandbox))
	}
	for _, c := range s.ctrs {
		ctrs = append(ctrs, proto.Clone(c).(*api.Container))
	}
	slices.SortFunc(pods, func(a, b *api.PodSandbox) int { return strings.Compare(a.Id, b.Id) })
	slices.SortFunc(ctrs, func(a, b *api.Container) int { return strings.Compare(a.Id, b.Id) })
	return pods, ctrs
}

func (s *store) put(pod *api.PodSandbox, ctr *api.Container) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods[pod.Id] = pod
	if ctr != nil {
		s.ctrs[ctr.Id] = ctr
	}
}

// run creates and starts container name in pod pod-<name> the way
// containerd does: it asks the plugins for the adjustment, applies it to
// the container's OCI spec, and keeps the container with the spec's
// annotations, environment and devices (what containerd reports at
// Synchronize).
func (r *runtimeSide) run(annotations map[string]string, name string, env ...string) (*api.ContainerAdjustment, error) {
	pod := &api.PodSandbox{Id: "pod-" + name, Name: "pod-" + name, Namespace: "default", Uid: "uid-" + name, Annotations: annotations}
	ctr := &api.Container{Id: "ctr-" + name, PodSandboxId: pod.Id, Name: name, Env: append([]string{"PATH=/usr/bin:/bin"}, env...),
		State: api.ContainerState_CONTAINER_CREATED}
	rpl, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		// containerd undoes a failed creation: StopContainer, then
		// RemoveContainer.
		r.nri.StopContainer(context.Background(), &api.StopContainerRequest{Pod: pod, Container: ctr})
		r.nri.RemoveContainer(context.Background(), &api.RemoveContainerRequest{Pod: pod, Container: ctr})
		return nil, err
	}
	g, err := rgen.New("linux")
	if err != nil {
		r.t.Fatal(err)
	}
	g.ClearProcessEnv()
	for _, e := range ctr.Env {
		k, v, _ := strings.Cut(e, "=")
		g.AddProcessEnv(k, v)
	}
	if err := nrigen.SpecGenerator(&g).Adjust(rpl.GetAdjust()); err != nil {
		r.t.Fatalf("applying the adjustment: %v", err)
	}
	spec := g.Config
	ctr.Annotations = spec.Annotations
	ctr.Env = spec.Process.Env
	ctr.Linux = &api.LinuxContainer{Devices: api.FromOCILinuxDevices(spec.Linux.Devices)}
	ctr.State = api.ContainerState_CONTAINER_RUNNING
	r.kept.put(pod, ctr)
	return rpl.GetAdjust(), nil
}

// stopCtr stops a kept container, as when it exits or is stopped.
func (r *runtimeSide) stopCtr(name string) {
	r.kept.mu.Lock()
	ctr := r.kept.ctrs["ctr-"+name]
	pod := r.kept.pods[ctr.PodSandboxId]
	ctr.State = api.ContainerState_CONTAINER_STOPPED
	r.kept.mu.Unlock()
	if _, err := r.nri.StopContainer(context.Background(), &api.StopContainerRequest{Pod: pod, Container: ctr}); err != nil {
		r.t.Fatal(err)
	}
}

// removePod removes a pod and its containers.
func (r *runtimeSide) removePod(name string) {
	r.kept.mu.Lock()
	pod := r.kept.pods["pod-"+name]
	delete(r.kept.pods, pod.Id)
	for id, c := range r.kept.ctrs {
		if c.PodSandboxId == pod.Id {
			delete(r.kept.ctrs, id)
		}
	}
	r.kept.mu.Unlock()
	if err := r.nri.RemovePodSandbox(context.Background(), &api.RemovePodSandboxRequest{Pod: pod}); err != nil {
		r.t.Fatal(err)
	}
}

// status runs `nri-gpu status` with args and returns its output and exit
// code.
func statusCmd(t *testing.T, socket string, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(binary, append([]string{"status", "--status-socket", socket}, args...)...).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// table returns the plugin's allocation table in alloc.Summary's form,
// from `nri-gpu status -o json`.
func table(t *testing.T, socket string) string {
	t.Helper()
	out, code := statusCmd(t, socket, "-o", "json")
	var s status.Status
	if err := json.Unmarshal([]byte(out), &s); code != 0 || err != nil {
		t.Fatalf("nri-gpu status -o json: exit %d, %v\n%s", code, err, out)
	}
	rows := make([]alloc.GPUState, len(s.GPUs))
	for i, g := range s.GPUs {
		rows[i] = g.GPUState
	}
	return alloc.Summary(rows)
}

// simNodeN generates a node of n GPUs and a config with extra keys.
func simNodeN(t *testing.T, dir string, n int, extra string) (*simnode.Node, string) {
	t.Helper()
	node, err := simnode.Generate(filepath.Join(dir, "node"), simnode.Options{NumGPUs: n, DeviceNodes: true, Layout: simnode.LayoutDebian})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\n%s", node.Root, node.Root, extra)), 0o644); err != nil {
		t.Fatal(err)
	}
	return node, cfg
}

// stopPlugin sends the plugin SIGTERM and returns how it exited; it fails
// the test if the plugin does not stop.
func stopPlugin(t *testing.T, p *pluginProc) error {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("plugin did not stop on SIGTERM")
		return nil
	}
}

// TestAllocationSurvivesRestarts books GPUs over NRI on an exclusive node,
// then restarts the plugin and the runtime while the containers keep
// running, and checks that the table (read with `nri-gpu status`) is the
// same after each restart, that a GPU found in a container made without
// nri-gpu counts as held, and that stop and pod removal release.
func TestAllocationSurvivesRestarts(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	n, cfg := simNode(t, dir, simnode.LayoutDebian)
	f, _ := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("sharing: exclusive\n")
	f.Close()
	socket := filepath.Join(dir, "status.sock")
	args := []string{"run", "--config", cfg, "--status-socket", socket}

	r := startRuntime(t, dir)
	p := startPlugin(t, append(args, "--socket", r.socket)...)
	r.waitSynced(20 * time.Second)

	if _, err := r.run(map[string]string{"gpus.nri-gpu.dev/container.a": "2"}, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.run(nil, "b", "NVIDIA_VISIBLE_DEVICES=2"); err != nil {
		t.Fatal(err)
	}
	_, err := r.run(map[string]string{"gpus.nri-gpu.dev/pod": "2"}, "c")
	if want := `nri-gpu: annotation gpus.nri-gpu.dev/pod: exclusive request for 2 GPUs cannot be met: 1 of the node's 4 GPUs are free; held: GPU 0: default/pod-a/a (exclusive); GPU 1: default/pod-a/a (exclusive); GPU 2: default/pod-b/b (exclusive)`; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("count request on a full node: %v\nwant %s", err, want)
	}
	before := table(t, socket)
	if want := "0=exclusive[default/pod-a/a] 1=exclusive[default/pod-a/a] 2=exclusive[default/pod-b/b] 3=free"; before != want {
		t.Fatalf("table %s\nwant %s", before, want)
	}
	out, code := statusCmd(t, socket)
	t.Logf("nri-gpu status:\n%s", out)
	for _, w := range []string{"Ready: yes", "Sharing policy: exclusive", n.GPUs[2].UUID, "default/pod-b/b (exclusive)"} {
		if code != 0 || !strings.Contains(out, w) {
			t.Errorf("nri-gpu status (exit %d) lacks %q:\n%s", code, w, out)
		}
	}

	// A container the runtime made while nri-gpu was away, with GPU 3's
	// device node in its spec.
	g3 := n.GPUs[3]
	r.kept.put(&api.PodSandbox{Id: "pod-f", Name: "pod-f", Namespace: "default"}, &api.Container{
		Id: "ctr-f", PodSandboxId: "pod-f", Name: "f", State: api.ContainerState_CONTAINER_RUNNING,
		Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: fmt.Sprintf("/dev/nvidia%d", g3.Minor), Type: "c", Major: 195, Minor: int64(g3.Minor)}}},
	})

	// A container whose allocation record is forged (a pod annotation
	// the runtime passed on): it names every GPU, exclusively, but the
	// container has no GPU device node, so it holds nothing.
	forged := alloc.Record{Mode: "exclusive"}
	for _, g := range n.GPUs {
		forged.GPUs = append(forged.GPUs, g.UUID)
	}
	r.kept.put(&api.PodSandbox{Id: "pod-g", Name: "pod-g", Namespace: "other"}, &api.Container{
		Id: "ctr-g", PodSandboxId: "pod-g", Name: "g", State: api.ContainerState_CONTAINER_RUNNING,
		Annotations: map[string]string{alloc.Annotation: forged.Encode()},
	})

	top := t // the restarted plugin must outlive the subtest
	t.Run("plugin restart", func(t *testing.T) {
		stopPlugin(t, p)
		if _, code := statusCmd(t, socket, "--ready"); code != 1 {
			t.Errorf("status --ready with the plugin stopped: exit %d, want 1", code)
		}
		p = startPlugin(top, append(args, "--socket", r.socket)...)
		r.waitSynced(20 * time.Second)
		if got, want := table(t, socket), "0=exclusive[default/pod-a/a] 1=exclusive[default/pod-a/a] 2=exclusive[default/pod-b/b] 3=exclusive[default/pod-f/f]"; got != want {
			t.Errorf("after restart: %s\nwant %s", got, want)
		}
		if !strings.Contains(p.log.String(), "other/pod-g/g: annotation nri-gpu.dev/allocation names GPUs whose device nodes the container does not have") {
			t.Errorf("no warning about the forged record in the log")
		}
		_, err := r.run(map[string]string{"gpus.nri-gpu.dev/pod": "1"}, "c")
		if err == nil || !strings.Contains(err.Error(), "0 of the node's 4 GPUs are free") {
			t.Errorf("count request after restart: %v", err)
		}
		_, err = r.run(map[string]string{"gpus.nri-gpu.dev/pod": "device=0,exclusive=false"}, "d")
		if want := "nri-gpu: annotation gpus.nri-gpu.dev/pod: GPU 0 is held exclusively by default/pod-a/a (exclusive)"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("device=0 after restart: %v", err)
		}
	})

	t.Run("stop releases", func(t *testing.T) {
		r.stopCtr("b")
		adj, err := r.run(map[string]string{"gpus.nri-gpu.dev/pod": "1"}, "c")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(adj.GetEnv(), func(e *api.KeyValue) bool { return e.Value == n.GPUs[2].UUID }) {
			t.Errorf("c did not get GPU 2: %v", adj.GetEnv())
		}
	})

	t.Run("runtime restart", func(t *testing.T) {
		want := table(t, socket)
		r.stop()
		r = startRuntimeWith(t, dir, r.kept)
		defer r.stop()
		r.waitSynced(20 * time.Second)
		if got := table(t, socket); got != want {
			t.Errorf("after the runtime's restart: %s\nwant %s", got, want)
		}
		r.removePod("a")
		if got, want := table(t, socket), "0=free 1=free 2=exclusive[default/pod-c] 3=exclusive[default/pod-f/f]"; got != want {
			t.Errorf("after removing pod a: %s\nwant %s", got, want)
		}
		if !strings.Contains(p.log.String(), "allocation: released by the 1 containers of pod default/pod-a (removed)") {
			t.Errorf("no release in the log")
		}
	})

	// Once the runtime is gone, the plugin is not ready.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, code := statusCmd(t, socket, "--ready")
		if code == 1 && strings.Contains(out, "not ready: not connected to the runtime") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status --ready without a runtime: exit %d, %s", code, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestParallelCreateOverNRI sends 200 concurrent count requests for one
// GPU through NRI to a plugin serving 8 GPUs in exclusive mode: exactly 8
// get a GPU, all different.
func TestParallelCreateOverNRI(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	_, cfg := simNodeN(t, dir, 8, "sharing: exclusive\n")
	r := startRuntime(t, dir)
	defer r.stop()
	startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--status-socket", "")
	r.waitSynced(20 * time.Second)

	var wg sync.WaitGroup
	var mu sync.Mutex
	given := map[string]int{}
	refused := 0
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/pod": "1"}, fmt.Sprint("p", i))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if !strings.Contains(err.Error(), "0 of the node's 8 GPUs are free") {
					t.Errorf("unexpected error %v", err)
				}
				refused++
				return
			}
			for _, e := range adj.GetEnv() {
				if e.Key == "NVIDIA_VISIBLE_DEVICES" {
					given[e.Value]++
				}
			}
		}()
	}
	wg.Wait()
	if len(given) != 8 || refused != 192 {
		t.Errorf("%d distinct GPUs given (%v), %d requests refused; want 8 and 192", len(given), given, refused)
	}
	for gpu, n := range given {
		if n != 1 {
			t.Errorf("GPU %s given %d times", gpu, n)
		}
	}
}

// TestFailedCreationReleases checks what happens when the runtime fails a
// creation after nri-gpu booked GPUs for it: here a later plugin refuses
// the container, and the runtime undoes the creation as containerd does
// (StopContainer, RemoveContainer), which gives the GPUs back.
func TestFailedCreationReleases(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	_, cfg := simNodeN(t, dir, 2, "sharing: exclusive\n")
	refuse := &builtin.BuiltinPlugin{Base: "refuse", Index: "90", Handlers: builtin.BuiltinHandlers{
		CreateContainer: func(_ context.Context, req *api.CreateContainerRequest) (*api.CreateContainerResponse, error) {
			if req.GetPod().GetAnnotations()["refuse"] == "yes" {
				return nil, fmt.Errorf("refused by a later plugin")
			}
			return &api.CreateContainerResponse{}, nil
		},
	}}
	r := startRuntimeWith(t, dir, newStore(), nri.WithBuiltinPlugins(refuse))
	defer r.stop()
	socket := filepath.Join(dir, "status.sock")
	startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--status-socket", socket)
	r.waitSynced(20 * time.Second)

	_, err := r.run(map[string]string{"gpus.nri-gpu.dev/pod": "2", "refuse": "yes"}, "doomed")
	if err == nil || !strings.Contains(err.Error(), "refused by a later plugin") {
		t.Fatalf("creation refused by a later plugin: %v", err)
	}
	if got := table(t, socket); got != "0=free 1=free" {
		t.Errorf("after the undone creation: %s", got)
	}
	if _, err := r.run(map[string]string{"gpus.nri-gpu.dev/pod": "2"}, "next"); err != nil {
		t.Errorf("the GPUs of the undone creation are still booked: %v", err)
	}
}

// TestRequiredPluginFailClosed runs the runtime side with NRI's default
// validator, as containerd 2.2+ does with it enabled: a pod that names
// nri-gpu in required-plugins.noderesource.dev is refused while nri-gpu is
// not connected, and gets its GPUs once it is.
func TestRequiredPluginFailClosed(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	_, cfg := simNode(t, dir, simnode.LayoutDebian)
	r := startRuntimeWith(t, dir, newStore(), nri.WithDefaultValidator(&validator.DefaultValidatorConfig{Enable: true}))
	defer r.stop()
	ann := map[string]string{
		"required-plugins.noderesource.dev/container.train": `["nri-gpu"]`,
		"gpus.nri-gpu.dev/container.train":                  "1",
	}
	if adj, err := r.create(ann, "train"); err == nil || !strings.Contains(err.Error(), `required plugin "nri-gpu" not present`) {
		t.Fatalf("without nri-gpu: %v, %v", adj, err)
	}
	// A pod that does not require it is created, without GPUs.
	if adj, err := r.create(map[string]string{"gpus.nri-gpu.dev/container.train": "1"}, "train"); err != nil || len(adj.GetLinux().GetDevices()) != 0 {
		t.Fatalf("not required, without nri-gpu: %v, %v", adj, err)
	}

	p := startPlugin(t, "run", "--config", cfg, "--socket", r.socket, "--status-socket", "")
	r.waitSynced(20 * time.Second)
	adj, err := r.create(ann, "train")
	if err != nil || len(adj.GetLinux().GetDevices()) == 0 {
		t.Fatalf("with nri-gpu: %v, %v", adj, err)
	}

	// Once nri-gpu is gone, the pod is refused again. NRI v0.12.3 lets
	// one creation through first: the request that finds the plugin's
	// connection closed drops the plugin from the call but has already
	// listed it as present for the validator (adaptation.CreateContainer
	// calls validate.AddPlugin before the plugin answers). That container
	// gets no GPU; every later one is refused.
	stopPlugin(t, p)
	slipped := 0
	for i := 0; ; i++ {
		adj, err := r.create(ann, "train")
		if err != nil {
			if !strings.Contains(err.Error(), `required plugin "nri-gpu" not present`) {
				t.Fatalf("after nri-gpu stopped: %v", err)
			}
			break
		}
		if len(adj.GetLinux().GetDevices()) != 0 {
			t.Fatalf("GPUs injected by a stopped plugin: %v", adj)
		}
		slipped++
		if slipped > 1 {
			t.Fatalf("%d creations let through after nri-gpu stopped", slipped)
		}
	}
	t.Logf("creations let through after nri-gpu stopped: %d", slipped)
	for range 3 {
		if _, err := r.create(ann, "train"); err == nil || !strings.Contains(err.Error(), `required plugin "nri-gpu" not present`) {
			t.Fatalf("after nri-gpu stopped: %v", err)
		}
	}
}
