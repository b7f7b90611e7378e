package pipeline

import (
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// kubeletContainer is a container as the kubelet creates it after nri-gpu's
// device plugin's Allocate: the GPUs' device nodes and the annotation
// alloc.KubeletAnnotation naming their UUIDs.
func kubeletContainer(id string, ann string, env []string, gpus ...int) *api.Container {
	return &api.Container{Id: id, PodSandboxId: "p-k", Name: id, Env: env, Linux: pluginLinux(gpus...),
		Annotations: map[string]string{alloc.KubeletAnnotation: ann}}
}

// TestKubeletAssignment: a container with the kubelet's annotation and
// the device nodes of exactly its GPUs gets those GPUs, booked as the
// kubelet's, with the driver files of its NVIDIA_DRIVER_CAPABILITIES, and
// Synchronize rebuilds the holding as the kubelet's.
func TestKubeletAssignment(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	table := tableFor(prep.Snapshot())
	pod := &api.PodSandbox{Id: "p-k", Name: "k", Namespace: "ml"}
	k := kubeletContainer("main", uuid(1)+","+uuid(3), []string{"NVIDIA_DRIVER_CAPABILITIES=utility,video"}, 1, 3)
	adj, res, err := handle(prep, table, sharing.Shared, pod, k)
	if err != nil || res.Holding == nil || !res.Holding.Kubelet || !slices.Equal(res.Holding.GPUs, []int{1, 3}) {
		t.Fatalf("kubelet's container: %v, %+v", err, res.Holding)
	}
	if len(res.Warnings) != 0 {
		t.Errorf("warnings %q", res.Warnings)
	}
	if res.Request.Source.Kind != request.Kubelet {
		t.Errorf("request source %v, want the kubelet", res.Request.Source)
	}
	if want := inventory.Capabilities(inventory.Utility | inventory.Video); res.Selection.Caps != want {
		t.Errorf("capabilities %v, want %v", res.Selection.Caps, want)
	}
	if len(adj.GetMounts()) == 0 {
		t.Error("no driver files injected")
	}
	if got, want := envOf(adj)["NVIDIA_VISIBLE_DEVICES"], uuid(1)+","+uuid(3); got != want {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, want)
	}
	for _, d := range devicePaths(adj) {
		if d == "/dev/nvidia1" || d == "/dev/nvidia3" || (strings.HasPrefix(d, "/dev/nvidia") && d[len("/dev/nvidia")] >= '0' && d[len("/dev/nvidia")] <= '9') {
			t.Errorf("GPU node %s added: the runtime gave the container its GPUs", d)
		}
	}
	if _, ok := adj.GetAnnotations()[alloc.Annotation]; ok {
		t.Error("the kubelet's assignment got nri-gpu's record")
	}
	want := "0=free 1=shared[kubelet:ml/k/main] 2=free 3=shared[kubelet:ml/k/main] 4=free 5=free 6=free 7=free"
	if got := alloc.Summary(table.State()); got != want {
		t.Errorf("table %s\nwant %s", got, want)
	}
	// Synchronize: the same holding, as the kubelet's.
	k.State = api.ContainerState_CONTAINER_RUNNING
	hs, warnings := holdings(prep, sharing.Shared, []*api.PodSandbox{pod}, []*api.Container{k})
	if len(warnings) != 0 || len(hs) != 1 || !hs[0].Kubelet || !slices.Equal(hs[0].GPUs, []int{1, 3}) {
		t.Fatalf("rebuilt: %+v, %q", hs, warnings)
	}
	table.Rebuild(hs)
	if got := alloc.Summary(table.State()); got != want {
		t.Errorf("rebuilt table %s\nwant %s", got, want)
	}
}

