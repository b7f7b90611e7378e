package dra

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/mps"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// opaque is an allocation's configuration of driver with parameters
// raw, for requests, from the claim (class false) or its class.
func opaque(driver, raw string, class bool, requests ...string) resourceapi.DeviceAllocationConfiguration {
	src := resourceapi.AllocationConfigSourceClaim
	if class {
		src = resourceapi.AllocationConfigSourceClass
	}
	return resourceapi.DeviceAllocationConfiguration{Source: src, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}
}

const gpuConfigHead = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"`

// TestParseGpuConfig: NVIDIA's GpuConfig as nri-gpu reads it, with the
// same meaning, and every refusal naming the field, the bad token and
// what is valid.
func TestParseGpuConfig(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      Sharing
		wantMiB   uint64
		err       []string
	}{
		{name: "no sharing", raw: gpuConfigHead + `}`},
		{name: "time-slicing", raw: gpuConfigHead + `, "sharing": {"strategy": "TimeSlicing"}}`, want: Sharing{Strategy: StrategyTimeSlicing}},
		{name: "time-slicing Default", raw: gpuConfigHead + `, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}}`, want: Sharing{Strategy: StrategyTimeSlicing}},
		{name: "MPS without config", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS"}}`, want: Sharing{Strategy: StrategyMPS, MPS: &sharing.MPSLimits{ActiveThreadPercentage: 100}}},
		{name: "MPS limits", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "10Gi", "multiUser": false}}}`,
			want: Sharing{Strategy: StrategyMPS, MPS: &sharing.MPSLimits{ActiveThreadPercentage: 30}}, wantMiB: 10240},
		{name: "MPS per-device limit over the default", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Gi", "defaultPerDevicePinnedMemoryLimit": {"0": "5000Mi"}}}}`,
			want: Sharing{Strategy: StrategyMPS, MPS: &sharing.MPSLimits{ActiveThreadPercentage: 100}}, wantMiB: 5000},
		{name: "per-device by UUID", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"gpu-aaaaaaaa": "2G"}}}}`,
			want: Sharing{Strategy: StrategyMPS, MPS: &sharing.MPSLimits{ActiveThreadPercentage: 100}}, wantMiB: 1907},

		{name: "unknown strategy", raw: gpuConfigHead + `, "sharing": {"strategy": "Exclusive"}}`,
			err: []string{".sharing.strategy", `"Exclusive"`, "valid: TimeSlicing, MPS"}},
		{name: "strategy in lower case", raw: gpuConfigHead + `, "sharing": {"strategy": "mps"}}`,
			err: []string{".sharing.strategy", `"mps"`, "valid: TimeSlicing, MPS"}},
		{name: "interval Long", raw: gpuConfigHead + `, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}`,
			err: []string{".sharing.timeSlicingConfig.interval", `"Long"`, "valid: Default"}},
		{name: "mpsConfig with TimeSlicing", raw: gpuConfigHead + `, "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}}`,
			err: []string{".sharing.mpsConfig", "strategy MPS only"}},
		{name: "timeSlicingConfig with MPS", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "timeSlicingConfig": {}}}`,
			err: []string{".sharing.timeSlicingConfig", "strategy TimeSlicing only"}},
		{name: "threads 0", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}}`,
			err: []string{".sharing.mpsConfig.defaultActiveThreadPercentage", "0 is not", "valid: 1 to 100"}},
		{name: "threads 101", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}}`,
			err: []string{"defaultActiveThreadPercentage", "101", "1 to 100"}},
		{name: "threads not a number", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "half"}}}`,
			err: []string{"opaque.parameters", "defaultActiveThreadPercentage", "valid fields"}},
		{name: "memory under 1Mi", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1000"}}}`,
			err: []string{".sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", "1k is less than 1Mi"}},
		{name: "memory negative", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "-1Gi"}}}`,
			err: []string{"defaultPinnedDeviceMemoryLimit", "-1Gi"}},
		{name: "memory too large", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "100Ei"}}}`,
			err: []string{"defaultPinnedDeviceMemoryLimit", "fits in 64 bits"}},
		{name: "memory fractional bytes", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1.5m"}}}`,
			err: []string{"defaultPinnedDeviceMemoryLimit", "1500u"}},
		{name: "memory not a quantity", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}}`,
			err: []string{"opaque.parameters", "quantities must match"}},
		{name: "per-device other key", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"1": "1Gi"}}}}`,
			err: []string{".sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit", `key "1"`, "valid: 0 or GPU-aaaaaaaa"}},
		{name: "multiUser", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": true}}}`,
			err: []string{".sharing.mpsConfig.multiUser", "true", "valid: false"}},
		{name: "unknown field", raw: gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultThreads": 5}}}`,
			err: []string{"opaque.parameters", `unknown field "sharing.mpsConfig.defaultThreads"`, "valid fields"}},
		{name: "unknown top field", raw: gpuConfigHead + `, "replicas": 4}`,
			err: []string{`unknown field "replicas"`}},
		{name: "another kind", raw: `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}`,
			err: []string{".kind", `"VfioDeviceConfig"`, "valid: GpuConfig, MigDeviceConfig"}},
		{name: "another version", raw: `{"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}`,
			err: []string{".apiVersion", `"resource.nvidia.com/v1"`, "valid: resource.nvidia.com/v1beta1"}},
		{name: "not JSON", raw: `sharing: MPS`, err: []string{"opaque.parameters", "not a resource.nvidia.com/v1beta1 GpuConfig"}},
		{name: "two values", raw: gpuConfigHead + `} {}`, err: []string{"after top-level value"}},
		{name: "too large", raw: gpuConfigHead + `, "x": "` + strings.Repeat("a", 11<<10) + `"}`, err: []string{"more than 10240"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgs, err := parseConfigs(testDriver, []resourceapi.DeviceAllocationConfiguration{opaque(testDriver, tc.raw, false)})
			var got Sharing
			if err == nil {
				got, err = sharingFor(cfgs, "gpu", "GPU-aaaaaaaa", false)
			}
			if tc.err != nil {
				if err == nil {
					t.Fatalf("no error, want one with %q", tc.err)
				}
				for _, w := range append(tc.err, "claim spec.devices.config[0].opaque.parameters") {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.MPS != nil {
				tc.want.MPS.PinnedMemoryMiB = tc.wantMiB
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("sharing (-want +got):\n%s", diff)
			}
		})
	}
}

