package request

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/inventory"
)

const (
	ctrKey = "gpus.nri-gpu.dev/container.train"
	podKey = "gpus.nri-gpu.dev/pod"
)

var def = inventory.DefaultCapabilities

func caps(cs ...inventory.Capability) inventory.Capabilities {
	var s inventory.Capabilities
	for _, c := range cs {
		s = s.With(c)
	}
	return s
}

func TestParse(t *testing.T) {
	ann := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name string
		ann  map[string]string
		env  []string
		want Request
	}{
		{"no request", nil, nil, Request{}},
		{"unrelated env", nil, []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICESX=all"}, Request{}},
		{"annotation all", ann(ctrKey, "all"), nil,
			Request{Kind: All, Source: Source{ContainerAnnotation, ctrKey}, Caps: def}},
		{"annotation count", ann(ctrKey, "2"), nil,
			Request{Kind: Count, Count: 2, Source: Source{ContainerAnnotation, ctrKey}, Caps: def}},
		{"annotation count=", ann(ctrKey, "count=3"), nil,
			Request{Kind: Count, Count: 3, Source: Source{ContainerAnnotation, ctrKey}, Caps: def}},
		{"annotation count=all", ann(ctrKey, "count=all"), nil,
			Request{Kind: All, Source: Source{ContainerAnnotation, ctrKey}, Caps: def}},
		{"annotation quoted device list", ann(ctrKey, `"device=0,2"`), nil,
			Request{Kind: Devices, IDs: []string{"0", "2"}, Source: Source{ContainerAnnotation, ctrKey}, Caps: def}},
		{"annotation single device", ann(ctrKey, "device=GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7"), nil,
			Request{Kind: Devices, IDs: []string{"GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7"}, Source: Source{ContainerAnnotation, ctrKey}, Caps: def}},
		{"annotation device and capabilities", ann(ctrKey, `"device=0,1","capabilities=compute,utility,video",driver=nvidia`), nil,
			Request{Kind: Devices, IDs: []string{"0", "1"}, Source: Source{ContainerAnnotation, ctrKey},
				Caps: caps(inventory.Compute, inventory.Utility, inventory.Video), CapsSource: Source{ContainerAnnotation, ctrKey}}},
		{"annotation capabilities all", ann(ctrKey, "all,capabilities=all"), nil,
			Request{Kind: All, Source: Source{ContainerAnnotation, ctrKey}, Caps: inventory.AllCapabilities, CapsSource: Source{ContainerAnnotation, ctrKey}}},
		{"annotation spaces", ann(ctrKey, "  count=1 , driver=nvidia "), nil,
			Request{Kind: Count, Count: 1, Source: Source{ContainerAnnotation, ctrKey}, Caps: def}},
		{"annotation takes caps from env", ann(ctrKey, "1"), []string{"NVIDIA_DRIVER_CAPABILITIES=utility"},
			Request{Kind: Count, Count: 1, Source: Source{ContainerAnnotation, ctrKey}, Caps: caps(inventory.Utility), CapsSource: envSource(EnvDriverCapabilities)}},
		{"annotation exclusive", ann(ctrKey, "2,exclusive=true"), nil,
			Request{Kind: Count, Count: 2, Source: Source{ContainerAnnotation, ctrKey}, Caps: def, Exclusive: ptr(true)}},
		{"annotation shared device", ann(ctrKey, "exclusive=false,device=1"), nil,
			Request{Kind: Devices, IDs: []string{"1"}, Source: Source{ContainerAnnotation, ctrKey}, Caps: def, Exclusive: ptr(false)}},
		{"pod annotation", ann(podKey, "1"), nil,
			Request{Kind: Count, Count: 1, Source: Source{PodAnnotation, podKey}, Caps: def}},
		{"container annotation wins over pod", ann(podKey, "1", ctrKey, "2"), nil,
			Request{Kind: Count, Count: 2, Source: Source{ContainerAnnotation, ctrKey}, Caps: def}},
		{"other container's annotation ignored", ann("gpus.nri-gpu.dev/container.other", "1"), nil, Request{}},
		{"annotation wins over env", ann(ctrKey, "1"), []string{"NVIDIA_VISIBLE_DEVICES=all"},
			Request{Kind: Count, Count: 1, Source: Source{ContainerAnnotation, ctrKey}, Caps: def}},
		{"env all", nil, []string{"NVIDIA_VISIBLE_DEVICES=all"},
			Request{Kind: All, Source: envSource(EnvVisibleDevices), Caps: def}},
		{"env none", nil, []string{"NVIDIA_VISIBLE_DEVICES=none"},
			Request{Kind: DriverOnly, Source: envSource(EnvVisibleDevices), Caps: def}},
		{"env void", nil, []string{"NVIDIA_VISIBLE_DEVICES=void"}, Request{}},
		{"env empty", nil, []string{"NVIDIA_VISIBLE_DEVICES="}, Request{}},
		{"env only commas", nil, []string{"NVIDIA_VISIBLE_DEVICES= , ,"}, Request{}},
		{"env list with spaces", nil, []string{"NVIDIA_VISIBLE_DEVICES= 0, GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7 ,0000:38:00.0"},
			Request{Kind: Devices, IDs: []string{"0", "GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7", "0000:38:00.0"},
				Source: envSource(EnvVisibleDevices), Caps: def}},
		{"env caps", nil, []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES= compute , graphics"},
			Request{Kind: Devices, IDs: []string{"0"}, Source: envSource(EnvVisibleDevices),
				Caps: caps(inventory.Compute, inventory.Graphics), CapsSource: envSource(EnvDriverCapabilities)}},
		{"env caps all", nil, []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"},
			Request{Kind: Devices, IDs: []string{"0"}, Source: envSource(EnvVisibleDevices),
				Caps: inventory.AllCapabilities, CapsSource: envSource(EnvDriverCapabilities)}},
		{"env empty caps is default", nil, []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES="},
			Request{Kind: Devices, IDs: []string{"0"}, Source: envSource(EnvVisibleDevices), Caps: def}},
		{"first env entry wins", nil, []string{"NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=all"}, Request{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parse(tc.ann, "train", tc.env)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Parse (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  string // value of the container annotation; "" means use env
		env  []string
		want string
	}{
		{"empty annotation", " ", nil,
			`nri-gpu: annotation gpus.nri-gpu.dev/container.train: empty value`},
		{"unquoted device list", "device=0,2", nil,
			`nri-gpu: annotation gpus.nri-gpu.dev/container.train: unexpected field "2": quote a device list that has commas, as in '"device=0,2"'`},
		{"bad count", "count=-1", nil,
			`nri-gpu: annotation gpus.nri-gpu.dev/container.train: bad GPU count "-1" (a number of at least 1, or all)`},
		{"zero count", "0", nil,
			`nri-gpu: annotation gpus.nri-gpu.dev/container.train: bad GPU count "0"`},
		{"count and device", `count=1,"device=0"`, nil,
			`conflicts with an earlier field`},
		{"all and count", `all,count=2`, nil,
			`conflicts with an earlier field`},
		{"duplicate field", `device=0,device=1`, nil,
			`field "device=1" conflicts with an earlier field`},
		{"unknown field", `count=1,options=foo`, nil,
			`unknown field "options"`},
		{"bare word", `gpus`, nil,
			`unexpected field "gpus"`},
		{"bad exclusive", `all,exclusive=yes`, nil,
			`nri-gpu: annotation gpus.nri-gpu.dev/container.train: bad value "yes" for exclusive (valid: true, false)`},
		{"duplicate exclusive", `all,exclusive=true,exclusive=false`, nil,
			`field "exclusive=false" conflicts with an earlier field`},
		{"exclusive alone", `exclusive=true`, nil,
			`"exclusive=true" requests no GPU`},
		{"bad driver", `all,driver=amd`, nil,
			`unsupported driver "amd" (valid: nvidia)`},
		{"unsupported capability", `all,"capabilities=compute,teleport"`, nil,
			`unsupported capability "teleport" (valid: compute, compat32, graphics, utility, video, display, ngx, all)`},
		{"empty capabilities", `all,capabilities=`, nil,
			`empty capability list`},
		{"empty device id", `"device=0,,1"`, nil,
			`empty device ID in "device=0,,1"`},
		{"only capabilities", `capabilities=utility`, nil,
			`"capabilities=utility" requests no GPU`},
		{"bad quoting", `"device=0,1`, nil,
			`malformed value`},
		{"two lines", "1\n2", nil,
			`more than one line`},
		{"huge value", strings.Repeat("1", 5000), nil,
			`value is 5000 bytes long (at most 4096)`},
		{"annotation with bad env caps", "1", []string{"NVIDIA_DRIVER_CAPABILITIES=compute,bogus"},
			`nri-gpu: env NVIDIA_DRIVER_CAPABILITIES: unsupported capability "bogus"`},
		{"env bad caps", "", []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=gpu"},
			`nri-gpu: env NVIDIA_DRIVER_CAPABILITIES: unsupported capability "gpu"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ann map[string]string
			if tc.ann != "" {
				ann = map[string]string{ctrKey: tc.ann}
			}
			r, err := parse(ann, "train", tc.env)
			if err == nil {
				t.Fatalf("Parse succeeded with %+v, want error containing %q", r, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "nri-gpu: ") {
				t.Errorf("error %q does not start with nri-gpu:", err)
			}
		})
	}
}

// nvidia returns the device source of NVIDIA GPUs of snap.
func nvidia(snap *inventory.Snapshot) adjust.Source {
	return adjust.Prepare(snap, adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib"})
}

// testSnapshot returns a snapshot of n GPUs whose minors run backwards, so
// that index and minor differ.
func testSnapshot(n int) *inventory.Snapshot {
	s := &inventory.Snapshot{
		DriverVersion: "580.126.09",
		Control:       inventory.ControlNodes{Ctl: &inventory.DeviceNode{Path: "/dev/nvidiactl", Major: 195, Minor: 255, Mode: 0o666}},
	}
	for i := 0; i < n; i++ {
		minor := n - 1 - i
		s.GPUs = append(s.GPUs, inventory.GPU{
			Index: i, Minor: minor,
			UUID:  fmt.Sprintf("GPU-%08x-1111-2222-3333-%012x", i, i),
			BusID: fmt.Sprintf("0000:%02x:00.0", 0x10+i),
			Node:  inventory.DeviceNode{Path: fmt.Sprintf("/dev/nvidia%d", minor), Major: 195, Minor: int64(minor), Mode: 0o666},
		})
	}
	return s
}

func indexes(gpus []inventory.GPU) []int {
	out := []int{}
	for _, g := range gpus {
		out = append(out, g.Index)
	}
	return out
}

func TestSelect(t *testing.T) {
	snap := testSnapshot(4)
	for _, tc := range []struct {
		name string
		ann  string
		env  []string
		want []int // nil: no injection
	}{
		{"all", "all", nil, []int{0, 1, 2, 3}},
		{"devices by index keep order", `"device=2,0"`, nil, []int{2, 0}},
		{"devices deduplicated", `"device=1,1,GPU-00000001-1111-2222-3333-000000000001"`, nil, []int{1}},
		{"uuid case-insensitive", "device=gpu-00000003-1111-2222-3333-000000000003", nil, []int{3}},
		{"bus id 4-digit domain", "device=0000:12:00.0", nil, []int{2}},
		{"bus id 8-digit domain upper case", "device=00000000:13:00.0", nil, []int{3}},
		{"env list", "", []string{"NVIDIA_VISIBLE_DEVICES=3,0"}, []int{3, 0}},
		{"env all", "", []string{"NVIDIA_VISIBLE_DEVICES=all"}, []int{0, 1, 2, 3}},
		{"env none", "", []string{"NVIDIA_VISIBLE_DEVICES=none"}, []int{}},
		{"nothing", "", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ann map[string]string
			if tc.ann != "" {
				ann = map[string]string{ctrKey: tc.ann}
			}
			r, err := parse(ann, "train", tc.env)
			if err != nil {
				t.Fatal(err)
			}
			sel, err := Select(r, nvidia(snap))
			if err != nil {
				t.Fatalf("Select: %v", err)
			}
			if tc.want == nil {
				if sel.Inject {
					t.Fatalf("Select injects %v, want no injection", indexes(sel.GPUs))
				}
				return
			}
			if !sel.Inject {
				t.Fatal("Select does not inject")
			}
			if diff := cmp.Diff(tc.want, indexes(sel.GPUs)); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSelectCount checks that a count request is passed on to the
// allocator: no GPUs named, the count kept.
func TestSelectCount(t *testing.T) {
	for _, n := range []int{1, 4} {
		r, err := parse(map[string]string{ctrKey: fmt.Sprint(n)}, "train", nil)
		if err != nil {
			t.Fatal(err)
		}
		sel, err := Select(r, nvidia(testSnapshot(4)))
		if err != nil || !sel.Inject || sel.Count != n || len(sel.GPUs) != 0 {
			t.Errorf("count %d: %+v, %v", n, sel, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestSelectErrors(t *testing.T) {
	snap := testSnapshot(4)
	for _, tc := range []struct {
		name string
		ann  string
		env  []string
		want string
	}{
		{"unknown index", "device=7", nil,
			`nri-gpu: annotation gpus.nri-gpu.dev/container.train: unknown GPU "7" (node has 0-3)`},
		{"huge index", "device=99999999999999999999", nil, `unknown GPU "99999999999999999999" (node has 0-3)`},
		{"count too large", "5", nil,
			`nri-gpu: annotation gpus.nri-gpu.dev/container.train: count 5 exceeds the node's 4 GPUs (0-3)`},
		{"unknown uuid", "device=GPU-deadbeef-1111-2222-3333-000000000001", nil, `unknown GPU "GPU-deadbeef-1111-2222-3333-000000000001" (no GPU of the node has this UUID`},
		{"unknown bus id", "device=0000:99:00.0", nil, `unknown GPU "0000:99:00.0" (no GPU of the node is at this PCI bus id`},
		{"malformed bus id", "device=0000:zz:00.0", nil, `unknown GPU "0000:zz:00.0"`},
		{"MIG uuid", "device=MIG-3e953d37-558d-fb20-8eca-25de8b98f5a7", nil, `unknown MIG device "MIG-3e953d37-558d-fb20-8eca-25de8b98f5a7" (no MIG device of the node has this UUID, the node has no MIG device; see nri-gpu inventory)`},
		{"MIG pair", "", []string{"NVIDIA_VISIBLE_DEVICES=0:1"}, `nri-gpu: env NVIDIA_VISIBLE_DEVICES: unknown MIG device "0:1" (the node has no MIG device; see nri-gpu inventory)`},
		{"garbage id", "", []string{"NVIDIA_VISIBLE_DEVICES=/var/run/x"}, `nri-gpu: env NVIDIA_VISIBLE_DEVICES: unknown device "/var/run/x" (valid: an index 0-3, a GPU-<uuid>, a PCI bus id, a MIG-<uuid> or <gpu>:<mig>)`},
		{"env unknown index", "", []string{"NVIDIA_VISIBLE_DEVICES=0,9"}, `nri-gpu: env NVIDIA_VISIBLE_DEVICES: unknown GPU "9" (node has 0-3); the list may also be all, none or void (lower case)`},
		{"env ALL", "", []string{"NVIDIA_VISIBLE_DEVICES=ALL"}, `nri-gpu: env NVIDIA_VISIBLE_DEVICES: unknown device "ALL" (valid: an index 0-3, a GPU-<uuid>, a PCI bus id, a MIG-<uuid> or <gpu>:<mig>); the list may also be all, none or void (lower case): did you mean "all"?`},
		{"annotation ALL", "device=ALL", nil, `nri-gpu: annotation gpus.nri-gpu.dev/container.train: unknown device "ALL" (valid: an index 0-3, a GPU-<uuid>, a PCI bus id, a MIG-<uuid> or <gpu>:<mig>)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ann map[string]string
			if tc.ann != "" {
				ann = map[string]string{ctrKey: tc.ann}
			}
			r, err := parse(ann, "train", tc.env)
			if err != nil {
				t.Fatal(err)
			}
			sel, err := Select(r, nvidia(snap))
			if err == nil {
				t.Fatalf("Select succeeded with %v, want error containing %q", indexes(sel.GPUs), tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tc.want)
			}
			if sel.Inject || len(sel.GPUs) > 0 {
				t.Errorf("failed Select returned a selection: %+v", sel)
			}
		})
	}
}

func TestSelectEmptyNode(t *testing.T) {
	noGPU := testSnapshot(0)
	noDriver := &inventory.Snapshot{}
	for _, tc := range []struct {
		name    string
		snap    *inventory.Snapshot
		ann     string
		env     []string
		wantErr string // "" means no error and no injection with a note
	}{
		{"image env all on GPU-less node", noGPU, "", []string{"NVIDIA_VISIBLE_DEVICES=all"}, ""},
		{"image env all on driver-less node", noDriver, "", []string{"NVIDIA_VISIBLE_DEVICES=all"}, ""},
		{"env none on driver-less node", noDriver, "", []string{"NVIDIA_VISIBLE_DEVICES=none"}, ""},
		{"annotation all on GPU-less node", noGPU, "all", nil, "all GPUs requested, but the node has none"},
		{"annotation count on GPU-less node", noGPU, "1", nil, "count 1 exceeds the node's 0 GPUs (none)"},
		{"env index on GPU-less node", noGPU, "", []string{"NVIDIA_VISIBLE_DEVICES=0"}, `unknown GPU "0" (node has none)`},
		{"annotation on driver-less node", noDriver, "1", nil, "the node has no usable NVIDIA driver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ann map[string]string
			if tc.ann != "" {
				ann = map[string]string{ctrKey: tc.ann}
			}
			r, err := parse(ann, "train", tc.env)
			if err != nil {
				t.Fatal(err)
			}
			sel, err := Select(r, nvidia(tc.snap))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sel.Inject || sel.Note == "" {
				t.Errorf("want no injection with a note, got %+v", sel)
			}
		})
	}
}

func TestDriverOnlySelection(t *testing.T) {
	r, err := parse(nil, "c", []string{"NVIDIA_VISIBLE_DEVICES=none", "NVIDIA_DRIVER_CAPABILITIES=utility"})
	if err != nil {
		t.Fatal(err)
	}
	sel, err := Select(r, nvidia(testSnapshot(2)))
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Inject || len(sel.GPUs) != 0 || sel.Caps != caps(inventory.Utility) {
		t.Errorf("got %+v, want driver files of utility and no GPU", sel)
	}
}

// parse reads a request from annotations and env through ParseInput, the
// plugin's parser. The tables of this file state the requests of the
// gpus.nri-gpu.dev annotations and the toolkit's env; which policy source a
// request counts as is checked in sources_test.go, so it is left out here.
func parse(ann map[string]string, name string, env []string) (Request, error) {
	r, err := ParseInput(Input{Annotations: ann, Name: name, Env: env})
	return r, err
}