// TestKubeletAnnotationForged: the kubelet's annotation without the
// device nodes of exactly its GPUs (a pod annotation that the runtime
// passed on, written by the pod's author) is not trusted, at
// CreateContainer and at Synchronize: it is reported, and the container
// is handled as without it.
func TestKubeletAnnotationForged(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	pod := &api.PodSandbox{Id: "p-k", Name: "k", Namespace: "ml"}
	for _, tc := range []struct {
		name string
		ctr  *api.Container
		// held are the GPUs booked, as the runtime's choice, not the
		// kubelet's.
		held []int
		warn string
	}{
		{"no device nodes", kubeletContainer("a", uuid(0), nil), nil, "the container has the device nodes of GPUs none"},
		{"more GPUs than nodes", kubeletContainer("b", uuid(0)+","+uuid(2), nil, 2), []int{2}, "names GPUs 0, 2 but the container has the device nodes of GPUs 2"},
		{"other GPUs than nodes", kubeletContainer("c", uuid(4), nil, 2), []int{2}, "names GPUs 4 but"},
		{"fewer GPUs than nodes", kubeletContainer("d", uuid(2), nil, 2, 4), []int{2, 4}, "names GPUs 2 but the container has the device nodes of GPUs 2, 4"},
		{"unknown UUID", kubeletContainer("e", "GPU-nope", nil, 2), []int{2}, `names "GPU-nope", which is no GPU UUID`},
		{"index, not UUID", kubeletContainer("f", "2", nil, 2), []int{2}, `names "2"`},
		{"empty", kubeletContainer("g", " , ", nil), nil, "names no GPU"},
		{"privileged", &api.Container{Id: "h", PodSandboxId: "p-k", Name: "h", Linux: privilegedLinux(),
			Annotations: map[string]string{alloc.KubeletAnnotation: uuid(0)}}, nil, "the container is privileged"},
	} {
		table := tableFor(prep.Snapshot())
		adj, res, err := handle(prep, table, sharing.Shared, pod, tc.ctr)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], alloc.KubeletAnnotation+" ignored") || !strings.Contains(res.Warnings[0], tc.warn) {
			t.Errorf("%s: warnings %q, want one with %q", tc.name, res.Warnings, tc.warn)
		}
		if len(adj.GetMounts()) != 0 || len(adj.GetLinux().GetDevices()) != 0 {
			t.Errorf("%s: injected %v", tc.name, adj)
		}
		var got []int
		for _, h := range table.Holdings() {
			if h.Kubelet {
				t.Errorf("%s: booked as the kubelet's: %+v", tc.name, h)
			}
			got = append(got, h.GPUs...)
		}
		if !slices.Equal(got, tc.held) {
			t.Errorf("%s: booked %v, want %v", tc.name, got, tc.held)
		}
		tc.ctr.State = api.ContainerState_CONTAINER_RUNNING
		hs, warnings := holdings(prep, sharing.Shared, []*api.PodSandbox{pod}, []*api.Container{tc.ctr})
		if len(warnings) != 1 || !strings.Contains(warnings[0], alloc.KubeletAnnotation+" ignored") {
			t.Errorf("%s: synchronize warnings %q", tc.name, warnings)
		}
		got = nil
		for _, h := range hs {
			if h.Kubelet {
				t.Errorf("%s: rebuilt as the kubelet's: %+v", tc.name, h)
			}
			got = append(got, h.GPUs...)
		}
		if !slices.Equal(got, tc.held) {
			t.Errorf("%s: rebuilt %v, want %v", tc.name, got, tc.held)
		}
	}

	// A forged annotation beside the pod's own request: the request is
	// served as always (policy and all), the annotation reported.
	table := tableFor(prep.Snapshot())
	counted := &api.PodSandbox{Id: "p-c", Name: "c", Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/container.main": "1"}}
	ctr := &api.Container{Id: "m", PodSandboxId: "p-c", Name: "main", Annotations: map[string]string{alloc.KubeletAnnotation: uuid(7)}}
	_, res, err := handle(prep, table, sharing.Shared, counted, ctr)
	if err != nil || res.Holding == nil || res.Holding.Kubelet || !slices.Equal(res.Holding.GPUs, []int{0}) || len(res.Warnings) != 1 {
		t.Errorf("count with a forged annotation: %v, %+v, %q", err, res.Holding, res.Warnings)
	}
}