// TestConfigPrecedence: NVIDIA's order (the class's configurations, then
// the claim's, later over earlier), a configuration's requests (a
// subrequest matches its parent's name), and another driver's skipped.
func TestConfigPrecedence(t *testing.T) {
	mpsRaw := func(threads string) string {
		return gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": ` + threads + `}}}`
	}
	ts := gpuConfigHead + `, "sharing": {"strategy": "TimeSlicing"}}`
	cfgs, err := parseConfigs(testDriver, []resourceapi.DeviceAllocationConfiguration{
		opaque(testDriver, mpsRaw("20"), false, "a"),
		opaque(testDriver, mpsRaw("10"), true),
		opaque("gpu.nvidia.com", `{"anything": "theirs"}`, false),
		opaque(testDriver, ts, false, "b"),
		opaque(testDriver, mpsRaw("40"), false, "a"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		request string
		want    Sharing
	}{
		{"a", Sharing{Strategy: StrategyMPS, MPS: &sharing.MPSLimits{ActiveThreadPercentage: 40}}},
		{"a/small", Sharing{Strategy: StrategyMPS, MPS: &sharing.MPSLimits{ActiveThreadPercentage: 40}}},
		{"b", Sharing{Strategy: StrategyTimeSlicing}},
		{"c", Sharing{Strategy: StrategyMPS, MPS: &sharing.MPSLimits{ActiveThreadPercentage: 10}}},
	} {
		got, err := sharingFor(cfgs, tc.request, "GPU-x", false)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("request %s (-want +got):\n%s", tc.request, diff)
		}
	}
	if _, err := parseConfigs(testDriver, []resourceapi.DeviceAllocationConfiguration{opaque(testDriver, ts, true), opaque(testDriver, "{", true)}); err == nil ||
		!strings.Contains(err.Error(), "class config (status.allocation.devices.config)[1].opaque.parameters") {
		t.Errorf("a bad class config: %v", err)
	}
}

const migConfigHead = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"`

// TestMigDeviceConfig: NVIDIA's MigDeviceConfig is read (GpuConfig's
// sharing without timeSlicingConfig) and matched as NVIDIA's driver
// v0.5.0 matches it: to MIG devices, passing GPUs by, whether it names
// their request or not. A MIG device takes a GpuConfig only where no
// MigDeviceConfig applies, whatever their order.
func TestMigDeviceConfig(t *testing.T) {
	mps := func(head, threads string) string {
		return head + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": ` + threads + `}}}`
	}
	cfgs, err := parseConfigs(testDriver, []resourceapi.DeviceAllocationConfiguration{
		opaque(testDriver, mps(migConfigHead, "30"), false),
		opaque(testDriver, mps(gpuConfigHead, "60"), false),
		opaque(testDriver, migConfigHead+`, "sharing": {"strategy": "TimeSlicing"}}`, false, "ts"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		request string
		mig     bool
		want    Sharing
	}{
		{"any", true, Sharing{Strategy: StrategyMPS, MPS: &sharing.MPSLimits{ActiveThreadPercentage: 30}}},
		{"any", false, Sharing{Strategy: StrategyMPS, MPS: &sharing.MPSLimits{ActiveThreadPercentage: 60}}},
		{"ts", true, Sharing{Strategy: StrategyTimeSlicing}},
		{"ts", false, Sharing{Strategy: StrategyMPS, MPS: &sharing.MPSLimits{ActiveThreadPercentage: 60}}},
	} {
		got, err := sharingFor(cfgs, tc.request, "X", tc.mig)
		if err != nil {
			t.Fatalf("request %s, MIG %v: %v", tc.request, tc.mig, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("request %s, MIG %v (-want +got):\n%s", tc.request, tc.mig, diff)
		}
	}
	// A MIG device with a GpuConfig only (nri-gpu's reading before
	// MigDeviceConfig): it applies.
	only, err := parseConfigs(testDriver, []resourceapi.DeviceAllocationConfiguration{opaque(testDriver, mps(gpuConfigHead, "70"), false)})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sharingFor(only, "any", "MIG-x", true); err != nil || got.MPS == nil || got.MPS.ActiveThreadPercentage != 70 {
		t.Errorf("a MIG device under a GpuConfig alone: %+v, %v", got, err)
	}
	// timeSlicingConfig is no field of MigDeviceConfig's sharing.
	if _, err := parseConfigs(testDriver, []resourceapi.DeviceAllocationConfiguration{
		opaque(testDriver, migConfigHead+`, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}}`, false)}); err == nil ||
		!strings.Contains(err.Error(), ".sharing.timeSlicingConfig: unknown field in a MigDeviceConfig (valid fields of its sharing: strategy, mpsConfig)") {
		t.Errorf("timeSlicingConfig in a MigDeviceConfig: %v", err)
	}
	if _, err := parseConfigs(testDriver, []resourceapi.DeviceAllocationConfiguration{
		opaque(testDriver, `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}`, false)}); err == nil ||
		!strings.Contains(err.Error(), `kind "VfioDeviceConfig" is not one nri-gpu reads (valid: GpuConfig, MigDeviceConfig`) {
		t.Errorf("VfioDeviceConfig: %v", err)
	}
}

// FuzzParseGpuConfig: any parameters are read without panicking; what is
// accepted has limits MPS can set, and is what NVIDIA's strict decoder
// accepts: each object's keys are known field names, case-sensitively
// (any key in defaultPerDevicePinnedMemoryLimit), none twice.
func FuzzParseGpuConfig(f *testing.F) {
	f.Add(gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30, "defaultPerDevicePinnedMemoryLimit": {"0": "1Gi"}}}}`)
	f.Add(gpuConfigHead + `, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}}`)
	f.Add(gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10, "DefaultActiveThreadPercentage": 100}}}`)
	f.Add(gpuConfigHead + `, "sharing": {"strategy": "MPS", "strategy": "TimeSlicing"}}`)
	f.Add(gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": false, "defaultPinnedDeviceMemoryLimit": "8Gi"}}}`)
	f.Fuzz(func(t *testing.T, raw string) {
		cfgs, err := parseConfigs(testDriver, []resourceapi.DeviceAllocationConfiguration{opaque(testDriver, raw, false)})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "claim spec.devices.config[0].opaque.parameters") {
				t.Fatalf("error without the field: %v", err)
			}
			return
		}
		if bad := strictProblem(raw); bad != "" {
			t.Fatalf("accepted %q: %s", raw, bad)
		}
		s, err := sharingFor(cfgs, "gpu", "GPU-aaaaaaaa", false)
		if err != nil || s.MPS == nil {
			return
		}
		if p := s.MPS.ActiveThreadPercentage; p < 1 || p > 100 {
			t.Fatalf("accepted thread percentage %d", p)
		}
	})
}

