package plugin

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

var layout = adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib"}

// memPlugin is a plugin with configuration cfg serving the in-memory node
// of simnode.MemorySnapshot (8 GPUs, 40 driver files), logging to log.
func memPlugin(cfg config.Config, log *logrus.Logger) *Plugin {
	sharing, err := sharing.ParseMode(string(cfg.Sharing))
	if err != nil {
		panic(err)
	}
	st := &node.State{Config: cfg, Source: adjust.Prepare(simnode.MemorySnapshot(), layout), Sharing: sharing}
	p, err := newPlugin(log, func(opts ...node.Option) (*node.Node, error) { return node.Fixed(st, log, opts...), nil })
	if err != nil {
		panic(err)
	}
	return p
}

// testPlugin is a plugin serving the in-memory 8-GPU node of benchSnapshot
// with the given sharing policy, logging into log.
func testPlugin(mode sharing.Mode, log io.Writer) *Plugin {
	l := logrus.New()
	l.SetOutput(log)
	cfg := config.Default()
	cfg.Sharing = config.Sharing(mode.String())
	return memPlugin(cfg, l)
}

// podCtr returns a pod with one container, main, that asks for ann by the
// container-level annotation (a container's own GPUs, released when it
// stops; see pod_test.go for pod-level counts).
func podCtr(name, ann string, env ...string) (*api.PodSandbox, *api.Container) {
	pod := &api.PodSandbox{Id: "pod-" + name, Name: name, Namespace: "ns"}
	if ann != "" {
		pod.Annotations = map[string]string{"gpus.nri-gpu.dev/container.main": ann}
	}
	return pod, &api.Container{Id: "ctr-" + name, PodSandboxId: pod.Id, Name: "main", Env: env}
}

func visible(adj *api.ContainerAdjustment) string {
	for _, e := range adj.GetEnv() {
		if e.Key == "NVIDIA_VISIBLE_DEVICES" {
			return e.Value
		}
	}
	return ""
}

func uuid(i int) string { return fmt.Sprintf("GPU-%08x-558d-fb20-8eca-25de8b98f5a7", i) }

