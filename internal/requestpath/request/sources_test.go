package request

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// visibleDevicesFixtures are NVIDIA_VISIBLE_DEVICES values as schedulers
// and binders write them, with where each shape comes from and the GPUs
// (indexes on testSnapshot(4)) the toolkit would give for it. nil means
// nothing is injected; an empty non-nil slice means the driver without a
// GPU (none).
var visibleDevicesFixtures = []struct {
	origin string
	value  string
	want   []int
}{
	// The NVIDIA toolkit's reader (nvidia-container-toolkit
	// internal/config/image: devicesFromEnvvars, NewVisibleDevices):
	// entries split on ",", trimmed, empty ones dropped; void wins over
	// none, none over all, all over IDs; duplicate IDs dropped.
	{"toolkit: plain index list", "0,2", []int{0, 2}},
	{"toolkit: whitespace around entries", " 1 ,\t3 ", []int{1, 3}},
	{"toolkit: empty entries", ",,1,,", []int{1}},
	{"toolkit: duplicates dropped", "2,2,2", []int{2}},
	{"toolkit: void wins over IDs", "0,void", nil},
	{"toolkit: void wins over all", "all,void", nil},
	{"toolkit: none wins over all", "all,none", []int{}},
	{"toolkit: all wins over IDs", "0,all", []int{0, 1, 2, 3}},
	{"toolkit: only separators", " , ", nil},
	// The Kubernetes device plugin's envvar strategy and HAMi-style
	// binders: the GPUs' UUIDs, comma-separated (HAMi repeats a UUID when
	// a container takes two shares of one GPU).
	{"device plugin / HAMi: UUID list", "GPU-00000001-1111-2222-3333-000000000001,GPU-00000003-1111-2222-3333-000000000003", []int{1, 3}},
	{"HAMi-style: repeated UUID", "GPU-00000002-1111-2222-3333-000000000002,GPU-00000002-1111-2222-3333-000000000002", []int{2}},
	{"HAMi-style: UUID in lower and upper case", "gpu-00000002-1111-2222-3333-000000000002,GPU-00000002-1111-2222-3333-000000000002", []int{2}},
	// KAI scheduler's GPU sharing binds a fraction to one GPU and writes
	// its UUID, or its index, into the container's environment.
	{"KAI: single UUID", "GPU-00000000-1111-2222-3333-000000000000", []int{0}},
	{"KAI: single index", "3", []int{3}},
	// node-facts.md: IDs may mix forms; bus ids with 4- or 8-digit domains.
	{"mixed GPU- and index", "GPU-00000001-1111-2222-3333-000000000001, 0", []int{1, 0}},
	{"mixed index and bus id", "0,00000000:13:00.0", []int{0, 3}},
	{"index and its own UUID", "1,GPU-00000001-1111-2222-3333-000000000001", []int{1}},
}