// gpuConfigFields are GpuConfig's field names by the object they are in.
var gpuConfigFields = map[string][]string{
	"":                                  {"apiVersion", "kind", "sharing"},
	"sharing":                           {"strategy", "timeSlicingConfig", "mpsConfig"},
	"timeSlicingConfig":                 {"interval"},
	"mpsConfig":                         {"defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit", "multiUser"},
	"defaultPerDevicePinnedMemoryLimit": nil, // any key
}

// strictProblem says what in raw a strict decoder refuses (a key unknown
// in its object, case-sensitively, or given twice), or "": an oracle
// written apart from the decoder, on encoding/json's token stream.
func strictProblem(raw string) string {
	dec := json.NewDecoder(strings.NewReader(raw))
	var walk func(object string) string
	walk = func(object string) string {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return ""
				}
				key, _ := k.(string)
				known, listed := gpuConfigFields[object]
				if seen[key] {
					return "key " + key + " twice"
				}
				seen[key] = true
				if !listed || known != nil && !slices.Contains(known, key) {
					return "unknown key " + key + " in " + object
				}
				if bad := walk(key); bad != "" {
					return bad
				}
			}
			_, _ = dec.Token()
		case json.Delim('['):
			for dec.More() {
				if bad := walk("[]"); bad != "" {
					return bad
				}
			}
			_, _ = dec.Token()
		}
		return ""
	}
	return walk("")
}