func TestCreateContainerAllocates(t *testing.T) {
	ctx := context.Background()
	var log strings.Builder
	p := testPlugin(sharing.Shared, &log)
	for _, tc := range []struct {
		name, ann string
		env       []string
		want      string // NVIDIA_VISIBLE_DEVICES, or the error
		annot     string // the allocation annotation
	}{
		{"a", "2,exclusive=true", nil, uuid(0) + "," + uuid(1), `{"version":1,"mode":"exclusive","gpus":["` + uuid(0) + `","` + uuid(1) + `"]}`},
		{"b", "3", nil, uuid(2) + "," + uuid(3) + "," + uuid(4), `{"version":1,"mode":"shared","gpus":["` + uuid(2) + `","` + uuid(3) + `","` + uuid(4) + `"]}`},
		// Least shared first: 5, 6, 7 are free.
		{"c", `"device=7,2"`, nil, uuid(7) + "," + uuid(2), `{"version":1,"mode":"shared","gpus":["` + uuid(7) + `","` + uuid(2) + `"]}`},
		{"d", "2", nil, uuid(5) + "," + uuid(6), ""},
		{"e", "device=1", nil, "nri-gpu: annotation gpus.nri-gpu.dev/container.main: GPU 1 is held exclusively by ns/a/main (exclusive)", ""},
		{"f", "all", nil, "nri-gpu: annotation gpus.nri-gpu.dev/container.main: GPU 0 is held exclusively by ns/a/main (exclusive)", ""},
		{"g", "", []string{"NVIDIA_VISIBLE_DEVICES=all"}, "nri-gpu: env NVIDIA_VISIBLE_DEVICES: GPU 0 is held exclusively by ns/a/main (exclusive)", ""},
		{"h", "1,exclusive=true", nil, "nri-gpu: annotation gpus.nri-gpu.dev/container.main: exclusive request for 1 GPU cannot be met: 0 of the node's 8 GPUs are free; held: " +
			"GPU 0: ns/a/main (exclusive); GPU 1: ns/a/main (exclusive); GPU 2: ns/b/main (shared), ns/c/main (shared); GPU 3: ns/b/main (shared); " +
			"GPU 4: ns/b/main (shared); GPU 5: ns/d/main (shared); GPU 6: ns/d/main (shared); GPU 7: ns/c/main (shared)", ""},
		// The driver alone holds no GPU.
		{"i", "", []string{"NVIDIA_VISIBLE_DEVICES=none"}, "none", ""},
	} {
		pod, ctr := podCtr(tc.name, tc.ann, tc.env...)
		adj, _, err := p.CreateContainer(ctx, pod, ctr)
		if strings.HasPrefix(tc.want, "nri-gpu:") {
			if err == nil || err.Error() != tc.want {
				t.Errorf("%s: got %v, %v\nwant error %s", tc.name, visible(adj), err, tc.want)
			}
			continue
		}
		if err != nil || visible(adj) != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, visible(adj), err, tc.want)
			continue
		}
		if tc.annot != "" && adj.Annotations[alloc.Annotation] != tc.annot {
			t.Errorf("%s: annotation %s, want %s", tc.name, adj.Annotations[alloc.Annotation], tc.annot)
		}
		if tc.want == "none" && adj.Annotations[alloc.Annotation] != "" {
			t.Errorf("%s: a driver-only container got an allocation annotation", tc.name)
		}
	}
	if !strings.Contains(log.String(), `allocation: allocated to ns/a/main" table="0=exclusive[ns/a/main] 1=exclusive[ns/a/main] 2=free`) {
		t.Errorf("no table in the log:\n%s", log.String())
	}

	// Stopping a releases GPUs 0 and 1; removing pod b releases 3 and 4.
	podA, ctrA := podCtr("a", "")
	p.StopContainer(ctx, podA, ctrA)
	podB, _ := podCtr("b", "")
	p.RemovePodSandbox(ctx, podB)
	if got, want := alloc.Summary(p.table.State()), "0=free 1=free 2=shared[ns/c/main] 3=free 4=free 5=shared[ns/d/main] 6=shared[ns/d/main] 7=shared[ns/c/main]"; got != want {
		t.Errorf("after releases: %s\nwant %s", got, want)
	}
	pod, ctr := podCtr("h", "4,exclusive=true")
	if adj, _, err := p.CreateContainer(ctx, pod, ctr); err != nil || visible(adj) != strings.Join([]string{uuid(0), uuid(1), uuid(3), uuid(4)}, ",") {
		t.Errorf("after releases: %v, %v", visible(adj), err)
	}
	// RemoveContainer and StopPodSandbox release too.
	podC, ctrC := podCtr("c", "")
	p.RemoveContainer(ctx, podC, ctrC)
	podD, _ := podCtr("d", "")
	p.StopPodSandbox(ctx, podD)
	if got, want := alloc.Summary(p.table.State()), "0=exclusive[ns/h/main] 1=exclusive[ns/h/main] 2=free 3=exclusive[ns/h/main] 4=exclusive[ns/h/main] 5=free 6=free 7=free"; got != want {
		t.Errorf("after more releases: %s\nwant %s", got, want)
	}
	for _, line := range []string{"released by ns/a/main (stopped)", "released by the 1 containers of pod ns/b (removed)", "released by ns/c/main (removed)", "released by the 1 containers of pod ns/d (stopped)"} {
		if !strings.Contains(log.String(), line) {
			t.Errorf("log lacks %q", line)
		}
	}
}