// TestKubeletResources: the kubelet's assignment of a container is the
// union of its device plugin annotations, one per resource
// (alloc.KubeletAnnotationFor), and of the one key that nri-gpu wrote for
// every resource before (alloc.KubeletAnnotation, on containers created
// before an upgrade), checked against the container's device nodes as a
// whole, at CreateContainer and at Synchronize.
func TestKubeletResources(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	pod := &api.PodSandbox{Id: "p-k", Name: "k", Namespace: "ml"}
	gpuKey, otherKey := alloc.KubeletAnnotationFor("nvidia.com/gpu"), alloc.KubeletAnnotationFor("nvidia.com/mig-1g.10gb")
	ctr := func(ann map[string]string, gpus ...int) *api.Container {
		return &api.Container{Id: "main", PodSandboxId: "p-k", Name: "main", State: api.ContainerState_CONTAINER_RUNNING, Linux: pluginLinux(gpus...), Annotations: ann}
	}
	kubelet := func(gpus ...int) *alloc.Holding {
		return &alloc.Holding{Holder: alloc.Holder{ID: "main", PodID: "p-k", Namespace: "ml", Pod: "k", Container: "main"}, Mode: sharing.Shared, GPUs: gpus, Kubelet: true, Runtime: true}
	}
	runtime := func(gpus ...int) *alloc.Holding {
		h := kubelet(gpus...)
		h.Kubelet = false
		return h
	}
	for _, tc := range []struct {
		name string
		ctr  *api.Container
		want *alloc.Holding
		warn string
	}{
		{"one key before the upgrade", ctr(map[string]string{alloc.KubeletAnnotation: uuid(1) + "," + uuid(3)}, 1, 3), kubelet(1, 3), ""},
		{"one resource", ctr(map[string]string{gpuKey: uuid(1)}, 1), kubelet(1), ""},
		{"two resources", ctr(map[string]string{gpuKey: uuid(1), otherKey: uuid(3)}, 1, 3), kubelet(1, 3), ""},
		{"old key and a resource's", ctr(map[string]string{alloc.KubeletAnnotation: uuid(1), otherKey: uuid(3)}, 1, 3), kubelet(1, 3), ""},
		{"the same GPU under two keys", ctr(map[string]string{gpuKey: uuid(1), otherKey: uuid(1)}, 1), kubelet(1), ""},
		{"a resource's GPU without its node", ctr(map[string]string{gpuKey: uuid(1), otherKey: uuid(3)}, 1), runtime(1),
			"annotations " + gpuKey + ", " + otherKey + " ignored: names GPUs 1, 3 but the container has the device nodes of GPUs 1: not the kubelet's assignment (a pod annotation passed on?)"},
		{"a node no key names", ctr(map[string]string{gpuKey: uuid(1)}, 1, 3), runtime(1, 3),
			"annotation " + gpuKey + " ignored: names GPUs 1 but the container has the device nodes of GPUs 1, 3: not the kubelet's assignment (a pod annotation passed on?)"},
		{"a key that only starts like one", ctr(map[string]string{alloc.KubeletAnnotation + "x": uuid(1)}, 1), runtime(1), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var warns []string
			if tc.warn != "" {
				warns = []string{tc.warn}
			}
			_, res, err := handle(prep, tableFor(prep.Snapshot()), sharing.Shared, pod, tc.ctr)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, res.Holding); d != "" {
				t.Errorf("holding at CreateContainer (-want +got):\n%s", d)
			}
			if d := cmp.Diff(warns, res.Warnings); d != "" {
				t.Errorf("warnings at CreateContainer (-want +got):\n%s", d)
			}
			hs, warnings := holdings(prep, sharing.Shared, []*api.PodSandbox{pod}, []*api.Container{tc.ctr})
			if d := cmp.Diff([]alloc.Holding{*tc.want}, hs); d != "" {
				t.Errorf("holdings at Synchronize (-want +got):\n%s", d)
			}
			for i := range warnings {
				warnings[i] = strings.TrimPrefix(warnings[i], "ml/k/main: ")
			}
			if d := cmp.Diff(warns, warnings); d != "" {
				t.Errorf("warnings at Synchronize (-want +got):\n%s", d)
			}
		})
	}
}