// mpsClaim creates a claim of device allocated with the configuration
// raw (for every request).
func (e *testEnv) mpsClaim(t testing.TB, name, uid, raw string, devices ...string) *resourceapi.ResourceClaim {
	t.Helper()
	c := e.claim(t, name, uid, false, devices...)
	c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{opaque(testDriver, raw, false)}
	if _, err := e.client.ResourceV1().ResourceClaims("ml").Update(t.Context(), c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// writeReady writes the ready file nri-gpu mps writes for daemon d of
// GPU uuid.
func writeReady(t *testing.T, uuid string, d *sharing.MPSDaemon) {
	t.Helper()
	dir := filepath.Dir(d.PipeDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(mps.Ready{Version: mps.ReadyVersion, UUID: uuid, MPSLimits: d.MPSLimits, PID: os.Getpid(), Started: time.Now()})
	if err := os.WriteFile(filepath.Join(dir, mps.ReadyFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPrepareMPS: a claim with GpuConfig MPS is kept prepared, with its
// daemon's directories and limits in the checkpoint (what nri-gpu mps
// supervises), but its prepare fails, naming the daemon, until the
// daemon is reported ready with those limits; then it is prepared, and
// the request path sees the daemon ready. A restarted driver reads it
// back. Unprepared, no daemon is needed.
func TestPrepareMPS(t *testing.T) {
	defer func(w time.Duration) { mpsWait = w }(mpsWait)
	mpsWait = 300 * time.Millisecond
	root := t.TempDir()
	opts := Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"),
		RegistrationDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev", MPSRoot: filepath.Join(root, "mps")}
	e := newEnv(t, draConfig(), testSnapshot(), &opts)
	raw := gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "8Gi"}}}`
	c := e.mpsClaim(t, "infer", "uid-mps", raw, "gpu-0")
	r := e.prepare(t, c)
	for _, w := range []string{"prepare claim ml/infer", "device gpu-0 (GPU-aaaaaaaa): its MPS control daemon is not ready", "nri-gpu mps reports no running MPS control daemon", "the claim stays prepared"} {
		if !strings.Contains(r.GetError(), w) {
			t.Errorf("prepare before the daemon: %q lacks %q", r.GetError(), w)
		}
	}
	p, err := ReadPrepared(opts.PluginDir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*sharing.MPSDaemon{"GPU-aaaaaaaa": {PipeDir: filepath.Join(root, "mps", "GPU-aaaaaaaa", "pipe"), LogDir: filepath.Join(root, "mps", "GPU-aaaaaaaa", "log"),
		ShmDir: filepath.Join(root, "mps", "shm"), MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: 50, PinnedMemoryMiB: 8192}}}
	if diff := cmp.Diff(want, MPSDaemons(p)); diff != "" {
		t.Fatalf("the checkpoint's MPS daemons (-want +got):\n%s", diff)
	}
	// A daemon with other limits (an earlier claim's) is not this one.
	other := *want["GPU-aaaaaaaa"]
	other.ActiveThreadPercentage = 100
	writeReady(t, "GPU-aaaaaaaa", &other)
	if r := e.prepare(t, c); !strings.Contains(r.GetError(), "holds clients to 100% of the threads") {
		t.Errorf("prepare with a daemon of other limits: %q", r.GetError())
	}
	writeReady(t, "GPU-aaaaaaaa", want["GPU-aaaaaaaa"])
	if r := e.prepare(t, c); r.GetError() != "" || len(r.GetDevices()) != 1 {
		t.Fatalf("prepare with the daemon ready: %v", r)
	}
	devs := e.d.Prepared().Devices()
	if len(devs) != 1 || devs[0].Sharing != StrategyMPS || devs[0].MPS == nil || !devs[0].MPS.Ready || devs[0].MPS.ActiveThreadPercentage != 50 || devs[0].MPS.PinnedMemoryMiB != 8192 {
		t.Fatalf("the request path's view: %+v", devs)
	}
	e.stop()
	e2 := newEnv(t, draConfig(), testSnapshot(), &opts)
	c = e2.mpsClaim(t, "infer", "uid-mps", raw, "gpu-0")
	if r := e2.prepare(t, c); r.GetError() != "" {
		t.Errorf("prepare after a restart: %v", r)
	}
	e2.unprepare(t, c)
	p, _ = ReadPrepared(opts.PluginDir)
	if n := len(MPSDaemons(p)); n != 0 {
		t.Errorf("%d MPS daemons needed after unprepare", n)
	}
}

// TestPrepareMPSRefusals: what nri-gpu's MPS cannot serve is refused
// with the reason, nothing prepared: MPS on two devices (two MIG devices
// too); a bad GpuConfig names its field.
func TestPrepareMPSRefusals(t *testing.T) {
	e := newEnv(t, draConfig(), testSnapshot(), nil)
	mpsRaw := gpuConfigHead + `, "sharing": {"strategy": "MPS"}}`
	for _, tc := range []struct {
		name, raw string
		devices   []string
		want      string
	}{
		{"two devices", mpsRaw, []string{"gpu-0", "gpu-2"}, "sharing strategy MPS on 2 devices ([gpu-0 gpu-2])"},
		{"two MIG devices", mpsRaw, []string{"gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-5"},
			"sharing strategy MPS on 2 devices ([gpu-1-mig-1g10gb-19-4 gpu-1-mig-1g10gb-19-5]): nri-gpu's MPS control daemons serve one GPU or MIG device each"},
		{"bad strategy", gpuConfigHead + `, "sharing": {"strategy": "Spatial"}}`, []string{"gpu-0"}, `claim spec.devices.config[0].opaque.parameters.sharing.strategy: "Spatial" is not a sharing strategy (valid: TimeSlicing, MPS)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.mpsClaim(t, "c-"+strings.ReplaceAll(tc.name, " ", "-"), "uid-"+strings.ReplaceAll(tc.name, " ", "-"), tc.raw, tc.devices...)
			if r := e.prepare(t, c); !strings.Contains(r.GetError(), tc.want) {
				t.Errorf("prepare: %q, want %q", r.GetError(), tc.want)
			}
		})
	}
	if n := e.d.Prepared().Len(); n != 0 {
		t.Errorf("%d devices prepared", n)
	}
	// TimeSlicing is accepted, and recorded.
	c := e.mpsClaim(t, "ts", "uid-ts", gpuConfigHead+`, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}}`, "gpu-0")
	if r := e.prepare(t, c); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if devs := e.d.Prepared().Devices(); len(devs) != 1 || devs[0].Sharing != StrategyTimeSlicing || devs[0].MPS != nil {
		t.Errorf("a TimeSlicing claim: %+v", devs)
	}
}

