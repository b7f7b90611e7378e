package dra

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// h100MiB is the memory of testSnapshot's H100s (85520809984 bytes).
const h100MiB = 81559

// TestShareableSlices: only the GPUs dra.memoryShares names are published
// with allowMultipleAllocations and a memory request policy whose default
// is the whole memory, from the minimum up in MiB steps; MIG devices and
// other GPUs are as without it. An API server that drops the fields (no
// DRAConsumableCapacity) gets them published whole again.
func TestShareableSlices(t *testing.T) {
	cfg := draConfig()
	cfg.DRA.MemoryShares.Devices = []string{"0", "1"} // GPU 1 is in MIG mode: its MIG devices are not shared
	cfg.DRA.MemoryShares.Minimum = "2Gi"
	st := stateOf(testSnapshot(), cfg)
	d := &Driver{nodeName: testNode, roots: map[string]string{}, log: quietLog().WithField("test", t.Name())}
	devs := d.resources(st).Pools[testNode].Slices[0].Devices
	whole := resource.MustParse("85520809984")
	want := resourceapi.DeviceCapacity{Value: *resourceQuantity(85520809984), RequestPolicy: &resourceapi.CapacityRequestPolicy{
		Default:    &whole,
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resourceQuantity(2 << 30), Step: resourceQuantity(1 << 20)}}}
	if diff := cmp.Diff(want, devs[0].Capacity[MemoryCapacity], cmpQuantity()); diff != "" {
		t.Errorf("gpu-0's memory (-want +got):\n%s", diff)
	}
	if devs[0].AllowMultipleAllocations == nil || !*devs[0].AllowMultipleAllocations {
		t.Errorf("gpu-0: allowMultipleAllocations %v", devs[0].AllowMultipleAllocations)
	}
	for _, dv := range devs[1:] {
		if dv.AllowMultipleAllocations != nil || dv.Capacity[MemoryCapacity].RequestPolicy != nil {
			t.Errorf("%s is published shareable", dv.Name)
		}
	}
	// The API server without the gate drops the fields: published whole.
	actual := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: devs}}
	actual = actual.DeepCopy()
	for i := range actual.Spec.Devices {
		actual.Spec.Devices[i].AllowMultipleAllocations = nil
	}
	d.HandleError(context.Background(), &resourceslice.DroppedFieldsError{PoolName: testNode,
		DesiredSlice: &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: devs}}, ActualSlice: actual}, "publish")
	if !d.noShares.Load() {
		t.Fatal("the dropped fields were not taken as a missing DRAConsumableCapacity")
	}
	again := d.resources(st).Pools[testNode].Slices[0].Devices
	if again[0].AllowMultipleAllocations != nil || again[0].Capacity[MemoryCapacity].RequestPolicy != nil {
		t.Errorf("gpu-0 is still published shareable: %+v", again[0])
	}
	// A GPU whose memory is not a whole number of MiB gets no step; one
	// no larger than the minimum is not shareable.
	snap := testSnapshot()
	odd := *snap.GPUs[0].Props
	odd.MemoryBytes = 85520809984 + 512
	snap.GPUs[0].Props = &odd
	d = &Driver{nodeName: testNode, roots: map[string]string{}, log: quietLog().WithField("test", t.Name())}
	if p := d.resources(stateOf(snap, cfg)).Pools[testNode].Slices[0].Devices[0].Capacity[MemoryCapacity].RequestPolicy; p == nil || p.ValidRange.Step != nil {
		t.Errorf("odd memory: policy %+v, want a range without a step", p)
	}
	cfg.DRA.MemoryShares.Minimum = "80Gi"
	if dv := d.resources(stateOf(testSnapshot(), cfg)).Pools[testNode].Slices[0].Devices[0]; dv.AllowMultipleAllocations != nil {
		t.Error("a GPU no larger than the minimum share is published shareable")
	}
}

func cmpQuantity() cmp.Option {
	return cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })
}

