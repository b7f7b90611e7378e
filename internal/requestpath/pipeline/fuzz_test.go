package pipeline

import (
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
)

// FuzzHandle fuzzes the whole request path with hostile annotations, env
// and mounts under a restrictive and an open policy. Whatever the input,
// an answer only holds device nodes of the inventory and mounts of the
// driver files discovery found, never a path from the request, and an
// error comes with no adjustment.
func FuzzHandle(f *testing.F) {
	f.Add("gpus.nri-gpu.dev/pod", `"device=0,2",capabilities=all`, "NVIDIA_VISIBLE_DEVICES=all", "/dev/null", "/var/run/nvidia-container-devices/1", "ml")
	f.Add("nvidia.cdi.k8s.io/container.c", "management.nvidia.com/gpu=all", "NVIDIA_REQUIRE_CUDA=cuda>=12", "", "", "gpu-operator")
	f.Add("x", "y", "NVIDIA_VISIBLE_DEVICES=/etc/shadow", "/etc/shadow", "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/0", "web")
	f.Add("gpus.nri-gpu.dev/pod", `1,"imex-channels=0,2"`, "NVIDIA_IMEX_CHANNELS=all", "/dev/null", "/var/run/nvidia-container-devices/imex/1", "ml")
	f.Add("gpus.nri-gpu.dev/container.c", "imex-channels=channel1", "NVIDIA_IMEX_CHANNELS=../../etc/shadow", "/dev/null", "/var/run/nvidia-container-devices/imex/../../x", "web")
	// The node has IMEX channels 0-2.
	snap := imexSnapshot()
	prep := adjust.Prepare(snap, layout)
	sources := map[string]bool{}
	for _, fl := range snap.Files {
		sources[fl.HostPath] = true
	}
	devices := map[string]bool{}
	for _, g := range snap.GPUs {
		devices[g.Node.Path] = true
	}
	for _, n := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} {
		devices[n] = true
	}
	for _, ch := range snap.IMEXChannels {
		devices[ch.Node.Path] = true
	}
	policies := []policy.Policy{{}, {AnnotationNamespaces: []string{"ml"}, CDINamespaces: []string{"ml"},
		ManagementNamespaces: []string{"gpu-operator"}, VisibleDevices: policy.VisibleDevicesDeny}}
	f.Fuzz(func(t *testing.T, key, val, env, mountSrc, mountDst, ns string) {
		pod := &api.PodSandbox{Namespace: ns, Annotations: map[string]string{key: val}}
		ctr := &api.Container{Name: "c", Env: []string{env}, Mounts: []*api.Mount{{Source: mountSrc, Destination: mountDst}}}
		for _, pol := range policies {
			adj, _, err := handleWithPolicy(prep, tableFor(snap), sharing.Shared, pol, pod, ctr)
			if err != nil {
				if adj != nil {
					t.Fatalf("error %v with an adjustment", err)
				}
				if !strings.HasPrefix(err.Error(), "nri-gpu: ") {
					t.Fatalf("error %q", err)
				}
				continue
			}
			for _, m := range adj.GetMounts() {
				if !sources[m.Source] {
					t.Fatalf("mount source %q is not a discovered driver file", m.Source)
				}
			}
			for _, d := range adj.GetLinux().GetDevices() {
				if !devices[d.Path] {
					t.Fatalf("device %q is not in the inventory", d.Path)
				}
			}
		}
	})
}
