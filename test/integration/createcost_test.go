package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	rgen "github.com/opencontainers/runtime-tools/generate"
	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// BenchmarkCreateContainerCost measures, side by side in one process, the
// part of a container's creation where giving it a GPU through nri-gpu and
// through the runtime's own CDI differ (the runtime hands runc the same
// spec either way, so nothing after creation differs):
//
//   - nri-gpu: the runtime's NRI CreateContainer call to the built plugin
//     (a separate process, over the real protocol) for one GPU with the
//     default capabilities, and applying the adjustment to an OCI spec the
//     way containerd does;
//   - nri-gpu, no request: the same call for a container that asks for
//     nothing, which every container pays once nri-gpu is installed;
//   - cdi: what containerd 2.4 does for a CDI device request
//     (pkg/cdi.WithCDIDevices: Refresh of its auto-refreshing cache, then
//     InjectDevices), with the spec `nri-gpu cdi generate` writes for the
//     same node, so the same edits.
//
// Each operation starts from a fresh default spec, made with the timer
// stopped. Run it with the non-race binary:
//
//	cd test/integration && sudo NRI_GPU_BIN=$PWD/../../bin/nri-gpu go test -run XXX -bench CreateContainerCost -benchmem .
func BenchmarkCreateContainerCost(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: the simulated node has real device nodes (mknod); CI runs as root")
	}
	// The runtime side's NRI log (logrus) would drown the results.
	level := logrus.GetLevel()
	logrus.SetLevel(logrus.WarnLevel)
	defer logrus.SetLevel(level)
	dir, err := os.MkdirTemp("", "nri-cost-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	n, err := simnode.Generate(filepath.Join(dir, "node"), simnode.Options{NumGPUs: 8, DeviceNodes: true})
	if err != nil {
		b.Fatal(err)
	}
	// layout: toolkit, the layout nri-gpu cdi generate writes (a CDI spec
	// cannot append to PATH), so that both ways hand over the same edits.
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\nlayout: toolkit\n", n.Root, n.Root)), 0o644); err != nil {
		b.Fatal(err)
	}

	// containerd's side of CDI: nri-gpu's own spec of the node.
	specDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command(binary, "cdi", "generate", "--config", cfg, "-o", filepath.Join(specDir, "nri-gpu.yaml")).CombinedOutput(); err != nil {
		b.Fatalf("nri-gpu cdi generate: %v\n%s", err, out)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(true))
	if err != nil {
		b.Fatal(err)
	}

	// The runtime's side of NRI, and nri-gpu connected to it.
	synced := make(chan struct{}, 4)
	syncFn := func(ctx context.Context, cb nri.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		synced <- struct{}{}
		return err
	}
	updateFn := func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil }
	for _, d := range []string{"plugins", "conf.d"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	socket := filepath.Join(dir, "nri.sock")
	a, err := nri.New("bench-runtime", "0.0.1", syncFn, updateFn,
		nri.WithPluginPath(filepath.Join(dir, "plugins")), nri.WithPluginConfigPath(filepath.Join(dir, "conf.d")), nri.WithSocketPath(socket))
	if err != nil {
		b.Fatal(err)
	}
	if err := a.Start(); err != nil {
		b.Fatal(err)
	}
	defer a.Stop()
	for len(synced) > 0 {
		<-synced
	}
	plugin := exec.Command(binary, "run", "--config", cfg, "--socket", socket, "--log-level", "warning", "--status-socket", filepath.Join(dir, "status.sock"))
	var log syncBuffer
	plugin.Stdout, plugin.Stderr = &log, &log
	if err := plugin.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		plugin.Process.Kill()
		plugin.Wait()
	}()
	select {
	case <-synced:
	case <-time.After(20 * time.Second):
		b.Fatalf("nri-gpu did not connect:\n%s", log.String())
	}

	ctx := context.Background()
	pod := &api.PodSandbox{Id: "pod", Name: "pod", Namespace: "default", Uid: "uid",
		Annotations: map[string]string{"gpus.nri-gpu.dev/container.ctr": "device=0"}}
	plain := &api.PodSandbox{Id: "plain", Name: "plain", Namespace: "default", Uid: "uid-plain"}
	ctr := func(p *api.PodSandbox) *api.Container {
		return &api.Container{Id: "ctr-" + p.Id, PodSandboxId: p.Id, Name: "ctr", Env: []string{"PATH=/usr/bin:/bin"}}
	}
	newSpec := func(b *testing.B) rgen.Generator {
		b.StopTimer()
		defer b.StartTimer()
		g, err := rgen.New("linux")
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	// Wait until nri-gpu answers (it registers before its first answer).
	deadline := time.Now().Add(20 * time.Second)
	for {
		rpl, err := a.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr(pod)})
		if err == nil && len(rpl.GetAdjust().GetLinux().GetDevices()) > 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("nri-gpu gives no devices (%v):\n%s", err, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	var nriSpec, cdiSpec int
	b.Run("nri-gpu", func(b *testing.B) {
		for b.Loop() {
			g := newSpec(b)
			rpl, err := a.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr(pod)})
			if err != nil {
				b.Fatal(err)
			}
			if err := nrigen.SpecGenerator(&g).Adjust(rpl.GetAdjust()); err != nil {
				b.Fatal(err)
			}
			nriSpec = len(g.Config.Mounts) + len(g.Config.Linux.Devices)
		}
	})
	b.Run("nri-gpu, no request", func(b *testing.B) {
		for b.Loop() {
			g := newSpec(b)
			rpl, err := a.CreateContainer(ctx, &api.CreateContainerRequest{Pod: plain, Container: ctr(plain)})
			if err != nil {
				b.Fatal(err)
			}
			if rpl.GetAdjust() != nil && len(rpl.GetAdjust().GetMounts()) > 0 {
				b.Fatalf("a container without a request got %v", rpl.GetAdjust())
			}
			_ = g
		}
	})
	b.Run("cdi", func(b *testing.B) {
		for b.Loop() {
			g := newSpec(b)
			if err := cache.Refresh(); err != nil {
				b.Fatal(err)
			}
			if _, err := cache.InjectDevices(g.Config, "nvidia.com/gpu=0"); err != nil {
				b.Fatal(err)
			}
			cdiSpec = len(g.Config.Mounts) + len(g.Config.Linux.Devices)
		}
	})
	// Both ways must have handed the runtime the same edits.
	if nriSpec == 0 || nriSpec != cdiSpec {
		b.Errorf("mounts + devices after nri-gpu %d, after CDI %d: not the same edits", nriSpec, cdiSpec)
	}
}
