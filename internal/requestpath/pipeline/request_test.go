package pipeline

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
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

// policyStep is a request served on the table before a case's own: it
// must succeed; releasePod releases the pod's GPUs instead (the pod went).
type policyStep struct {
	pol        policy.Policy
	pod        *api.PodSandbox
	ctr        *api.Container
	releasePod bool
}

// policyCase is a container under a policy, after the requests before
// it on the same table, and what it gets.
type policyCase struct {
	name   string
	pol    policy.Policy
	before []policyStep
	pod    *api.PodSandbox
	ctr    *api.Container
	want   *answer
	// err is the whole error; note a part of Result.Selection.Note
	// ("" when there is none); holdings the table after.
	err      string
	note     string
	holdings []alloc.Holding
}

// policyCases are TestHandleWithPolicy's cases, on the node of prep.
func policyCases(t *testing.T, prep *adjust.Prepared) []policyCase {
	t.Helper()
	secure := policy.Policy{
		AnnotationNamespaces: []string{"ml"},
		CDINamespaces:        []string{"ml"},
		ManagementNamespaces: []string{"gpu-operator"},
		VisibleDevices:       policy.VisibleDevicesDeny,
	}
	byNS := policy.Policy{VisibleDevices: policy.VisibleDevicesNamespaces, EnvNamespaces: []string{"legacy"}}
	open := policy.Policy{}
	pod := func(id, ns string, ann ...string) *api.PodSandbox {
		m := map[string]string{}
		for i := 0; i < len(ann); i += 2 {
			m[ann[i]] = ann[i+1]
		}
		return &api.PodSandbox{Id: id, Name: "p", Namespace: ns, Annotations: m}
	}
	all := prep.Snapshot().GPUs
	gpus := func(idx ...int) []inventory.GPU {
		var out []inventory.GPU
		for _, i := range idx {
			out = append(out, all[i])
		}
		return out
	}
	ids := func(idx ...int) string {
		var out []string
		for _, i := range idx {
			out = append(out, uuid(i))
		}
		return strings.Join(out, ",")
	}
	defaultCaps := inventory.Capabilities(inventory.Compute | inventory.Utility)
	drivers := func(caps inventory.Capabilities, idx ...int) []string {
		return mountsOf(prep.Edits(gpus(idx...), caps))
	}
	record := func(mode string, pod bool, idx ...int) map[string]string {
		r := alloc.Record{Mode: mode, Pod: pod}
		for _, i := range idx {
			r.GPUs = append(r.GPUs, uuid(i))
		}
		return map[string]string{alloc.Annotation: r.Encode()}
	}
	// noGPURecord is a management container's record: nri-gpu answered
	// it and it holds nothing, whatever GPU nodes it has.
	noGPURecord := map[string]string{alloc.Annotation: `{"version":1,"mode":"shared","gpus":[]}`}
	holder := func(podID, ctrID, ns, ctr string) alloc.Holder {
		return alloc.Holder{ID: ctrID, PodID: podID, Namespace: ns, Pod: "p", Container: ctr}
	}
	control := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
	nodes := func(idx ...int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, fmt.Sprintf("/dev/nvidia%d", i))
		}
		return out
	}
	cudaEnv := []string{"NVIDIA_VISIBLE_DEVICES=all", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64"}
	libPath := "/usr/local/nvidia/lib64"
	mgmtPod := pod("p-mgmt", "gpu-operator", "nvidia.cdi.k8s.io/pod", "management.nvidia.com/gpu=all")
	everything := slices.Concat(nodes(0, 1, 2, 3, 4, 5, 6, 7), control, []string{"/dev/nvidia-modeset"})
	runtimeNodes := &api.Container{Id: "rt", Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{
		{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0},
		{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
	}}}
	// A container that the runtime gave every node and file of the
	// answer already: the answer to the same request without them.
	full, _, err := handle(prep, tableFor(prep.Snapshot()), sharing.Shared, pod("p-x", "ml"), &api.Container{Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}})
	if err != nil {
		t.Fatal(err)
	}
	fullCtr := &api.Container{Id: "rt", Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, Linux: &api.LinuxContainer{Devices: full.Linux.Devices}, Mounts: full.Mounts}

	return []policyCase{
		{name: "env denied: void, nothing else", pol: secure, pod: pod("p-a", "ml"), ctr: &api.Container{Id: "a", Name: "c", Env: cudaEnv},
			want: &answer{Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}},
			note: `env NVIDIA_VISIBLE_DEVICES ignored: not allowed in namespace "ml" (policy.visibleDevices: deny); set to void`},
		{name: "env in a listed namespace", pol: byNS, pod: pod("p-b", "legacy"), ctr: &api.Container{Id: "b", Name: "c", Env: cudaEnv},
			want: &answer{Devices: slices.Concat(nodes(0, 1, 2, 3, 4, 5, 6, 7), control), Mounts: drivers(defaultCaps, 0, 1, 2, 3, 4, 5, 6, 7),
				Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids(0, 1, 2, 3, 4, 5, 6, 7)}, Annotations: record("shared", false, 0, 1, 2, 3, 4, 5, 6, 7)},
			holdings: []alloc.Holding{{Holder: holder("p-b", "b", "legacy", "c"), Mode: sharing.Shared, GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}}}},
		{name: "env in another namespace: void", pol: byNS, pod: pod("p-c", "web"), ctr: &api.Container{Id: "c", Name: "c", Env: cudaEnv},
			want: &answer{Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}},
			note: `env NVIDIA_VISIBLE_DEVICES ignored: not allowed in namespace "web" (policy.visibleDevices: namespaces, policy.envNamespaces: [legacy]); set to void`},
		{name: "annotation outside its namespaces fails", pol: secure, pod: pod("p-d", "web", "gpus.nri-gpu.dev/pod", "1"), ctr: &api.Container{Id: "d", Name: "c"},
			err: `nri-gpu: annotation gpus.nri-gpu.dev/pod: not allowed in namespace "web" (policy.annotationNamespaces: [ml])`},
		{name: "annotation in its namespace", pol: secure, pod: pod("p-e", "ml", "gpus.nri-gpu.dev/pod", "1"), ctr: &api.Container{Id: "e", Name: "c"},
			want: &answer{Devices: slices.Concat(nodes(0), control), Mounts: drivers(defaultCaps, 0),
				Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids(0), "LD_LIBRARY_PATH": libPath}, Annotations: record("shared", true, 0)},
			holdings: []alloc.Holding{{Holder: alloc.PodHolder("p-e", "ml", "p"), Mode: sharing.Shared, GPUs: []int{0}}}},
		{name: "CDI annotation in its namespace", pol: secure,
			pod: pod("p-f", "ml", "nvidia.cdi.k8s.io/container.c", "nvidia.com/gpu=1,nvidia.com/gpu=GPU-00000003-558d-fb20-8eca-25de8b98f5a7"), ctr: &api.Container{Id: "f", Name: "c"},
			want: &answer{Devices: slices.Concat(nodes(1, 3), control), Mounts: drivers(defaultCaps, 1, 3),
				Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids(1, 3), "LD_LIBRARY_PATH": libPath}, Annotations: record("shared", false, 1, 3)},
			holdings: []alloc.Holding{{Holder: holder("p-f", "f", "ml", "c"), Mode: sharing.Shared, GPUs: []int{1, 3}}}},
		{name: "CDI annotation outside its namespaces fails", pol: secure,
			pod: pod("p-g", "web", "nvidia.cdi.k8s.io/container.c", "nvidia.com/gpu=1"), ctr: &api.Container{Id: "g", Name: "c"},
			err: `nri-gpu: annotation nvidia.cdi.k8s.io/container.c: not allowed in namespace "web" (policy.cdiNamespaces: [ml])`},
		{name: "management: every GPU and control node, booked by none", pol: secure, pod: mgmtPod,
			ctr: &api.Container{Id: "dcgm", Name: "dcgm", Env: []string{"NVIDIA_DRIVER_CAPABILITIES=utility"}},
			want: &answer{Devices: everything, Mounts: drivers(inventory.Capabilities(inventory.Utility), 0, 1, 2, 3, 4, 5, 6, 7), Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void", "LD_LIBRARY_PATH": libPath},
				Annotations: noGPURecord}},
		// A shared holder of every GPU does not stop it, and it holds
		// nothing afterwards, so that an exclusive request can still be
		// met.
		{name: "management beside a shared holder", pol: secure, pod: mgmtPod, ctr: &api.Container{Id: "dcgm", Name: "dcgm"},
			before:   []policyStep{{pol: open, pod: pod("p-infer", "ml", "gpus.nri-gpu.dev/pod", "all"), ctr: &api.Container{Id: "infer", Name: "c"}}},
			want:     &answer{Devices: everything, Mounts: drivers(defaultCaps, 0, 1, 2, 3, 4, 5, 6, 7), Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void", "LD_LIBRARY_PATH": libPath}, Annotations: noGPURecord},
			holdings: []alloc.Holding{{Holder: alloc.PodHolder("p-infer", "ml", "p"), Mode: sharing.Shared, GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}}}},
		// An exclusive request next to a management container is met (a
		// pod-level request goes with the pod); the management container
		// does not then reach the GPU held exclusively.
		{name: "management beside an exclusive holder fails", pol: secure, pod: mgmtPod, ctr: &api.Container{Id: "dcgm-2", Name: "dcgm"},
			before: []policyStep{
				{pol: open, pod: pod("p-infer", "ml", "gpus.nri-gpu.dev/pod", "all"), ctr: &api.Container{Id: "infer", Name: "c"}},
				{pol: secure, pod: mgmtPod, ctr: &api.Container{Id: "dcgm", Name: "dcgm"}},
				{pod: pod("p-infer", "ml"), releasePod: true},
				{pol: open, pod: pod("p-train", "ml", "gpus.nri-gpu.dev/pod", "exclusive=true,device=3"), ctr: &api.Container{Id: "train", Name: "c"}},
			},
			err:      "nri-gpu: annotation nvidia.cdi.k8s.io/pod: GPU 3 is held exclusively by a pod in another namespace (exclusive)",
			holdings: []alloc.Holding{{Holder: alloc.PodHolder("p-train", "ml", "p"), Mode: sharing.Exclusive, GPUs: []int{3}}}},
		{name: "management outside its namespaces fails", pol: secure, pod: pod("p-h", "ml", "nvidia.cdi.k8s.io/pod", "management.nvidia.com/gpu=all"), ctr: &api.Container{Id: "h", Name: "dcgm"},
			err: `nri-gpu: annotation nvidia.cdi.k8s.io/pod: not allowed in namespace "ml" (policy.managementNamespaces: [gpu-operator])`},
		{name: "device plugin mounts pass a denying policy", pol: secure, pod: pod("p-i", "web"),
			ctr: &api.Container{Id: "i", Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"},
				Mounts: []*api.Mount{{Source: "/dev/null", Destination: "/var/run/nvidia-container-devices/GPU-00000002-558d-fb20-8eca-25de8b98f5a7"}}},
			want: &answer{Devices: slices.Concat(nodes(2), control), Mounts: drivers(defaultCaps, 2),
				Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids(2), "LD_LIBRARY_PATH": libPath}, Annotations: record("shared", false, 2)},
			holdings: []alloc.Holding{{Holder: holder("p-i", "i", "web", "c"), Mode: sharing.Shared, GPUs: []int{2}}}},
		{name: "runtime CDI devices: nothing", pol: open, pod: pod("p-j", "ml"), ctr: &api.Container{Id: "j", Name: "c", Env: cudaEnv, CDIDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=0"}}},
			note:     "CDI devices nvidia.com/gpu=0: nothing injected",
			holdings: []alloc.Holding{{Holder: holder("p-j", "j", "ml", "c"), Mode: sharing.Shared, GPUs: []int{0}, Runtime: true}}},
		{name: "device nodes from the runtime: only what is missing", pol: open, pod: pod("p-k", "ml"), ctr: runtimeNodes,
			want: &answer{Devices: []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}, Mounts: drivers(defaultCaps, 0),
				Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids(0), "LD_LIBRARY_PATH": libPath}},
			note:     "/dev/nvidia0, /dev/nvidiactl: injected only the missing control nodes and driver files (2 device nodes, ",
			holdings: []alloc.Holding{{Holder: holder("p-k", "rt", "ml", "c"), Mode: sharing.Shared, GPUs: []int{0}, Runtime: true}}},
		{name: "every device node and driver file from the runtime: nothing", pol: open, pod: pod("p-l", "ml"), ctr: fullCtr,
			note:     "nothing injected",
			holdings: []alloc.Holding{{Holder: holder("p-l", "rt", "ml", "c"), Mode: sharing.Shared, GPUs: []int{0}, Runtime: true}}},
		// A device plugin gave GPU 2; the image asks for all through its
		// environment: the container keeps exactly GPU 2, booked as the
		// runtime's choice, in the node's mode, without a record
		// (Holdings rebuilds it from the device nodes alone).
		{name: "GPUs from the runtime are not widened", pol: open, pod: pod("p-m", "ml"),
			ctr: &api.Container{Id: "ctr-2", Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{
				{Path: "/dev/nvidia2", Type: "c", Major: 195, Minor: 2},
			}}},
			want:     &answer{Devices: control, Mounts: drivers(defaultCaps, 2), Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids(2), "LD_LIBRARY_PATH": libPath}},
			note:     "env NVIDIA_VISIBLE_DEVICES: the runtime already gives the container /dev/nvidia2: injected only the missing control nodes and driver files (3 device nodes, 18 mounts)",
			holdings: []alloc.Holding{{Holder: holder("p-m", "ctr-2", "ml", "c"), Mode: sharing.Shared, GPUs: []int{2}, Runtime: true}}},
		// A count request is booked before its GPUs' arch can be checked;
		// the unmet requirement releases the booking.
		{name: "an unmet requirement releases a count's booking", pol: open, pod: pod("p-n", "ml", "gpus.nri-gpu.dev/pod", "2"),
			ctr: &api.Container{Id: "ctr-1", Name: "c", Env: []string{"NVIDIA_REQUIRE_ARCH=arch>=99.0"}},
			err: "nri-gpu: env NVIDIA_REQUIRE_ARCH: requirement error: unsatisfied condition: arch>=99.0, please update your driver to a newer version, or use an earlier cuda container"},
		{name: "an unmet requirement fails and changes nothing", pol: open, pod: pod("p-o", "ml"), ctr: &api.Container{Id: "o", Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=13.5"}},
			err: "nri-gpu: env NVIDIA_REQUIRE_CUDA: requirement error: unsatisfied condition: cuda>=13.5, please update your driver to a newer version, or use an earlier cuda container"},
		{name: "requirements disabled", pol: open, pod: pod("p-q", "ml"), ctr: &api.Container{Id: "q", Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=13.5", "NVIDIA_DISABLE_REQUIRE=1"}},
			want: &answer{Devices: slices.Concat(nodes(0, 1, 2, 3, 4, 5, 6, 7), control), Mounts: drivers(defaultCaps, 0, 1, 2, 3, 4, 5, 6, 7),
				Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids(0, 1, 2, 3, 4, 5, 6, 7), "LD_LIBRARY_PATH": libPath}, Annotations: record("shared", false, 0, 1, 2, 3, 4, 5, 6, 7)},
			holdings: []alloc.Holding{{Holder: holder("p-q", "q", "ml", "c"), Mode: sharing.Shared, GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}}}},
	}
}

