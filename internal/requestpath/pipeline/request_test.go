package pipeline

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/policy"
)

func envOf(adj *api.ContainerAdjustment) map[string]string {
	env := map[string]string{}
	for _, e := range adj.GetEnv() {
		env[e.Key] = e.Value
	}
	return env
}

func devicePaths(adj *api.ContainerAdjustment) []string {
	var out []string
	for _, d := range adj.GetLinux().GetDevices() {
		out = append(out, d.Path)
	}
	return out
}

func TestHandleWithPolicy(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	secure := policy.Policy{
		AnnotationNamespaces: []string{"ml"},
		CDINamespaces:        []string{"ml"},
		ManagementNamespaces: []string{"gpu-operator"},
		VisibleDevices:       policy.VisibleDevicesDeny,
	}
	byNS := policy.Policy{VisibleDevices: policy.VisibleDevicesNamespaces, EnvNamespaces: []string{"legacy"}}
	pods := 0
	pod := func(ns string, ann ...string) *api.PodSandbox {
		m := map[string]string{}
		for i := 0; i < len(ann); i += 2 {
			m[ann[i]] = ann[i+1]
		}
		pods++
		return &api.PodSandbox{Id: fmt.Sprintf("p%d", pods), Name: "p", Namespace: ns, Annotations: m}
	}
	cudaImage := &api.Container{Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64"}}

	t.Run("env denied: void, nothing else", func(t *testing.T) {
		adj, res, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, secure, pod("ml"), cudaImage)
		if err != nil {
			t.Fatal(err)
		}
		if len(adj.GetLinux().GetDevices()) != 0 || len(adj.GetMounts()) != 0 || len(adj.GetEnv()) != 1 || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "void" {
			t.Errorf("adjustment = %v", adj)
		}
		if !strings.Contains(res.Selection.Note, `env NVIDIA_VISIBLE_DEVICES ignored: not allowed in namespace "ml" (policy.visibleDevices: deny); set to void`) {
			t.Errorf("note = %q", res.Selection.Note)
		}
	})
	t.Run("env by namespace", func(t *testing.T) {
		adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, byNS, pod("legacy"), cudaImage)
		if err != nil || len(devicePaths(adj)) != 8+3 {
			t.Errorf("listed namespace: %v, %v", devicePaths(adj), err)
		}
		adj, _, err = handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, byNS, pod("web"), cudaImage)
		if err != nil || len(devicePaths(adj)) != 0 || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "void" {
			t.Errorf("other namespace: %v, %v", adj, err)
		}
	})
	t.Run("annotation outside its namespaces fails", func(t *testing.T) {
		adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, secure, pod("web", "gpus.nri-gpu.dev/pod", "1"), &api.Container{Name: "c"})
		if adj != nil || err == nil || err.Error() != `nri-gpu: annotation gpus.nri-gpu.dev/pod: not allowed in namespace "web" (policy.annotationNamespaces: [ml])` {
			t.Errorf("%v, %v", adj, err)
		}
		adj, _, err = handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, secure, pod("ml", "gpus.nri-gpu.dev/pod", "1"), &api.Container{Name: "c"})
		if err != nil || len(devicePaths(adj)) != 1+3 {
			t.Errorf("allowed namespace: %v, %v", devicePaths(adj), err)
		}
	})
	t.Run("CDI annotation", func(t *testing.T) {
		p := pod("ml", "nvidia.cdi.k8s.io/container.c", "nvidia.com/gpu=1,nvidia.com/gpu=GPU-00000003-558d-fb20-8eca-25de8b98f5a7")
		adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, secure, p, &api.Container{Name: "c"})
		if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-00000001-558d-fb20-8eca-25de8b98f5a7,GPU-00000003-558d-fb20-8eca-25de8b98f5a7" {
			t.Errorf("%v, %v", adj, err)
		}
		p.Namespace = "web"
		if adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, secure, p, &api.Container{Name: "c"}); adj != nil || err == nil || !strings.Contains(err.Error(), "policy.cdiNamespaces: [ml]") {
			t.Errorf("web: %v, %v", adj, err)
		}
	})
	t.Run("management", func(t *testing.T) {
		p := pod("gpu-operator", "nvidia.cdi.k8s.io/pod", "management.nvidia.com/gpu=all")
		adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, secure, p, &api.Container{Name: "dcgm", Env: []string{"NVIDIA_DRIVER_CAPABILITIES=utility"}})
		if err != nil {
			t.Fatal(err)
		}
		paths := strings.Join(devicePaths(adj), " ")
		for _, want := range []string{"/dev/nvidia0", "/dev/nvidia7", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} {
			if !strings.Contains(paths, want+" ") && !strings.HasSuffix(paths, want) {
				t.Errorf("management lacks %s: %s", want, paths)
			}
		}
		if envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "void" {
			t.Errorf("management env = %v", envOf(adj))
		}
		// It books nothing: a shared holder of every GPU does not stop
		// it, and it holds nothing afterwards, so that an exclusive
		// request can still be met.
		table := tableFor(prep.Snapshot())
		infer := pod("ml", "gpus.nri-gpu.dev/pod", "all")
		if _, _, err := handleWithPolicy(prep, table, alloc.Shared, policy.Policy{}, infer, &api.Container{Id: "infer", Name: "c"}); err != nil {
			t.Fatal(err)
		}
		if adj, res, err := handleWithPolicy(prep, table, alloc.Shared, secure, p, &api.Container{Id: "dcgm", Name: "dcgm"}); err != nil || adj == nil || res.Holding != nil {
			t.Errorf("management next to a shared holder: %v, %v, %v", adj, err, res.Holding)
		}
		if h := table.Holdings(); len(h) != 1 {
			t.Errorf("holdings %+v, want only the workload's", h)
		}
		// A pod-level request is the pod's: released with the pod.
		table.ReleasePod(infer.Id)
		train := pod("ml", "gpus.nri-gpu.dev/pod", "exclusive=true,device=3")
		if _, _, err := handleWithPolicy(prep, table, alloc.Shared, policy.Policy{}, train, &api.Container{Id: "train", Name: "c"}); err != nil {
			t.Fatalf("exclusive request next to a management container: %v", err)
		}
		// It does not reach a GPU held exclusively by another container.
		if adj, res, err := handleWithPolicy(prep, table, alloc.Shared, secure, p, &api.Container{Id: "dcgm-2", Name: "dcgm"}); adj != nil || res.Holding != nil || err == nil ||
			err.Error() != "nri-gpu: annotation nvidia.cdi.k8s.io/pod: GPU 3 is held exclusively by a pod in another namespace (exclusive)" {
			t.Errorf("management next to an exclusive holder: %v, %v, %v", adj, err, res.Holding)
		}
		if h := table.Holdings(); len(h) != 1 || h[0].Holder.ID != alloc.PodHolderPrefix+train.Id {
			t.Errorf("holdings %+v, want only the exclusive workload's", h)
		}
		p.Namespace = "ml"
		if adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, secure, p, &api.Container{Name: "dcgm"}); adj != nil || err == nil || !strings.Contains(err.Error(), "policy.managementNamespaces: [gpu-operator]") {
			t.Errorf("ml: %v, %v", adj, err)
		}
	})
	t.Run("device plugin mounts pass a denying policy", func(t *testing.T) {
		ctr := &api.Container{Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"},
			Mounts: []*api.Mount{{Source: "/dev/null", Destination: "/var/run/nvidia-container-devices/GPU-00000002-558d-fb20-8eca-25de8b98f5a7"}}}
		adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, secure, pod("web"), ctr)
		if err != nil || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-00000002-558d-fb20-8eca-25de8b98f5a7" || !strings.Contains(strings.Join(devicePaths(adj), " "), "/dev/nvidia2") {
			t.Errorf("%v, %v", adj, err)
		}
	})
	t.Run("runtime CDI devices: nothing", func(t *testing.T) {
		ctr := &api.Container{Name: "c", Env: cudaImage.Env, CDIDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=0"}}}
		adj, res, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, policy.Policy{}, pod("ml"), ctr)
		if adj != nil || err != nil || !strings.Contains(res.Selection.Note, "CDI devices nvidia.com/gpu=0: nothing injected") {
			t.Errorf("%v, %v, %q", adj, err, res.Selection.Note)
		}
	})
	t.Run("device nodes from the runtime: only what is missing", func(t *testing.T) {
		ctr := &api.Container{Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{
			{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0},
			{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
		}}}
		adj, res, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, policy.Policy{}, pod("ml"), ctr)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(devicePaths(adj), " "); got != "/dev/nvidia-uvm /dev/nvidia-uvm-tools" {
			t.Errorf("devices %q", got)
		}
		if len(adj.GetMounts()) == 0 || !strings.Contains(res.Selection.Note, "/dev/nvidia0, /dev/nvidiactl: injected only the missing control nodes and driver files (2 device nodes, ") {
			t.Errorf("%d mounts, note %q", len(adj.GetMounts()), res.Selection.Note)
		}
		// With every device node and driver file already there: nothing.
		full, _, _ := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, policy.Policy{}, pod("ml"), &api.Container{Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}})
		ctr.Linux.Devices = full.Linux.Devices
		ctr.Mounts = full.Mounts
		adj, res, err = handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, policy.Policy{}, pod("ml"), ctr)
		if adj != nil || err != nil || !strings.Contains(res.Selection.Note, "nothing injected") {
			t.Errorf("%v, %v, %q", adj, err, res.Selection.Note)
		}
	})
	t.Run("GPUs from the runtime are not widened", func(t *testing.T) {
		// A device plugin gave GPU 2; the image asks for all through its
		// environment: the container keeps exactly GPU 2.
		ctr := &api.Container{Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{
			{Path: "/dev/nvidia2", Type: "c", Major: 195, Minor: 2},
		}}}
		adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, policy.Policy{}, pod("ml"), ctr)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(devicePaths(adj), " "); got != "/dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools" {
			t.Errorf("devices %q, want the control nodes only", got)
		}
		if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != "GPU-00000002-558d-fb20-8eca-25de8b98f5a7" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want GPU 2's UUID", got)
		}
	})
	t.Run("failed requests leave no booking, runtime-given GPUs are booked", func(t *testing.T) {
		table := tableFor(prep.Snapshot())
		// A count request is booked before its GPUs' arch can be
		// checked; the unmet requirement releases the booking.
		ctr := &api.Container{Id: "ctr-1", Name: "c", Env: []string{"NVIDIA_REQUIRE_ARCH=arch>=99.0"}}
		if adj, _, err := handleWithPolicy(prep, table, alloc.Shared, policy.Policy{}, pod("ml", "gpus.nri-gpu.dev/pod", "2"), ctr); adj != nil || err == nil {
			t.Errorf("unmet arch: %v, %v", adj, err)
		}
		if h := table.Holdings(); len(h) != 0 {
			t.Errorf("bookings left: %+v", h)
		}
		// GPUs from the runtime are booked as the runtime's choice, in
		// the node's mode, without a record (Holdings rebuilds them from
		// the device nodes alone).
		ctr = &api.Container{Id: "ctr-2", Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{
			{Path: "/dev/nvidia2", Type: "c", Major: 195, Minor: 2},
		}}}
		adj, res, err := handleWithPolicy(prep, table, alloc.Shared, policy.Policy{}, pod("ml"), ctr)
		if err != nil || adj == nil || res.Holding == nil || adj.Annotations[alloc.Annotation] != "" {
			t.Errorf("runtime-given GPU: %v, %v, holding %v", adj, err, res.Holding)
		}
		if h := table.Holdings(); len(h) != 1 || h[0].Holder.ID != "ctr-2" || !slices.Equal(h[0].GPUs, []int{2}) || h[0].Mode != alloc.Shared {
			t.Errorf("bookings: %+v, want ctr-2 holding GPU 2 shared", h)
		}
	})
	t.Run("unmet requirement fails and changes nothing", func(t *testing.T) {
		ctr := &api.Container{Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=13.5"}}
		adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, policy.Policy{}, pod("ml"), ctr)
		if adj != nil || err == nil || err.Error() != "nri-gpu: env NVIDIA_REQUIRE_CUDA: requirement error: unsatisfied condition: cuda>=13.5, please update your driver to a newer version, or use an earlier cuda container" {
			t.Errorf("%v, %v", adj, err)
		}
		ctr.Env = append(ctr.Env, "NVIDIA_DISABLE_REQUIRE=1")
		if adj, _, err := handleWithPolicy(prep, tableFor(prep.Snapshot()), alloc.Shared, policy.Policy{}, pod("ml"), ctr); adj == nil || err != nil {
			t.Errorf("disabled: %v, %v", adj, err)
		}
	})
}
