package deviceplugin_test

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/deviceplugin"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestAllocateDevRoot: with devicePlugin.devRoot set (a simulated node
// whose devfs is not the host's /dev), Allocate's device specs name each
// GPU's node under that directory on the host and /dev/nvidia<minor> in
// the container. The runtime stats HostPath to fill the container's
// device list, so the node found there must have the GPU's numbers: the
// kubelet's assignment (pipeline's kubeletAssignment) is checked by them.
func TestAllocateDevRoot(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("device nodes cannot be made here: %v", err)
	}
	devRoot := filepath.Join(t.TempDir(), "dev")
	snap := twoNUMA()
	if err := syscall.Mkdir(devRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, g := range snap.GPUs {
		p := filepath.Join(devRoot, filepath.Base(g.Node.Path))
		if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(simnode.Makedev(uint32(g.Node.Major), uint32(g.Node.Minor)))); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
	}
	dir := socketDir(t)
	k := startKubelet(t, dir, false)
	runPlugin(t, node.Fixed(stateOf(snap), quietLog()), deviceplugin.Options{SocketDir: dir, DevRoot: devRoot})
	c := k.dial(k.registered("nvidia.com/gpu"))

	r, err := c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: uuids(snap, 3, 6)}}})
	if err != nil {
		t.Fatal(err)
	}
	specs := r.GetContainerResponses()[0].GetDevices()
	if len(specs) != 2 {
		t.Fatalf("device specs %v, want 2", specs)
	}
	for i, g := range []int{3, 6} {
		gpu, d := snap.GPUs[g], specs[i]
		wantC := fmt.Sprintf("/dev/nvidia%d", gpu.Node.Minor)
		wantH := filepath.Join(devRoot, fmt.Sprintf("nvidia%d", gpu.Node.Minor))
		if d.ContainerPath != wantC || d.HostPath != wantH || d.Permissions != "rw" {
			t.Errorf("GPU %d: device spec %v, want %s on the host, %s in the container, rw", g, d, wantH, wantC)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(d.HostPath, &st); err != nil {
			t.Errorf("GPU %d: the runtime cannot stat %s: %v", g, d.HostPath, err)
			continue
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFCHR || int64(simnode.Major(st.Rdev)) != gpu.Node.Major || int64(simnode.Minor(st.Rdev)) != gpu.Node.Minor {
			t.Errorf("GPU %d: %s is %d:%d, want the GPU's %d:%d", g, d.HostPath, simnode.Major(st.Rdev), simnode.Minor(st.Rdev), gpu.Node.Major, gpu.Node.Minor)
		}
	}
}