func TestVisibleDevicesFixtures(t *testing.T) {
	snap := testSnapshot(4)
	for _, f := range visibleDevicesFixtures {
		t.Run(f.origin, func(t *testing.T) {
			r, err := ParseInput(Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=" + f.value}})
			if err != nil {
				t.Fatal(err)
			}
			sel, err := Select(r, nvidia(snap))
			if err != nil {
				t.Fatal(err)
			}
			if f.want == nil {
				if sel.Inject || r.Kind != Nothing {
					t.Errorf("%q: got %v, want nothing", f.value, indexes(sel.GPUs))
				}
			} else {
				if !sel.Inject || r.PolicySource() != policy.Env || !cmp.Equal(indexes(sel.GPUs), f.want) {
					t.Errorf("%q: got %v (inject %v, origin %v), want %v", f.value, indexes(sel.GPUs), sel.Inject, r.PolicySource(), f.want)
				}
			}
		})
	}
}

func TestParseInputSources(t *testing.T) {
	const uuid1 = "GPU-00000001-1111-2222-3333-000000000001"
	dl := func(ids ...string) []inventory.Mount {
		var ms []inventory.Mount
		for _, id := range ids {
			ms = append(ms, inventory.Mount{Source: "/dev/null", Destination: DeviceListRoot + "/" + id})
		}
		return ms
	}
	for _, tc := range []struct {
		name   string
		in     Input
		kind   Kind
		ids    []string
		origin policy.Source
		mgmt   bool
	}{
		{"CDI container annotation", Input{Name: "c", Annotations: map[string]string{"nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=0, nvidia.com/gpu=" + uuid1}},
			Devices, []string{"0", uuid1}, policy.CDI, false},
		{"CDI pod annotation", Input{Name: "c", Annotations: map[string]string{"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=all"}},
			All, nil, policy.CDI, false},
		{"CDI container before pod", Input{Name: "c", Annotations: map[string]string{"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=all", "nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=1"}},
			Devices, []string{"1"}, policy.CDI, false},
		{"management", Input{Name: "c", Annotations: map[string]string{"nvidia.cdi.k8s.io/container.c": "management.nvidia.com/gpu=all"}},
			All, nil, policy.Management, true},
		{"nri-gpu annotation before CDI", Input{Name: "c", Annotations: map[string]string{"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=all", "gpus.nri-gpu.dev/pod": "1"}},
			Count, nil, policy.Annotation, false},
		{"device list mounts", Input{Name: "c", Mounts: dl(uuid1, "2", uuid1), Env: []string{"NVIDIA_VISIBLE_DEVICES=" + DeviceListRoot}},
			Devices, []string{uuid1, "2"}, policy.DeviceList, false},
		{"device list CDI mounts", Input{Name: "c", Mounts: dl("cdi/nvidia.com/gpu/0", "cdi/nvidia.com/gpu=1")},
			Devices, []string{"0", "1"}, policy.DeviceList, false},
		{"device list before env", Input{Name: "c", Mounts: dl("0"), Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
			Devices, []string{"0"}, policy.DeviceList, false},
		{"mount not from /dev/null is no request", Input{Name: "c", Mounts: []inventory.Mount{{Source: "/tmp/x", Destination: DeviceListRoot + "/0"}}},
			Nothing, nil, 0, false},
		{"bare device list directory is no request", Input{Name: "c", Mounts: []inventory.Mount{{Source: "/dev/null", Destination: DeviceListRoot}}},
			Nothing, nil, 0, false},
		{"unclean paths are cleaned", Input{Name: "c", Mounts: []inventory.Mount{{Source: "/dev//null", Destination: DeviceListRoot + "//x/../1/"}}},
			Devices, []string{"1"}, policy.DeviceList, false},
		{"imex channels ignored", Input{Name: "c", Mounts: dl("imex/0")}, Nothing, nil, 0, false},
		{"device list management in CDI form", Input{Name: "c", Mounts: dl("cdi/management.nvidia.com/gpu/all")},
			All, nil, policy.Management, true},
		// Only a CDI name is of the management kind: the same name as a
		// plain ID is an ID of a device-list request, which all decides.
		{"device list management name as a plain ID", Input{Name: "c", Mounts: dl("management.nvidia.com/gpu=all", "all")},
			All, nil, policy.DeviceList, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Find(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if tc.kind != Nothing && f.PolicySource() != tc.origin {
				t.Errorf("carrier of class %v, want %v (the policy decides on it)", f.PolicySource(), tc.origin)
			}
			r, err := ParseInput(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if r.Kind != tc.kind || !cmp.Equal(r.IDs, tc.ids) || r.PolicySource() != tc.origin || r.Management != tc.mgmt {
				t.Errorf("got %+v, want kind %v IDs %v origin %v management %v", r, tc.kind, tc.ids, tc.origin, tc.mgmt)
			}
		})
	}
}

func TestParseCDIErrors(t *testing.T) {
	for _, tc := range []struct{ val, want string }{
		{"nvidia.com/gpu", `malformed CDI device name "nvidia.com/gpu"`},
		{"gpu=0", `malformed CDI device name "gpu=0"`},
		{"amd.com/gpu=0", `unknown CDI device "amd.com/gpu=0": nri-gpu serves only the kinds nvidia.com/gpu and management.nvidia.com/gpu`},
		{"nvidia.com/mig=0", `unknown CDI device "nvidia.com/mig=0"`},
		{"management.nvidia.com/gpu=0", `unknown CDI device "management.nvidia.com/gpu=0"`},
		{" , ", `no CDI device named`},
		{"nvidia.com/gpu=0," + strings.Repeat("x", 5000), `bytes long`},
	} {
		_, err := ParseInput(Input{Name: "c", Annotations: map[string]string{"nvidia.cdi.k8s.io/container.c": tc.val}})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "nri-gpu: annotation nvidia.cdi.k8s.io/container.c: ") {
			t.Errorf("%q: error %v, want one containing %q", tc.val, err, tc.want)
		}
	}
	// An unknown GPU in a CDI name fails at selection, naming it.
	r, err := ParseInput(Input{Name: "c", Annotations: map[string]string{"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=9"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Select(r, nvidia(testSnapshot(4))); err == nil || !strings.Contains(err.Error(), `nri-gpu: annotation nvidia.cdi.k8s.io/pod: unknown GPU "9" (node has 0-3)`) {
		t.Errorf("unknown GPU: %v", err)
	}
}