func TestExclusiveNodePolicy(t *testing.T) {
	ctx := context.Background()
	p := testPlugin(sharing.Exclusive, io.Discard)
	pod, ctr := podCtr("a", "device=3")
	if _, _, err := p.CreateContainer(ctx, pod, ctr); err != nil {
		t.Fatal(err)
	}
	pod, ctr = podCtr("b", "device=3,exclusive=false")
	if _, _, err := p.CreateContainer(ctx, pod, ctr); err == nil || err.Error() != "nri-gpu: annotation gpus.nri-gpu.dev/container.main: GPU 3 is held exclusively by ns/a/main (exclusive)" {
		t.Errorf("shared request for an exclusively held GPU: %v", err)
	}
	pod, ctr = podCtr("c", "", "NVIDIA_VISIBLE_DEVICES=2,3")
	if _, _, err := p.CreateContainer(ctx, pod, ctr); err == nil || err.Error() != "nri-gpu: env NVIDIA_VISIBLE_DEVICES: GPU 3 cannot be held exclusively: it is held by ns/a/main (exclusive)" {
		t.Errorf("env request on an exclusive node: %v", err)
	}
}

// TestConcurrentCreateContainer calls the plugin's CreateContainer handler
// from 200 goroutines at once, each asking for one GPU on an 8-GPU node in
// exclusive mode: 8 succeed with distinct GPUs, 192 fail, and the table
// has one holder per GPU.
func TestConcurrentCreateContainer(t *testing.T) {
	p := testPlugin(sharing.Exclusive, io.Discard)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]string{}
	failed := 0
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pod, ctr := podCtr(fmt.Sprint(i), "1")
			adj, _, err := p.CreateContainer(context.Background(), pod, ctr)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if !strings.Contains(err.Error(), "0 of the node's 8 GPUs are free") {
					t.Errorf("unexpected error: %v", err)
				}
				failed++
				return
			}
			if other, ok := got[visible(adj)]; ok {
				t.Errorf("GPU %s given to %s and %s", visible(adj), other, ctr.Id)
			}
			got[visible(adj)] = ctr.Id
		}()
	}
	wg.Wait()
	if len(got) != 8 || failed != 192 {
		t.Errorf("%d GPUs given, %d requests refused; want 8 and 192", len(got), failed)
	}
	for _, r := range p.table.State() {
		if len(r.Holders) != 1 {
			t.Errorf("GPU %d has %d holders", r.Index, len(r.Holders))
		}
	}
}

// TestSynchronizeRebuilds checks that Synchronize replaces the table with
// what the runtime's containers hold, and makes the plugin ready.
func TestSynchronizeRebuilds(t *testing.T) {
	ctx := context.Background()
	p := testPlugin(sharing.Shared, io.Discard)
	pod, ctr := podCtr("old", "1")
	if _, _, err := p.CreateContainer(ctx, pod, ctr); err != nil {
		t.Fatal(err)
	}
	if p.Ready() {
		t.Error("ready before Synchronize")
	}
	pod, ctr = podCtr("kept", "2,exclusive=true")
	adj, _, err := p.CreateContainer(ctx, pod, ctr)
	if err != nil {
		t.Fatal(err)
	}
	ctr.Annotations = adj.Annotations
	ctr.Linux = &api.LinuxContainer{Devices: adj.GetLinux().GetDevices()}
	ctr.State = api.ContainerState_CONTAINER_RUNNING
	// "old" is gone from the runtime; "kept" is there with its annotation
	// and the device nodes the adjustment gave it.
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{pod}, []*api.Container{ctr}); err != nil {
		t.Fatal(err)
	}
	if got, want := alloc.Summary(p.table.State()), "0=free 1=exclusive[ns/kept/main] 2=exclusive[ns/kept/main] 3=free 4=free 5=free 6=free 7=free"; got != want {
		t.Errorf("after sync: %s", got)
	}
	if !p.Ready() {
		t.Error("not ready after Synchronize")
	}
}