// TestPrepareMPSMIG: a claim with GpuConfig MPS on a MIG device gets a
// daemon of its own keyed by the MIG device's UUID in the checkpoint
// (directories <mpsRoot>/MIG-<uuid>/, the claim's limits: what nri-gpu
// mps supervises), and is prepared once that daemon is reported ready;
// claims on two MIG devices of one GPU get two distinct daemons, neither
// of them the GPU's, and each is ready on its own.
func TestPrepareMPSMIG(t *testing.T) {
	defer func(w time.Duration) { mpsWait = w }(mpsWait)
	mpsWait = 300 * time.Millisecond
	root := t.TempDir()
	opts := Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"),
		RegistrationDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev", MPSRoot: filepath.Join(root, "mps")}
	e := newEnv(t, draConfig(), testSnapshot(), &opts)
	a := e.mpsClaim(t, "infer-a", "uid-a", gpuConfigHead+`, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "4Gi"}}}`, "gpu-1-mig-1g10gb-19-4")
	b := e.mpsClaim(t, "infer-b", "uid-b", gpuConfigHead+`, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25, "defaultPerDevicePinnedMemoryLimit": {"MIG-nnnnnnnn": "2Gi"}}}}`, "gpu-1-mig-1g10gb-19-5")
	if r := e.prepare(t, a); !strings.Contains(r.GetError(), "device gpu-1-mig-1g10gb-19-4 (MIG-mmmmmmmm): its MPS control daemon is not ready") {
		t.Errorf("prepare of a before its daemon: %q", r.GetError())
	}
	if r := e.prepare(t, b); !strings.Contains(r.GetError(), "device gpu-1-mig-1g10gb-19-5 (MIG-nnnnnnnn): its MPS control daemon is not ready") {
		t.Errorf("prepare of b before its daemon: %q", r.GetError())
	}
	p, err := ReadPrepared(opts.PluginDir)
	if err != nil {
		t.Fatal(err)
	}
	daemon := func(uuid string, lim sharing.MPSLimits) *sharing.MPSDaemon {
		return &sharing.MPSDaemon{PipeDir: filepath.Join(root, "mps", uuid, "pipe"), LogDir: filepath.Join(root, "mps", uuid, "log"), ShmDir: filepath.Join(root, "mps", "shm"), MPSLimits: lim}
	}
	want := map[string]*sharing.MPSDaemon{
		"MIG-mmmmmmmm": daemon("MIG-mmmmmmmm", sharing.MPSLimits{ActiveThreadPercentage: 50, PinnedMemoryMiB: 4096}),
		"MIG-nnnnnnnn": daemon("MIG-nnnnnnnn", sharing.MPSLimits{ActiveThreadPercentage: 25, PinnedMemoryMiB: 2048}),
	}
	if diff := cmp.Diff(want, MPSDaemons(p)); diff != "" {
		t.Fatalf("the checkpoint's MPS daemons (-want +got):\n%s", diff)
	}
	// Ready one by one: a's daemon ready does not make b's.
	writeReady(t, "MIG-mmmmmmmm", want["MIG-mmmmmmmm"])
	if r := e.prepare(t, a); r.GetError() != "" || len(r.GetDevices()) != 1 {
		t.Fatalf("prepare of a with its daemon ready: %v", r)
	}
	if r := e.prepare(t, b); !strings.Contains(r.GetError(), "(MIG-nnnnnnnn): its MPS control daemon is not ready") {
		t.Errorf("prepare of b with a's daemon ready only: %q", r.GetError())
	}
	writeReady(t, "MIG-nnnnnnnn", want["MIG-nnnnnnnn"])
	if r := e.prepare(t, b); r.GetError() != "" {
		t.Fatalf("prepare of b with its daemon ready: %v", r)
	}
	got := map[string]sharing.MPSDaemon{}
	for _, dv := range e.d.Prepared().Devices() {
		if !dv.MIG || dv.Sharing != StrategyMPS || dv.MPS == nil || !dv.MPS.Ready {
			t.Errorf("the request path's view of %s: %+v", dv.Name, dv)
			continue
		}
		got[dv.UUID] = *dv.MPS
	}
	if len(got) != 2 || got["MIG-mmmmmmmm"].PipeDir == got["MIG-nnnnnnnn"].PipeDir || got["MIG-nnnnnnnn"].PipeDir != want["MIG-nnnnnnnn"].PipeDir {
		t.Errorf("the request path's daemons: %+v", got)
	}
	e.unprepare(t, a)
	p, _ = ReadPrepared(opts.PluginDir)
	if d := MPSDaemons(p); len(d) != 1 || d["MIG-nnnnnnnn"] == nil {
		t.Errorf("after unprepare of a, the daemons needed: %v", d)
	}
}