// TestShareOf: an allocation's share ID and consumed memory become the
// claim's share; a share the node does not publish, or a consumed memory
// that is missing, too small or larger than the GPU, fails the claim,
// naming the field and the value.
func TestShareOf(t *testing.T) {
	st := stateOf(testSnapshot(), draConfig())
	u := units(st)[0]
	id := types.UID("share-1")
	res := func(consumed map[resourceapi.QualifiedName]resource.Quantity) resourceapi.DeviceRequestAllocationResult {
		return resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: testDriver, Pool: testNode, Device: "gpu-0", ShareID: &id, ConsumedCapacity: consumed}
	}
	mem := func(q string) map[resourceapi.QualifiedName]resource.Quantity {
		return map[resourceapi.QualifiedName]resource.Quantity{MemoryCapacity: resource.MustParse(q)}
	}
	for _, tc := range []struct {
		name      string
		r         resourceapi.DeviceRequestAllocationResult
		shareable bool
		want      claims.Share
		err       string
	}{
		{"no share", resourceapi.DeviceRequestAllocationResult{Device: "gpu-0"}, true, claims.Share{}, ""},
		{"20Gi", res(mem("20Gi")), true, claims.Share{ID: "share-1", MemoryMiB: 20480, GPUMemoryMiB: h100MiB}, ""},
		{"rounded down to MiB", res(mem("1073741825")), true, claims.Share{ID: "share-1", MemoryMiB: 1024, GPUMemoryMiB: h100MiB}, ""},
		{"whole", res(mem("85520809984")), true, claims.Share{ID: "share-1", MemoryMiB: h100MiB, GPUMemoryMiB: h100MiB}, ""},
		{"not shareable", res(mem("20Gi")), false, claims.Share{}, `status.allocation.devices.results[request gpu, device gpu-0].shareID "share-1": device gpu-0 is not published shareable by memory on this node now`},
		{"no memory", res(map[resourceapi.QualifiedName]resource.Quantity{"gpu.nvidia.com/other": resource.MustParse("1")}), true, claims.Share{},
			`.consumedCapacity: no gpu.nvidia.com/memory (it has [gpu.nvidia.com/other])`},
		{"nothing consumed", res(nil), true, claims.Share{}, `.consumedCapacity: no gpu.nvidia.com/memory (it has none)`},
		{"too small", res(mem("1Ki")), true, claims.Share{}, `.consumedCapacity[gpu.nvidia.com/memory]: 1Ki is not a memory size of at least 1Mi`},
		{"negative", res(mem("-20Gi")), true, claims.Share{}, `-20Gi is not a memory size of at least 1Mi`},
		{"too large", res(mem("100Gi")), true, claims.Share{}, `.consumedCapacity[gpu.nvidia.com/memory]: 100Gi is more than the GPU's memory (81559Mi)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := shareOf(tc.r, u, tc.shareable)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("share (-want +got):\n%s", diff)
			}
		})
	}
}

// TestThreadPercentage: a share's thread percentage is its part of the
// memory, rounded up, from 1 to 100.
func TestThreadPercentage(t *testing.T) {
	for _, tc := range []struct {
		mem, total uint64
		want       int
	}{{20480, 81920, 25}, {20480, h100MiB, 26}, {1, h100MiB, 1}, {h100MiB, h100MiB, 100}, {40960, 40960, 100}, {1024, 0, 100}} {
		if got := (claims.Share{ID: "x", MemoryMiB: tc.mem, GPUMemoryMiB: tc.total}).ThreadPercentage(); got != tc.want {
			t.Errorf("%d of %d MiB: %d %%, want %d", tc.mem, tc.total, got, tc.want)
		}
	}
}

// shareClaim creates a claim allocated a share of gpu-0 of the memory q,
// with the GpuConfig raw ("" for none).
func (e *testEnv) shareClaim(t *testing.T, name, uid, share, q, raw string) *resourceapi.ResourceClaim {
	t.Helper()
	return e.shareClaimIn(t, "ml", name, uid, share, q, raw)
}

// shareClaimIn is shareClaim in namespace ns.
func (e *testEnv) shareClaimIn(t *testing.T, ns, name, uid, share, q, raw string) *resourceapi.ResourceClaim {
	t.Helper()
	id := types.UID(share)
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: testDriver, Pool: testNode, Device: "gpu-0", ShareID: &id,
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{MemoryCapacity: resource.MustParse(q)}}}}}
	if raw != "" {
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{opaque(testDriver, raw, false)}
	}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// mpsRaw is a GpuConfig with sharing strategy MPS.
const mpsRaw = gpuConfigHead + `, "sharing": {"strategy": "MPS"}}`

// TestPrepareShares: two claims' shares of gpu-0 (GpuConfig MPS) are
// prepared side by side, each answered with its share ID, with client
// limits sized from its share (memory; threads proportional, rounded up)
// and one MPS daemon for the GPU whose own defaults are the whole GPU;
// kept in the checkpoint with their memory. A third that does not fit
// beside them is refused naming them while they exist, and prepared once
// one is deleted (its stale share released). A whole-GPU claim is refused
// beside the shares.
func TestPrepareShares(t *testing.T) {
	defer func(w time.Duration) { mpsWait = w }(mpsWait)
	mpsWait = 300 * time.Millisecond
	cfg := draConfig()
	cfg.DRA.MemoryShares.Devices = []string{"0"}
	root := t.TempDir()
	opts := Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"),
		RegistrationDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev", MPSRoot: filepath.Join(root, "mps")}
	var told atomic.Pointer[claims.Prepared]
	opts.Book = func(p *claims.Prepared, _ string) error { told.Store(p); return nil }
	e := newEnv(t, cfg, testSnapshot(), &opts)
	daemon := &sharing.MPSDaemon{PipeDir: filepath.Join(root, "mps", "GPU-aaaaaaaa", "pipe"), LogDir: filepath.Join(root, "mps", "GPU-aaaaaaaa", "log"),
		ShmDir: filepath.Join(root, "mps", "shm"), MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: 100}}
	writeReady(t, "GPU-aaaaaaaa", daemon)
	a := e.shareClaim(t, "a", "uid-a", "share-a", "40Gi", mpsRaw)
	b := e.shareClaim(t, "b", "uid-b", "share-b", "30Gi", gpuConfigHead+`, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}}}`)
	kind := "k8s.gpu.nri-gpu.dev/claim"
	for _, c := range []struct {
		claim *resourceapi.ResourceClaim
		share string
	}{{a, "share-a"}, {b, "share-b"}} {
		want := &drapb.NodePrepareResourceResponse{Devices: []*drapb.Device{{RequestNames: []string{"gpu"}, PoolName: testNode, DeviceName: "gpu-0",
			CdiDeviceIds: []string{kind + "=" + string(c.claim.UID) + "-gpu-0"}, ShareId: &c.share}}}
		if diff := cmp.Diff(want, e.prepare(t, c.claim), protoCmp()); diff != "" {
			t.Fatalf("prepare %s (-want +got):\n%s", c.claim.Name, diff)
		}
	}
	type view struct {
		Share           claims.Share
		Threads, MemMiB int
	}
	views := func(p *claims.Prepared) map[string]view {
		out := map[string]view{}
		for _, dv := range p.Devices() {
			v := view{Share: dv.Share}
			if dv.MPS != nil {
				v.Threads, v.MemMiB = dv.MPS.ActiveThreadPercentage, int(dv.MPS.PinnedMemoryMiB)
			}
			out[dv.Claim.Name] = v
		}
		return out
	}
	// a: 40960 of 81559 MiB, 51 % of the threads; b: its mpsConfig's 20 %,
	// lower than its share's 38 %.
	want := map[string]view{"a": {claims.Share{ID: "share-a", MemoryMiB: 40960, GPUMemoryMiB: h100MiB}, 51, 40960},
		"b": {claims.Share{ID: "share-b", MemoryMiB: 30720, GPUMemoryMiB: h100MiB}, 20, 30720}}
	if diff := cmp.Diff(want, views(e.d.Prepared())); diff != "" {
		t.Errorf("prepared shares (-want +got):\n%s", diff)
	}
	// The request path was told both with the daemon ready (the second
	// claim changed no daemon's status).
	for _, dv := range told.Load().Devices() {
		if dv.MPS == nil || !dv.MPS.Ready {
			t.Errorf("claim %s: the request path was told its daemon is not ready: %+v", dv.Claim.Name, dv.MPS)
		}
	}
	back, err := ReadPrepared(opts.PluginDir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, views(back)); diff != "" {
		t.Errorf("shares read back from the checkpoint (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]*sharing.MPSDaemon{"GPU-aaaaaaaa": daemon}, MPSDaemons(back)); diff != "" {
		t.Errorf("the GPU's MPS daemon: its defaults are the whole GPU (-want +got):\n%s", diff)
	}
	// 40 + 30 + 20 GiB is more than the H100's 79.6 GiB.
	c := e.shareClaim(t, "c", "uid-c", "share-c", "20Gi", mpsRaw)
	r := e.prepare(t, c)
	if w := "device gpu-0: a share of 20480Mi does not fit: 71680Mi of its 81559Mi are prepared for claims ml/a (40960Mi), ml/b (30720Mi), which still hold them"; !strings.Contains(r.GetError(), w) {
		t.Fatalf("prepare c: %v, want %q", r, w)
	}
	if err := e.client.ResourceV1().ResourceClaims("ml").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := e.prepare(t, c); r.GetError() != "" {
		t.Fatalf("prepare c after a was deleted: %v", r)
	}
	if got := slices.Sorted(maps.Keys(views(e.d.Prepared()))); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("prepared claims %v, want b, c", got)
	}
	if e.spec(t, "uid-a") != nil {
		t.Error("the stale share's CDI spec is still there")
	}
	// A whole-GPU claim beside the shares is refused as before.
	whole := e.claim(t, "whole", "uid-w", false, "gpu-0")
	if r := e.prepare(t, whole); !strings.Contains(r.GetError(), "which still holds it") {
		t.Errorf("a whole claim of a shared GPU: %v", r)
	}
}

// TestShareWithoutMPS: a share of a GPU's memory without sharing strategy
// MPS is refused, naming the setting, nothing prepared; a claim of the
// whole memory (none requested: the policy's default) needs no MPS.
func TestShareWithoutMPS(t *testing.T) {
	cfg := draConfig()
	cfg.DRA.MemoryShares.Devices = []string{"0"}
	e := newEnv(t, cfg, testSnapshot(), nil)
	for _, tc := range []struct{ name, raw, want string }{
		{"no config", "", "request gpu: device gpu-0: the claim has a share of 20480Mi of the GPU's 81559Mi (dra.memoryShares), with no sharing strategy: " +
			"nri-gpu holds a container to a memory share through MPS only, and gives no share unheld; set sharing.strategy: MPS in an opaque config of driver gpu.nri-gpu.dev " +
			"(apiVersion resource.nvidia.com/v1beta1, kind GpuConfig)"},
		{"time-slicing", gpuConfigHead + `, "sharing": {"strategy": "TimeSlicing"}}`, "with sharing strategy TimeSlicing: nri-gpu holds a container to a memory share through MPS only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.shareClaim(t, "c-"+strings.ReplaceAll(tc.name, " ", "-"), "uid-"+strings.ReplaceAll(tc.name, " ", "-"), "share-x", "20Gi", tc.raw)
			if r := e.prepare(t, c); !strings.Contains(r.GetError(), tc.want) {
				t.Errorf("prepare: %q, want %q", r.GetError(), tc.want)
			}
		})
	}
	if n := e.d.Prepared().Len(); n != 0 {
		t.Errorf("%d devices prepared", n)
	}
	w := e.shareClaim(t, "whole", "uid-whole", "share-w", "85520809984", "")
	if r := e.prepare(t, w); r.GetError() != "" {
		t.Fatalf("a share of the whole memory: %v", r)
	}
	if devs := e.d.Prepared().Devices(); len(devs) != 1 || devs[0].Share.Partial() || devs[0].MPS != nil {
		t.Errorf("the whole share: %+v", devs)
	}
}

// TestSharesOneNamespace: a GPU's memory is shared between claims of one
// namespace: a share of another namespace's claim beside them is refused,
// without naming that namespace, until their shares are released (a
// deleted claim's share goes at once); dra.memoryShares.acrossNamespaces
// lets it in.
func TestSharesOneNamespace(t *testing.T) {
	for _, across := range []bool{false, true} {
		cfg := draConfig()
		cfg.DRA.MemoryShares.Devices = []string{"0"}
		cfg.DRA.MemoryShares.AcrossNamespaces = across
		root := t.TempDir()
		opts := Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"),
			RegistrationDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev", MPSRoot: filepath.Join(root, "mps")}
		e := newEnv(t, cfg, testSnapshot(), &opts)
		writeReady(t, "GPU-aaaaaaaa", &sharing.MPSDaemon{PipeDir: filepath.Join(root, "mps", "GPU-aaaaaaaa", "pipe"), MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: 100}})
		a := e.shareClaim(t, "a", "uid-a", "share-a", "20Gi", mpsRaw)
		if r := e.prepare(t, a); r.GetError() != "" {
			t.Fatal(r.GetError())
		}
		b := e.shareClaim(t, "b", "uid-b", "share-b", "20Gi", mpsRaw)
		if r := e.prepare(t, b); r.GetError() != "" {
			t.Fatalf("a share of the same namespace: %s", r.GetError())
		}
		x := e.shareClaimIn(t, "other", "x", "uid-x", "share-x", "20Gi", mpsRaw)
		r := e.prepare(t, x)
		if across {
			if r.GetError() != "" {
				t.Errorf("acrossNamespaces: a share of another namespace: %s", r.GetError())
			}
			continue
		}
		if !strings.Contains(r.GetError(), "prepare claim other/x: device gpu-0: its memory is shared with a claim of another namespace") || strings.Contains(r.GetError(), "ml") {
			t.Errorf("a share of another namespace: %v", r)
		}
		if e.spec(t, "uid-x") != nil || strings.Contains(checkpointText(t, e), "uid-x") {
			t.Error("the refused share was written")
		}
		// Once the shares of ml are gone (one deleted while prepared, one
		// unprepared), the other namespace's share is prepared.
		e.unprepare(t, a)
		if err := e.client.ResourceV1().ResourceClaims("ml").Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if r := e.prepare(t, x); r.GetError() != "" {
			t.Errorf("a share of another namespace once the GPU's shares went: %s", r.GetError())
		}
		if strings.Contains(checkpointText(t, e), "uid-b") || e.spec(t, "uid-b") != nil {
			t.Error("the deleted claim's share stayed")
		}
	}
}
