package plugin

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestEmitCDIByRuntime connects a plugin configured with emit: cdi to the
// real runtime side of NRI (the adaptation library a runtime embeds) as
// containerd 1.7.36 and as containerd 2.4.2: containerd 1.7 drops CDI
// devices returned through NRI, so its GPUs must go as edits, with one
// warning naming the runtime, however new the NRI library it reports; 2.4
// gets CDI device names.
func TestEmitCDIByRuntime(t *testing.T) {
	for _, tc := range []struct {
		version  string
		wantCDI  bool
		warnings int
	}{
		{"v1.7.36", false, 1},
		{"1.7.36+unknown", false, 1}, // containerd built without its release ldflags
		{"v2.4.2", true, 0},
	} {
		t.Run(tc.version, func(t *testing.T) {
			var log lockedLog
			l := logrus.New()
			l.SetOutput(&log)
			cfg := config.Default()
			cfg.Emit = config.EmitCDI
			snap := simnode.MemorySnapshot()
			st := &node.State{Config: cfg, Source: adjust.Prepare(snap, layout), Sharing: sharing.Shared, CDINames: map[string]string{}}
			for _, g := range snap.GPUs {
				st.CDINames[g.UUID] = fmt.Sprintf("nvidia.com/gpu=%d", g.Index)
			}
			p, err := newPlugin(l, func(opts ...node.Option) (*node.Node, error) { return node.Fixed(st, l, opts...), nil })
			if err != nil {
				t.Fatal(err)
			}

			dir := t.TempDir()
			socket := filepath.Join(dir, "nri.sock")
			sync := func(ctx context.Context, cb nri.SyncCB) error { _, err := cb(ctx, nil, nil); return err }
			update := func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil }
			a, err := nri.New("containerd", tc.version, sync, update,
				nri.WithPluginPath(filepath.Join(dir, "plugins")), nri.WithPluginConfigPath(filepath.Join(dir, "conf.d")), nri.WithSocketPath(socket))
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Start(); err != nil {
				t.Fatal(err)
			}
			defer a.Stop()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { p.Run(ctx, RunOptions{SocketPath: socket, Name: "nri-gpu", Index: "10"}); close(done) }()
			defer func() { cancel(); <-done }()
			for deadline := time.Now().Add(10 * time.Second); !p.Ready(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the plugin did not synchronize:\n%s", log.String())
				}
			}

			pod := &api.PodSandbox{Id: "pod", Name: "p", Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.dev/pod": "device=1"}}
			// The plugin is ready once its Synchronize returns; the
			// runtime's side adds it to its plugins only after that, so
			// until then a CreateContainer reaches no plugin (an empty
			// adjustment). Wait for a container to reach it.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				resp, err := a.CreateContainer(ctx, &nri.CreateContainerRequest{Pod: pod, Container: &api.Container{Id: "probe", PodSandboxId: pod.Id, Name: "probe"}})
				if err != nil {
					t.Fatal(err)
				}
				if adj := resp.GetAdjust(); len(adj.GetCDIDevices()) > 0 || len(adj.GetLinux().GetDevices()) > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no CreateContainer reached the plugin:\n%s", log.String())
				}
			}
			for i := range 2 { // the warning is once per connection, not per container
				ctr := &api.Container{Id: fmt.Sprint("ctr", i), PodSandboxId: pod.Id, Name: fmt.Sprint("c", i)}
				resp, err := a.CreateContainer(ctx, &nri.CreateContainerRequest{Pod: pod, Container: ctr})
				if err != nil {
					t.Fatal(err)
				}
				adj := resp.GetAdjust()
				var cdi, nodes []string
				for _, d := range adj.GetCDIDevices() {
					cdi = append(cdi, d.GetName())
				}
				for _, d := range adj.GetLinux().GetDevices() {
					nodes = append(nodes, d.GetPath())
				}
				if tc.wantCDI && (len(cdi) != 1 || cdi[0] != "nvidia.com/gpu=1") {
					t.Errorf("%s: CDI devices %q, want [nvidia.com/gpu=1]", ctr.Id, cdi)
				}
				if !tc.wantCDI && (len(cdi) != 0 || !strings.Contains(strings.Join(nodes, " "), "/dev/nvidiactl")) {
					t.Errorf("%s: CDI devices %q, device nodes %q: want edits only", ctr.Id, cdi, nodes)
				}
			}
			warn := "emit: cdi: containerd " + tc.version + " drops CDI devices returned through NRI (containerd 2.2.0 and later inject them); GPUs are injected as edits"
			if got := strings.Count(log.String(), warn); got != tc.warnings {
				t.Errorf("%d warnings %q, want %d:\n%s", got, warn, tc.warnings, log.String())
			}
		})
	}
}

func TestRuntimeInjectsCDI(t *testing.T) {
	for _, tc := range []struct {
		runtime, version, nri string
		want                  bool
	}{
		{"containerd", "v1.7.36", "v0.8.0", false},
		{"containerd", "v1.7.36", "v0.12.3", false},
		{"containerd", "v2.1.4", "v0.9.0", false},
		{"containerd", "v2.4.2", "v0.12.3", true},
		{"containerd", "v2.2.9", "unknown", false},
		{"cri-o", "1.31.0", "v0.6.1", false},
		{"cri-o", "1.34.0", "v0.10.0", false}, // CRI-O 1.34 drops them whatever its NRI version
		{"cri-o", "v1.34.0", "v0.10.0", false},
		{"cri-o", "v1.33.2", "v0.10.0", false},
		{"cri-o", "v1.35.0", "v0.10.0", true},
		{"test-runtime", "0.0.1", "", false},
	} {
		if got, why := runtimeInjectsCDI(tc.runtime, tc.version, tc.nri); got != tc.want || (got == (why != "")) {
			t.Errorf("%s %s (NRI %s): %v %q, want %v", tc.runtime, tc.version, tc.nri, got, why, tc.want)
		}
	}
}

// lockedLog is a log the plugin's goroutines write while the test reads it.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
