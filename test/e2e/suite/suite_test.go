// Package suite is nri-gpu's end-to-end suite: a real containerd and runc
// (test/e2e/harness), the built nri-gpu plugin against a simulated GPU node
// (test/simnode), and checks made from inside real containers.
//
// It needs root (CI is root). NRI_GPU_E2E_RUNTIME picks the runtime
// (harness.StartRuntimeForTest: containerd-2.4.2 by default,
// containerd-2.2.9, containerd-1.7.36, crio-1.34.0);
// NRI_GPU_E2E_CONTAINERD_VERSION=v2.2.9
// is the older spelling of NRI_GPU_E2E_RUNTIME=containerd-2.2.9.
package suite

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// nriGPU builds bin/nri-gpu from this checkout once per test process.
func nriGPU(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		repo := filepath.Join(filepath.Dir(file), "..", "..", "..")
		dir, err := os.MkdirTemp("", "nri-gpu-e2e-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "nri-gpu")
		cmd := exec.Command("go", "build", "-o", binary, "./cmd/nri-gpu")
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building nri-gpu: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// node is a simulated GPU node with its nri-gpu configuration.
type node struct {
	*simnode.Node
	config string
}

func newNode(t *testing.T, layout simnode.Layout, extraConfig string) *node {
	t.Helper()
	dir, err := os.MkdirTemp("", "nri-gpu-e2e-node-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n, err := simnode.Generate(filepath.Join(dir, "root"), simnode.Options{NumGPUs: 4, SwapMinors: true, DeviceNodes: true, Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	data := fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\n%s", n.Root, n.Root, extraConfig)
	if err := os.WriteFile(cfg, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return &node{Node: n, config: cfg}
}

// appendConfig adds YAML to the node's nri-gpu configuration, for keys
// that name paths under the node's root (known only once it is made).
func (n *node) appendConfig(t *testing.T, yaml string) {
	t.Helper()
	f, err := os.OpenFile(n.config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(yaml); err != nil {
		t.Fatal(err)
	}
}

// plugin is a running `nri-gpu run`.
type plugin struct {
	cmd  *exec.Cmd
	log  *lockedBuffer
	done chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startPlugin starts nri-gpu against rt's NRI socket, with extra flags, and
// waits until the runtime has synchronized it.
func startPlugin(t *testing.T, rt harness.Runtime, n *node, extra ...string) *plugin {
	t.Helper()
	p := &plugin{log: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(nriGPU(t), append([]string{"run", "--config", n.config, "--socket", rt.NRISocketPath()}, extra...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("--- nri-gpu log ---\n%s", p.log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.log.String(), "synchronized with the runtime") {
		if time.Now().After(deadline) {
			t.Fatalf("nri-gpu did not synchronize with %s:\n%s", rt.Name(), p.log.String())
		}
		select {
		case <-p.done:
			t.Fatalf("nri-gpu exited:\n%s", p.log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return p
}

// stop kills the plugin (SIGKILL: as a crash would) and waits for it.
func (p *plugin) stop() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// world is a runtime with nri-gpu on a simulated node.
type world struct {
	t      *testing.T
	c      harness.Runtime
	cri    *harness.CRI
	node   *node
	plugin *plugin
	ctx    context.Context
}

func newWorld(t *testing.T, layout simnode.Layout, extraConfig string) *world {
	t.Helper()
	c := startRuntime(t, harness.RuntimeOptions{})
	n := newNode(t, layout, extraConfig)
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: context.Background()}
	w.plugin = startPlugin(t, c, n)
	return w
}

// ctr is a running container.
type ctr struct {
	w    *world
	id   string
	name string
}

// run starts a pod with the given annotations and one container in it.
func (w *world) run(name string, ann map[string]string, spec harness.ContainerSpec) (*ctr, error) {
	w.t.Helper()
	return w.runIn("", name, ann, spec)
}

// runIn starts a pod in namespace ns ("" = default) with one container.
func (w *world) runIn(ns, name string, ann map[string]string, spec harness.ContainerSpec) (*ctr, error) {
	w.t.Helper()
	pod, err := w.cri.RunPodWith(w.ctx, name, ann, harness.PodOptions{Namespace: ns})
	if err != nil {
		return nil, err
	}
	w.t.Cleanup(func() {
		w.cri.StopPod(context.Background(), pod)
		w.cri.RemovePod(context.Background(), pod)
	})
	spec.Name = name
	if spec.Image == "" {
		spec.Image = harness.BusyboxImage
	}
	if len(spec.Command) == 0 {
		spec.Command = []string{"sleep", "3600"}
	}
	id, err := w.cri.Run(w.ctx, pod, spec)
	if err != nil {
		return nil, err
	}
	return &ctr{w: w, id: id, name: name}, nil
}

func (w *world) mustRun(name string, ann map[string]string, spec harness.ContainerSpec) *ctr {
	w.t.Helper()
	c, err := w.run(name, ann, spec)
	if err != nil {
		w.t.Fatalf("running %s: %v", name, err)
	}
	return c
}

// sh runs a shell command in the container; it returns stdout+stderr and
// the exit code.
func (c *ctr) sh(cmd string) (string, int) {
	c.w.t.Helper()
	out, errOut, code, err := c.w.cri.Exec(c.w.ctx, c.id, "sh", "-c", cmd)
	if err != nil {
		c.w.t.Fatalf("exec %q in %s: %v", cmd, c.name, err)
	}
	return out + errOut, code
}

// view is what a failing check prints: the container's devices, env and
// mounts as it sees them.
func (c *ctr) view() string {
	out, _ := c.sh("echo '# ls -l /dev'; ls -l /dev; echo '# env'; env | sort; echo '# mounts'; grep -E 'nvidia|firmware' /proc/self/mountinfo")
	return out
}

func itoa(i int) string { return fmt.Sprint(i) }

// startRuntime starts the suite's runtime (NRI_GPU_E2E_RUNTIME) for a test.
func startRuntime(t *testing.T, opts harness.RuntimeOptions) harness.Runtime {
	t.Helper()
	return harness.StartRuntimeForTest(t, "", opts)
}

// runtimeName is the suite's runtime, e.g. "containerd-1.7.36".
func runtimeName() string { return harness.RuntimeFromEnv() }

// isContainerd1 says whether the suite runs on containerd 1.x (NRI v0.8.0).
func isContainerd1() bool { return strings.HasPrefix(runtimeName(), "containerd-1.") }