// TestCheckMPSClaim: a MIG device whose UUID is not MIG-<uuid> (an older
// driver's MIG-GPU-<uuid>/<gi>/<ci>, which would name nested directories)
// is refused MPS, naming the UUID and what is valid; so is an adminAccess
// MIG device; a MIG device of the current form is served.
func TestCheckMPSClaim(t *testing.T) {
	mig := func(uuid string, admin bool) claims.Device {
		return claims.Device{Request: "gpu", Name: "gpu-1-mig-1g10gb-19-4", UUID: uuid, MIG: true, AdminAccess: admin, MPS: &sharing.MPSDaemon{}}
	}
	for _, tc := range []struct {
		dev  claims.Device
		want string
	}{
		{mig("MIG-GPU-bbbbbbbb/7/0", false), `request gpu: device gpu-1-mig-1g10gb-19-4 is a MIG device whose UUID "MIG-GPU-bbbbbbbb/7/0" is not of the form MIG-<uuid>`},
		{mig("MIG-mmmmmmmm", true), "request gpu: device gpu-1-mig-1g10gb-19-4 is an adminAccess device, which holds nothing: sharing strategy MPS does not apply to it"},
		{mig("MIG-mmmmmmmm", false), ""},
	} {
		err := checkMPSClaim([]claims.Device{tc.dev})
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.dev.UUID, err, tc.want)
		}
	}
}
