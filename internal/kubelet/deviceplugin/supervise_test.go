package deviceplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/deviceplugin"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// awaitNVML returns the node's snapshot. Under emulation (make
// test-arm64) loading NVML can outlast node.DefaultNVMLBound on a loaded
// machine, and the node is rediscovered when NVML answers: it waits up to
// 30 s for that. Natively the first discovery must have NVML's answer.
func awaitNVML(n *node.Node) *inventory.Snapshot {
	s := n.Snapshot()
	if os.Getenv("NRI_GPU_TEST_EMULATED") == "" {
		return s
	}
	for deadline := time.Now().Add(30 * time.Second); s.NVML != "ok" && time.Now().Before(deadline); s = n.Snapshot() {
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

// TestMixedFollowsLayout: under migStrategy mixed, on a simulated node
// whose MIG devices come from the simulated NVML, a MIG layout change
// that makes a profile appear (3g.40gb) has its resource registered with
// the kubelet, and one that makes a profile go (1g.10gb) has its plugin
// stopped and its socket removed, without a restart.
func TestMixedFollowsLayout(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: the nodes are character devices made with mknod: %v", err)
	}
	sim, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 3, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.SetMIG(simnode.MixedMIG()); err != nil {
		t.Fatal(err)
	}
	dir := socketDir(t)
	cfg := config.Default()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = sim.Root, sim.Root, sim.Root
	cfg.DevicePlugin.Enabled, cfg.DevicePlugin.SocketDir, cfg.DevicePlugin.MIGStrategy = true, dir, config.MIGStrategyMixed
	n, err := node.New(cfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if s := awaitNVML(n); s.NVML != "ok" || len(s.MIG) != 11 {
		t.Fatalf("NVML %q, %d MIG devices", s.NVML, len(s.MIG))
	}
	k := startKubelet(t, dir, false)
	c := cfg.DevicePlugin
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		deviceplugin.Supervise(ctx, n, c, quietLog())
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(wait):
			t.Errorf("Supervise did not return within %s of its context's end", wait)
		}
	})
	registered := func(want ...string) map[string]*pluginapi.RegisterRequest {
		t.Helper()
		regs := map[string]*pluginapi.RegisterRequest{}
		for len(regs) < len(want) {
			select {
			case r := <-k.reqs:
				regs[r.ResourceName] = r
			case <-time.After(wait):
				t.Fatalf("registered %v, want %v", regs, want)
			}
		}
		for _, w := range want {
			if regs[w] == nil {
				t.Fatalf("registered %v, want %v", regs, want)
			}
		}
		return regs
	}
	regs := registered("nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb")
	small := watch(t, k.dial(regs["nvidia.com/mig-1g.10gb"]))
	if devs := small(); len(devs) != 8 {
		t.Fatalf("1g.10gb: %v, want 8 devices", ids(devs))
	}

	// GPU 0 goes to two 3g.40gb, GPU 1 keeps only its three 2g.20gb: the
	// 1g.10gb profile is gone, 3g.40gb is new.
	st := simnode.MixedMIG()
	st.GPUs[0].MIG = []simnode.MIG{simnode.H100MIG(1, 0, 3), simnode.H100MIG(2, 0, 3)}
	st.GPUs[1].MIG = st.GPUs[1].MIG[:3]
	if err := sim.SetMIG(st); err != nil {
		t.Fatal(err)
	}
	if r, err := n.Update(cfg, "test"); r != node.RefreshChanged || err != nil {
		t.Fatalf("Update after the layout change = %q, %v", r, err)
	}
	regs = registered("nvidia.com/mig-3g.40gb")
	if devs := watch(t, k.dial(regs["nvidia.com/mig-3g.40gb"]))(); len(devs) != 2 {
		t.Errorf("3g.40gb: %v, want 2 devices", ids(devs))
	}
	sock := filepath.Join(dir, deviceplugin.SocketName("nvidia.com/mig-1g.10gb"))
	deadline := time.Now().Add(wait)
	for {
		if _, err := os.Stat(sock); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still there after the 1g.10gb profile went", sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(dir, deviceplugin.SocketName("nvidia.com/mig-2g.20gb"))); err != nil {
		t.Errorf("the 2g.20gb resource stopped: %v", err)
	}
	select {
	case r := <-k.reqs:
		t.Errorf("unexpected registration %v", r)
	default:
	}
}