// TestHandleWithPolicy: each carrier under the policy of the pod's
// namespace (a closed one that allows annotations and CDI in ml,
// management in gpu-operator and denies NVIDIA_VISIBLE_DEVICES, and one
// that allows it in listed namespaces), what the runtime gave the
// container already, and requirements: the whole answer, the error, the
// note and the allocation table after.
func TestHandleWithPolicy(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	for _, tc := range policyCases(t, prep) {
		t.Run(tc.name, func(t *testing.T) {
			table := tableFor(prep.Snapshot())
			for _, b := range tc.before {
				if b.releasePod {
					table.ReleasePod(b.pod.Id)
					continue
				}
				if _, _, err := handleWithPolicy(prep, table, sharing.Shared, b.pol, b.pod, b.ctr); err != nil {
					t.Fatalf("before: %s/%s: %v", b.pod.Id, b.ctr.Id, err)
				}
			}
			adj, res, err := handleWithPolicy(prep, table, sharing.Shared, tc.pol, tc.pod, tc.ctr)
			if got := fmt.Sprint(err); tc.err != "" && got != tc.err || tc.err == "" && err != nil {
				t.Errorf("error %s\nwant  %s", got, tc.err)
			}
			if d := cmp.Diff(tc.want, answerOf(adj)); d != "" {
				t.Errorf("answer (-want +got):\n%s", d)
			}
			if note := res.Selection.Note; tc.note == "" && note != "" || !strings.Contains(note, tc.note) {
				t.Errorf("note %q, want one with %q", note, tc.note)
			}
			if d := cmp.Diff(tc.holdings, table.Holdings(), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("holdings (-want +got):\n%s", d)
			}
		})
	}
}