// TestSynchronizeRecordVersions: a container whose record nri-gpu wrote
// before records had a version (verbatim, as commit e1d7dc6 wrote it)
// keeps its GPUs across the upgrade; one whose record is of a newer
// version (a newer nri-gpu wrote it, then was rolled back) books nothing
// from it, and the log says why.
func TestSynchronizeRecordVersions(t *testing.T) {
	ctx := context.Background()
	var log bytes.Buffer
	p := testPlugin(sharing.Shared, &log)
	gpu := func(i int) *api.LinuxContainer {
		return &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia" + string(rune('0'+i)), Type: "c", Major: 195, Minor: int64(i)}}}
	}
	oldPod, old := podCtr("old", "")
	old.Annotations = map[string]string{alloc.Annotation: `{"mode":"shared","gpus":["GPU-00000001-558d-fb20-8eca-25de8b98f5a7","GPU-00000003-558d-fb20-8eca-25de8b98f5a7"]}`}
	old.Linux = &api.LinuxContainer{Devices: append(gpu(1).Devices, gpu(3).Devices...)}
	newPod, newer := podCtr("newer", "")
	newer.Annotations = map[string]string{alloc.Annotation: `{"version":2,"mode":"exclusive","gpus":["GPU-00000005-558d-fb20-8eca-25de8b98f5a7"]}`}
	for _, c := range []*api.Container{old, newer} {
		c.State = api.ContainerState_CONTAINER_RUNNING
	}
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{oldPod, newPod}, []*api.Container{old, newer}); err != nil {
		t.Fatal(err)
	}
	if got, want := alloc.Summary(p.table.State()), "0=free 1=shared[ns/old/main] 2=free 3=shared[ns/old/main] 4=free 5=free 6=free 7=free"; got != want {
		t.Errorf("after sync: %s\nwant %s", got, want)
	}
	if want := "synchronize: ns/newer/main: annotation nri-gpu.dev/allocation: record version 2, which this nri-gpu cannot read (it reads versions up to 1; a newer nri-gpu wrote it?)"; !strings.Contains(log.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, log.String())
	}
}

// BenchmarkCreateContainerContention measures the whole CreateContainer
// handler for an exclusive count request of one GPU on 8 GPUs, followed by
// the container's release, with 1, 8 and 64 goroutines doing the same at
// once.
func BenchmarkCreateContainerContention(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("concurrent=%d", n), func(b *testing.B) {
			p := testPlugin(sharing.Exclusive, io.Discard)
			p.log.SetLevel(logrus.WarnLevel)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := range n {
				k := b.N / n
				if w == 0 {
					k += b.N % n
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					pod, ctr := podCtr(fmt.Sprint(w), "1")
					for range k {
						if _, _, err := p.CreateContainer(ctx, pod, ctr); err == nil {
							p.RemoveContainer(ctx, pod, ctr)
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// TestRefusalLogNamesHolder: the refusal the pod sees does not name a pod
// of another namespace; nri-gpu's log does.
func TestRefusalLogNamesHolder(t *testing.T) {
	ctx := context.Background()
	var log bytes.Buffer
	p := testPlugin(sharing.Shared, &log)
	pod, ctr := podCtr("secret", "device=3,exclusive=true")
	pod.Namespace = "team-a"
	if _, _, err := p.CreateContainer(ctx, pod, ctr); err != nil {
		t.Fatal(err)
	}
	pod, ctr = podCtr("probe", "device=3")
	pod.Namespace = "team-b"
	_, _, err := p.CreateContainer(ctx, pod, ctr)
	if want := "nri-gpu: annotation gpus.nri-gpu.dev/container.main: GPU 3 is held exclusively by a pod in another namespace (exclusive)"; err == nil || err.Error() != want {
		t.Errorf("refusal %v, want %s", err, want)
	}
	if !strings.Contains(log.String(), "GPU 3 is held exclusively by team-a/secret/main (exclusive)") {
		t.Errorf("the log does not name the holder:\n%s", log.String())
	}
}
