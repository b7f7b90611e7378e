package request

import (
	"runtime"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// checkOutcome checks what any request parser and Select may produce from
// hostile input: an error in the package's form, or a selection of GPUs of
// the node that grants no more than was asked.
func checkOutcome(t *testing.T, r Request, err error) {
	t.Helper()
	snap := testSnapshot(4)
	if err != nil {
		if !strings.HasPrefix(err.Error(), "nri-gpu: ") {
			t.Fatalf("error %q lacks the nri-gpu: prefix", err)
		}
		return
	}
	sel, err := Select(r, nvidia(snap))
	if err != nil {
		if !strings.HasPrefix(err.Error(), "nri-gpu: ") {
			t.Fatalf("error %q lacks the nri-gpu: prefix", err)
		}
		return
	}
	if !sel.Inject {
		return
	}
	if len(sel.GPUs) > len(snap.GPUs) {
		t.Fatalf("%d GPUs selected on a node of %d", len(sel.GPUs), len(snap.GPUs))
	}
	switch r.Kind {
	case Count:
		// The allocator picks the GPUs of a count.
		if len(sel.GPUs) != 0 || sel.Count != r.Count || r.Count > len(snap.GPUs) {
			t.Fatalf("count %d gave %d GPUs, selection count %d", r.Count, len(sel.GPUs), sel.Count)
		}
	case Devices:
		if len(sel.GPUs) > len(r.IDs) {
			t.Fatalf("%d IDs gave %d GPUs", len(r.IDs), len(sel.GPUs))
		}
	case DriverOnly:
		if len(sel.GPUs) != 0 {
			t.Fatalf("none gave %d GPUs", len(sel.GPUs))
		}
	}
	seen := map[int]bool{}
	for _, g := range sel.GPUs {
		if seen[g.Index] {
			t.Fatalf("GPU %d selected twice", g.Index)
		}
		seen[g.Index] = true
	}
}

// parseClass parses in as ParseInput does, and fails when the request's
// class for the policy (Request.PolicySource) differs from its carrier's
// (Found.PolicySource): the policy decides on the carrier's before the
// value is read, and the request path serves a management request
// differently, so a parse may fail but never change the class.
func parseClass(t *testing.T, in Input) (Request, error) {
	t.Helper()
	f, err := Find(in)
	if err != nil {
		return Request{}, err
	}
	r, err := f.Parse()
	if err == nil && r.Kind != Nothing && r.PolicySource() != f.PolicySource() {
		t.Fatalf("carrier %v of class %v parsed as class %v", f.Source, f.PolicySource(), r.PolicySource())
	}
	return r, err
}

// FuzzParseAnnotation fuzzes gpus.nri-gpu.dev annotation values.
func FuzzParseAnnotation(f *testing.F) {
	for _, s := range []string{"all", "2", "count=all", `"device=0,2"`, "device=GPU-00000001-1111-2222-3333-000000000001",
		`"device=0,1","capabilities=compute,utility",driver=nvidia`, "all,capabilities=all", "\"", "device=0,1", "count=0", "\n1\n2"} {
		f.Add(s, "")
	}
	f.Fuzz(func(t *testing.T, val, caps string) {
		r, err := parseClass(t, Input{Name: "c", Annotations: map[string]string{AnnotationContainerPrefix + "c": val},
			Env: []string{EnvDriverCapabilities + "=" + caps}})
		checkOutcome(t, r, err)
	})
}

// FuzzParseCDI fuzzes nvidia.cdi.k8s.io annotation values.
func FuzzParseCDI(f *testing.F) {
	for _, s := range []string{"nvidia.com/gpu=0", "nvidia.com/gpu=all", "management.nvidia.com/gpu=all",
		"nvidia.com/gpu=0,nvidia.com/gpu=GPU-00000001-1111-2222-3333-000000000001", "amd.com/gpu=0", "=", "nvidia.com/gpu=0000:13:00.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, val string) {
		r, err := parseClass(t, Input{Name: "c", Annotations: map[string]string{AnnotationCDIPod: val}})
		checkOutcome(t, r, err)
	})
}

// FuzzParseEnv fuzzes NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES
// values, and device-list mount destinations.
func FuzzParseEnv(f *testing.F) {
	for _, f2 := range [][3]string{
		{"all", "", ""}, {"none", "utility", ""}, {"void", "", ""}, {" 0, 1 ,0", "compute,video", ""},
		{"GPU-00000001-1111-2222-3333-000000000001,2", "all", ""}, {"0,all,none", "", ""}, {"MIG-x,0:1", "", ""},
		{DeviceListRoot, "", DeviceListRoot + "/0"}, {"", "", DeviceListRoot + "/cdi/nvidia.com/gpu/1"},
		{"", "", DeviceListRoot + "/cdi/management.nvidia.com/gpu/all"}, {"", "", DeviceListRoot + "/management.nvidia.com/gpu=all"},
	} {
		f.Add(f2[0], f2[1], f2[2])
	}
	f.Fuzz(func(t *testing.T, devices, caps, mount string) {
		in := Input{Name: "c", Env: []string{EnvVisibleDevices + "=" + devices, EnvDriverCapabilities + "=" + caps}}
		if mount != "" {
			in.Mounts = []inventory.Mount{{Source: "/dev/null", Destination: mount}}
		}
		r, err := parseClass(t, in)
		checkOutcome(t, r, err)
	})
}

// allocBound fails when one call of fn allocates more than a multiple of
// the input's size (plus a constant): what a pod author writes must not
// decide how much the parser allocates beyond its own size.
func allocBound(t *testing.T, n int, fn func()) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(16*n+64<<10); got > limit {
		t.Fatalf("allocated %d bytes for %d bytes of input (limit %d)", got, n, limit)
	}
}

// FuzzParseEnvList fuzzes a whole environment, one entry a line, with
// adversarial shapes: many entries sharing the looked-up prefixes, long
// lists of IDs, repeated and blank entries. Each call allocates at most a
// bounded multiple of its input.
func FuzzParseEnvList(f *testing.F) {
	f.Add("NVIDIA_VISIBLE_DEVICES=0,1\nNVIDIA_DRIVER_CAPABILITIES=compute")
	f.Add(strings.Repeat("NVIDIA_VISIBLE_DEVICEX=1\n", 2000) + "NVIDIA_VISIBLE_DEVICES=" + strings.Repeat("0,", 300))
	f.Add("NVIDIA_VISIBLE_DEVICES=" + strings.Repeat("GPU-1,GPU-2,", 700))
	f.Add("NVIDIA_VISIBLE_DEVICES=all\nNVIDIA_VISIBLE_DEVICES=void\n" + strings.Repeat(",", 20000))
	f.Add("NVIDIA_VISIBLE_DEVICES=0\nNVIDIA_DRIVER_CAPABILITIES=" + strings.Repeat("compute,", 3000))
	f.Fuzz(func(t *testing.T, blob string) {
		env := strings.Split(blob, "\n")
		var r Request
		var err error
		allocBound(t, len(blob)+16*len(env), func() { r, err = ParseInput(Input{Name: "c", Env: env}) })
		if err == nil && len(r.IDs) > maxDeviceList {
			t.Fatalf("%d IDs", len(r.IDs))
		}
		checkOutcome(t, r, err)
	})
}
