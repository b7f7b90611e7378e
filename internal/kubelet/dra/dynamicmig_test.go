package dra

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory/nvml"
	"github.com/nri-gpu/nri-gpu/test/simnode"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// dynEnv is a Driver over a simulated node, discovered as nri-gpu run
// discovers it: GPU 0 in MIG mode with no MIG device, in dra.dynamicMIG
// (an H100, which the driver's start takes out of MIG mode, or the model
// newDynEnvOf is given); GPU 1 in MIG mode with one 1g.10gb an operator
// made (GPU instance 7); NVML the simulated library through the real
// binding.
type dynEnv struct {
	sim    *simnode.Node
	n      *node.Node
	mk     nvml.MIGMaker
	opts   Options
	client *fake.Clientset
	d      *Driver
}

func newDynEnv(t testing.TB) *dynEnv { return newDynEnvOf(t, "") }

// newDynEnvOf is newDynEnv with GPU 0 of model ("": simnode's default,
// an H100).
func newDynEnvOf(t testing.TB, model string) *dynEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: NVML creates GPU instances for root only, and the nvidia-caps nodes are made with mknod; CI runs as root")
	}
	opts := simnode.Options{NumGPUs: 2, DeviceNodes: true}
	if model != "" {
		opts.GPUs = []simnode.GPU{{BusID: "0000:1b:00.0", Model: model}, {BusID: "0000:1c:00.0"}}
	}
	sim, err := simnode.Generate(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	g0 := simnode.NVMLGPU{MIGMode: 1}
	if model == simnode.A100Model {
		g0.MemoryMiB = 40960 // an A100 40GB's (its profiles' names follow it)
	}
	if err := sim.SetMIG(simnode.NVMLState{GPUs: []simnode.NVMLGPU{g0, {MIGMode: 1, MIG: []simnode.MIG{simnode.H100MIG(7, 0, 1)}}}}); err != nil {
		t.Fatal(err)
	}
	cfg := draConfig()
	cfg.HostRoot, cfg.DriverRoot, cfg.DriverRootMount = sim.Root, sim.Root, sim.Root
	cfg.DRA.DynamicMIG.Devices = []string{"0"}
	n, err := node.New(cfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	lib, err := nvml.Open(filepath.Join(sim.Root, sim.LibDir, "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Close() })
	root := t.TempDir()
	e := &dynEnv{sim: sim, n: n, mk: lib.(nvml.MIGMaker),
		client: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}}),
		opts: Options{DriverName: testDriver, NodeName: testNode, PluginDir: filepath.Join(root, "p"),
			RegistrationDir: filepath.Join(root, "r"), CDIDir: filepath.Join(root, "cdi"), DevRoot: "/dev"}}
	e.opts.MIG = e.mk
	e.start(t)
	return e
}

// start makes a Driver as nri-gpu run does at each start (New).
func (e *dynEnv) start(t testing.TB) {
	t.Helper()
	d, err := New(e.opts, e.n, e.client, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	e.d = d
}

func (e *dynEnv) claim(t testing.TB, name, uid string, devices ...string) *resourceapi.ResourceClaim {
	t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: testDriver, Pool: testNode, Device: d})
	}
	if _, err := e.client.ResourceV1().ResourceClaims("ml").Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *dynEnv) prepare(c *resourceapi.ResourceClaim) (kubeletplugin.PrepareResult, time.Duration) {
	start := time.Now()
	out, _ := e.d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	return out[c.UID], time.Since(start)
}

func (e *dynEnv) unprepare(t testing.TB, cs ...*resourceapi.ResourceClaim) {
	t.Helper()
	var objs []kubeletplugin.NamespacedObject
	for _, c := range cs {
		objs = append(objs, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID})
	}
	out, err := e.d.UnprepareResourceClaims(context.Background(), objs)
	if err != nil {
		t.Fatal(err)
	}
	for uid, err := range out {
		if err != nil {
			t.Fatalf("unprepare %s: %v", uid, err)
		}
	}
}

// instances lists the GPU instances of GPU 0 as "<gi>/<ci>".
func (e *dynEnv) instances(t *testing.T) []string {
	t.Helper()
	insts, err := e.mk.Instances(e.sim.GPUs[0].UUID)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range insts {
		out = append(out, fmt.Sprintf("%d/%d", in.GI, in.CI))
	}
	sort.Strings(out)
	return out
}

func (e *dynEnv) ledger(t *testing.T) []madeMIG {
	t.Helper()
	l, err := readLedger(e.opts.PluginDir)
	if err != nil {
		t.Fatal(err)
	}
	return l.Made
}

// migMode reports whether the node's GPU uuid is in MIG mode, as
// discovery (and NVML) has it now.
func (e *dynEnv) migMode(t *testing.T, uuid string) bool {
	t.Helper()
	for _, g := range e.n.State().Snapshot().GPUs {
		if g.UUID == uuid {
			return g.MIGEnabled
		}
	}
	t.Fatalf("no GPU %s", uuid)
	return false
}

// TestDynamicMIGPrepare: a claim of a placement on a dra.dynamicMIG GPU
// gets its MIG device made when it is prepared (MIG mode switched on for
// the first, GPU and compute instance through NVML, its nvidia-caps
// nodes, the ledger, then the checkpoint and the CDI spec), a 1g.10gb and
// a 3g.40gb side by side; a restart adopts them; unprepare destroys them,
// removes their nvidia-caps nodes and, after the last, takes the GPU out
// of MIG mode, where a claim of it whole is prepared. A 4g.40gb over the
// 1g.10gb's memory slice fails in NVML and leaves nothing; a claim of
// the GPU whole beside MIG devices is refused, naming them.
func TestDynamicMIGPrepare(t *testing.T) {
	e := newDynEnv(t)
	g0 := e.sim.GPUs[0]
	// The start took the H100, in MIG mode with no MIG device, out of it
	// (as NVIDIA's driver does); it is published whole once.
	if e.migMode(t, g0.UUID) {
		t.Error("after the start, GPU 0 is in MIG mode with no MIG device")
	}
	var published []string
	for _, sl := range e.d.resources(e.n.State()).Pools[testNode].Slices {
		for _, dv := range sl.Devices {
			if dv.Name == fmt.Sprintf("gpu-%d", g0.Minor) {
				published = append(published, dv.Name)
			}
		}
	}
	if len(published) != 1 {
		t.Errorf("GPU 0 whole is published %d times, want once", len(published))
	}
	outOfMIG := e.d.resources(e.n.State())
	small := fmt.Sprintf("gpu-%d-mig-1g10gb-19-0", g0.Minor)
	half := fmt.Sprintf("gpu-%d-mig-3g40gb-9-4", g0.Minor)
	a, b := e.claim(t, "small", "uid-a", small), e.claim(t, "half", "uid-b", half)
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		if r, _ := e.prepare(c); r.Err != nil || len(r.Devices) != 1 {
			t.Fatalf("prepare %s: %+v", c.Name, r)
		}
	}
	if got := e.instances(t); !slices.Equal(got, []string{"2/0", "7/0"}) {
		t.Errorf("NVML has GPU/compute instances %v, want 2/0 and 7/0", got)
	}
	if !e.migMode(t, g0.UUID) {
		t.Error("GPU 0 has MIG devices and is not in MIG mode")
	}
	// The switch rewrites no slice: the same devices in both modes.
	if inMIG := e.d.resources(e.n.State()); !equality.Semantic.DeepEqual(outOfMIG, inMIG) {
		t.Errorf("the published devices changed with MIG mode:\n%+v\n%+v", outOfMIG, inMIG)
	}
	spec := readSpec(t, e.opts.CDIDir, "uid-b")
	gi, ci := simnode.GIMinor(g0.Minor, 2), simnode.CIMinor(g0.Minor, 2, 0)
	var nodes []string
	for _, dn := range spec.Devices[0].ContainerEdits.DeviceNodes {
		nodes = append(nodes, fmt.Sprintf("%s %d", dn.Path, dn.Minor))
	}
	want := []string{fmt.Sprintf("/dev/nvidia%d %d", g0.Minor, g0.Minor), fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d %d", gi, gi), fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d %d", ci, ci)}
	if !slices.Equal(nodes, want) {
		t.Errorf("the 3g.40gb's CDI device nodes %v, want %v", nodes, want)
	}
	for _, minor := range []int{gi, ci} {
		p := e.sim.HostPath(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor))
		if fi, err := os.Stat(p); err != nil || fi.Mode()&os.ModeCharDevice == 0 || fi.Mode().Perm() != 0o444 {
			t.Errorf("%s: %v, %v; want a character device, 0444", p, fi, err)
		}
	}
	l := e.ledger(t)
	if len(l) != 2 || l[0].Claim != "uid-a" || l[1].Claim != "uid-b" {
		t.Fatalf("ledger %+v", l)
	}
	// The request path sees the made devices as the claims'.
	if h := e.d.Prepared().Holdings(); h[l[0].UUID] != "uid-a" || h[l[1].UUID] != "uid-b" {
		t.Errorf("holdings %v, want %s for uid-a and %s for uid-b", h, l[0].UUID, l[1].UUID)
	}
	// Over the 1g.10gb: NVML refuses, nothing is left, the claim fails.
	bad := e.claim(t, "four", "uid-c", fmt.Sprintf("gpu-%d-mig-4g40gb-5-0", g0.Minor))
	if r, _ := e.prepare(bad); r.Err == nil {
		t.Error("a 4g.40gb over the 1g.10gb was prepared")
	}
	if got := e.instances(t); len(got) != 2 || len(e.ledger(t)) != 2 || readSpec(t, e.opts.CDIDir, "uid-c") != nil {
		t.Errorf("after the refusal: instances %v, ledger %v", got, e.ledger(t))
	}
	// The GPU whole beside its MIG devices (which the scheduler's
	// counters never allocate): refused, naming them; nothing changes.
	whole := e.claim(t, "whole", "uid-w", fmt.Sprintf("gpu-%d", g0.Minor))
	if r, _ := e.prepare(whole); r.Err == nil || !strings.Contains(r.Err.Error(), "still has 2 MIG devices (GPU instance 7, GPU instance 2)") {
		t.Errorf("a claim of the whole GPU beside its MIG devices: %v", r.Err)
	}
	if got := e.instances(t); len(got) != 2 || !e.migMode(t, g0.UUID) {
		t.Errorf("after the refusal of the whole GPU: instances %v, MIG mode %v", got, e.migMode(t, g0.UUID))
	}
	// A restart adopts what prepared claims hold.
	e.start(t)
	if got := e.instances(t); len(got) != 2 || len(e.ledger(t)) != 2 {
		t.Errorf("after a restart: instances %v, ledger %v", got, e.ledger(t))
	}
	if r, _ := e.prepare(a); r.Err != nil { // the kubelet asks again
		t.Errorf("prepare again: %v", r.Err)
	}
	e.unprepare(t, a)
	if got := e.instances(t); !slices.Equal(got, []string{"2/0"}) {
		t.Errorf("after unprepare of the 1g.10gb: %v", got)
	}
	if !e.migMode(t, g0.UUID) {
		t.Error("GPU 0 left MIG mode with a MIG device on it")
	}
	e.unprepare(t, b, a)
	if got := e.instances(t); len(got) != 0 || len(e.ledger(t)) != 0 {
		t.Errorf("after unprepare of both: instances %v, ledger %v", got, e.ledger(t))
	}
	if e.migMode(t, g0.UUID) {
		t.Error("after its last MIG device, GPU 0 is in MIG mode")
	}
	// Their nvidia-caps nodes went with them; GPU 1's operator-made
	// device keeps its own.
	for _, minor := range []int{gi, ci, simnode.GIMinor(g0.Minor, 7), simnode.CIMinor(g0.Minor, 7, 0)} {
		if p := e.sim.HostPath(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor)); fileExists(p) {
			t.Errorf("after unprepare: %s is left", p)
		}
	}
	if g1 := e.sim.GPUs[1]; !fileExists(e.sim.HostPath(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", simnode.CIMinor(g1.Minor, 7, 0)))) {
		t.Error("the operator's MIG device lost its nvidia-caps node")
	}
	if s := e.n.State().Snapshot(); len(s.MIG) != 1 {
		t.Errorf("the node still has %d MIG devices, want GPU 1's one", len(s.MIG))
	}
	// The GPU whole, now that no MIG device is on it: prepared as any GPU.
	r, _ := e.prepare(whole)
	if r.Err != nil || len(r.Devices) != 1 || r.Devices[0].DeviceName != fmt.Sprintf("gpu-%d", g0.Minor) {
		t.Fatalf("the whole GPU once its MIG devices are gone: %+v", r)
	}
	wspec := readSpec(t, e.opts.CDIDir, "uid-w")
	if wspec == nil || len(wspec.Devices) != 1 || len(wspec.Devices[0].ContainerEdits.DeviceNodes) != 1 ||
		wspec.Devices[0].ContainerEdits.DeviceNodes[0].Path != fmt.Sprintf("/dev/nvidia%d", g0.Minor) {
		t.Errorf("the whole GPU's CDI spec: %+v", wspec)
	}
	e.unprepare(t, whole)
	// And a MIG device again: MIG mode back on for it.
	again := e.claim(t, "again", "uid-again", small)
	if r, _ := e.prepare(again); r.Err != nil || !e.migMode(t, g0.UUID) {
		t.Fatalf("a MIG device after the whole GPU: %v, MIG mode %v", r.Err, e.migMode(t, g0.UUID))
	}
	e.unprepare(t, again)
}

// TestDynamicMIGAmpere: an A100 of dra.dynamicMIG, whose MIG mode changes
// only with a GPU reset, stays in MIG mode (the start does not touch it,
// nor its last MIG device's end), is published as its placements only,
// never whole, and a claim of it whole is refused, saying why.
func TestDynamicMIGAmpere(t *testing.T) {
	e := newDynEnvOf(t, simnode.A100Model)
	g0 := e.sim.GPUs[0]
	if !e.migMode(t, g0.UUID) {
		t.Fatal("the A100 left MIG mode at the start")
	}
	var names []string
	for _, sl := range e.d.resources(e.n.State()).Pools[testNode].Slices {
		for _, dv := range sl.Devices {
			if strings.HasPrefix(dv.Name, fmt.Sprintf("gpu-%d", g0.Minor)) {
				names = append(names, dv.Name)
			}
		}
	}
	if len(names) == 0 || slices.Contains(names, fmt.Sprintf("gpu-%d", g0.Minor)) {
		t.Errorf("the A100's published devices %v: want its placements, not the GPU whole", names)
	}
	small := e.claim(t, "small", "uid-a", fmt.Sprintf("gpu-%d-mig-1g5gb-19-0", g0.Minor))
	if r, _ := e.prepare(small); r.Err != nil {
		t.Fatalf("an A100 1g.5gb: %v", r.Err)
	}
	e.unprepare(t, small)
	if !e.migMode(t, g0.UUID) || len(e.instances(t)) != 0 {
		t.Errorf("after its last MIG device: MIG mode %v, instances %v; want MIG mode on, none", e.migMode(t, g0.UUID), e.instances(t))
	}
	whole := e.claim(t, "whole", "uid-w", fmt.Sprintf("gpu-%d", g0.Minor))
	if r, _ := e.prepare(whole); r.Err == nil || !strings.Contains(r.Err.Error(), `of architecture "Ampere", which leaves MIG mode only with a GPU reset`) {
		t.Errorf("a claim of the A100 whole: %v", r.Err)
	}
}

// TestDynamicMIGSharing: a made MIG device takes a claim's GpuConfig as
// any MIG device does. MPS: the claim is kept prepared with its made MIG
// device and a daemon keyed by that device's MIG UUID in the checkpoint
// (what nri-gpu mps starts), its prepare failing until that daemon is
// ready, then prepared; a second claim on another placement of the same
// GPU gets a second daemon of its own; unprepared, the instances go and
// no daemon is needed. TimeSlicing is prepared.
func TestDynamicMIGSharing(t *testing.T) {
	defer func(w time.Duration) { mpsWait = w }(mpsWait)
	mpsWait = 300 * time.Millisecond
	e := newDynEnv(t)
	e.opts.MPSRoot = t.TempDir()
	e.start(t)
	g0 := e.sim.GPUs[0]
	withConfig := func(name, uid, device, raw string) *resourceapi.ResourceClaim {
		c := e.claim(t, name, uid, device)
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{opaque(testDriver, raw, false)}
		if _, err := e.client.ResourceV1().ResourceClaims("ml").Update(t.Context(), c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	mpsRaw := gpuConfigHead + `, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}`
	m := withConfig("infer", "uid-mps", fmt.Sprintf("gpu-%d-mig-2g20gb-14-2", g0.Minor), mpsRaw)
	if r, _ := e.prepare(m); r.Err == nil || !strings.Contains(r.Err.Error(), "its MPS control daemon is not ready") {
		t.Fatalf("prepare with MPS before its daemon: %v", r.Err)
	}
	l := e.ledger(t)
	if got := e.instances(t); len(got) != 1 || len(l) != 1 || l[0].Claim != "uid-mps" || !strings.HasPrefix(l[0].UUID, "MIG-") {
		t.Fatalf("the claim waiting for its daemon: instances %v, ledger %+v; want its 2g.20gb kept", got, l)
	}
	made := l[0].UUID
	daemon := func(uuid string) *sharing.MPSDaemon {
		return &sharing.MPSDaemon{PipeDir: filepath.Join(e.opts.MPSRoot, uuid, "pipe"), LogDir: filepath.Join(e.opts.MPSRoot, uuid, "log"),
			ShmDir: filepath.Join(e.opts.MPSRoot, "shm"), MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: 50}}
	}
	daemons := func() map[string]*sharing.MPSDaemon {
		p, err := ReadPrepared(e.opts.PluginDir)
		if err != nil {
			t.Fatal(err)
		}
		return MPSDaemons(p)
	}
	if diff := cmp.Diff(map[string]*sharing.MPSDaemon{made: daemon(made)}, daemons()); diff != "" {
		t.Fatalf("the checkpoint's MPS daemons (-want +got):\n%s", diff)
	}
	writeReady(t, made, daemon(made))
	if r, _ := e.prepare(m); r.Err != nil || len(r.Devices) != 1 {
		t.Fatalf("prepare with its daemon ready: %+v", r)
	}
	if devs := e.d.Prepared().Devices(); len(devs) != 1 || !devs[0].MIG || devs[0].UUID != made || devs[0].MPS == nil || !devs[0].MPS.Ready || devs[0].MPS.PipeDir != daemon(made).PipeDir {
		t.Errorf("the request path's view: %+v", devs)
	}
	// Another placement of the same GPU: a daemon of its own.
	m2 := withConfig("infer2", "uid-mps2", fmt.Sprintf("gpu-%d-mig-1g10gb-19-0", g0.Minor), mpsRaw)
	if r, _ := e.prepare(m2); r.Err == nil {
		t.Fatal("the second claim was prepared before its daemon")
	}
	l = e.ledger(t)
	if len(l) != 2 || l[1].Claim != "uid-mps2" || l[1].UUID == made {
		t.Fatalf("ledger %+v", l)
	}
	if diff := cmp.Diff(map[string]*sharing.MPSDaemon{made: daemon(made), l[1].UUID: daemon(l[1].UUID)}, daemons()); diff != "" {
		t.Errorf("two claims' MPS daemons (-want +got):\n%s", diff)
	}
	e.unprepare(t, m, m2)
	if got := e.instances(t); len(got) != 0 || len(e.ledger(t)) != 0 || len(daemons()) != 0 {
		t.Errorf("after unprepare: instances %v, ledger %v, daemons %v", got, e.ledger(t), daemons())
	}
	ts := withConfig("share", "uid-ts", fmt.Sprintf("gpu-%d-mig-2g20gb-14-2", g0.Minor), gpuConfigHead+`, "sharing": {"strategy": "TimeSlicing"}}`)
	if r, _ := e.prepare(ts); r.Err != nil {
		t.Fatalf("prepare with TimeSlicing: %v", r.Err)
	}
	if devs := e.d.Prepared().Devices(); len(devs) != 1 || !devs[0].MIG || devs[0].Sharing != StrategyTimeSlicing {
		t.Errorf("the request path's view: %+v", devs)
	}
	e.unprepare(t, ts)
	if got := e.instances(t); len(got) != 0 {
		t.Errorf("after unprepare: %v", got)
	}
}

// TestDynamicMIGCrash: what a crash leaves is cleaned up at the next
// start: an instance made and not recorded (a crash between NVML's create
// and the ledger), and one recorded for a claim the checkpoint does not
// have (a crash before the claim's record); GPU 1's MIG device, which an
// operator made on a GPU not in dra.dynamicMIG, stays. A GPU left in MIG
// mode with nothing on it (a crash between switching and making) leaves
// it at the next start.
func TestDynamicMIGCrash(t *testing.T) {
	e := newDynEnv(t)
	g0 := e.sim.GPUs[0]
	if err := e.mk.SetMIGMode(g0.UUID, true); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	if e.migMode(t, g0.UUID) {
		t.Error("a start left GPU 0 in MIG mode with no MIG device")
	}
	if err := e.mk.SetMIGMode(g0.UUID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mk.CreateMIG(g0.UUID, 19, nvml.Range{Start: 3, Size: 1}); err != nil {
		t.Fatal(err)
	}
	in, err := e.mk.CreateMIG(g0.UUID, 14, nvml.Range{Start: 4, Size: 2})
	if err != nil {
		t.Fatal(err)
	}
	// And a record of a GPU not in dra.dynamicMIG now: kept for when it is.
	other := madeMIG{GPU: e.sim.GPUs[1].UUID, GI: 3, CI: 0, ProfileID: 14, Start: 0, Size: 2, UUID: "MIG-other", Claim: "uid-other"}
	l := ledger{Made: []madeMIG{{GPU: g0.UUID, GI: in.GI, CI: in.CI, ProfileID: 14, Start: 4, Size: 2, UUID: in.UUID, Claim: "uid-gone"}, other}}
	if err := l.write(e.opts.PluginDir); err != nil {
		t.Fatal(err)
	}
	kept := e.claim(t, "kept", "uid-k", fmt.Sprintf("gpu-%d-mig-1g10gb-19-0", g0.Minor))
	if r, _ := e.prepare(kept); r.Err != nil {
		t.Fatal(r.Err)
	}
	// Both leftovers block nothing of the kept claim's; the next start
	// finds them.
	e.start(t)
	if got := e.instances(t); !slices.Equal(got, []string{"7/0"}) {
		t.Errorf("after the restart: instances %v, want the kept claim's 7/0 only", got)
	}
	if l := e.ledger(t); len(l) != 2 || l[0].Claim != "uid-k" || l[1] != other {
		t.Errorf("ledger %+v, want the kept claim's and the other GPU's", l)
	}
	if s := e.n.State().Snapshot(); len(s.MIG) != 2 {
		t.Errorf("the node has %d MIG devices, want the kept claim's and GPU 1's", len(s.MIG))
	}
}

// BenchmarkPrepareMIG prepares (and unprepares) a claim of a MIG device
// made on demand (NVML's creations, the ledger, the rediscovery, the
// nodes, the checkpoint and the spec; destroyed at unprepare) and one of
// a MIG device that exists, on the same simulated node, side by side
// (docs/benchmarks.md). Root, as the tests of MIG made on demand.
func BenchmarkPrepareMIG(b *testing.B) {
	e := newDynEnv(b)
	n := 0 // claim names, unique across -count's runs
	for _, c := range []struct {
		name string
		gpu  simnode.GPU
	}{{"made-on-demand", e.sim.GPUs[0]}, {"existing", e.sim.GPUs[1]}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				n++
				cl := e.claim(b, fmt.Sprintf("%s-%d", c.name, n), fmt.Sprintf("uid-%s-%d", c.name, n), fmt.Sprintf("gpu-%d-mig-1g10gb-19-0", c.gpu.Minor))
				if r, _ := e.prepare(cl); r.Err != nil {
					b.Fatal(r.Err)
				}
				e.unprepare(b, cl)
			}
		})
	}
}

// readSpec reads the CDI spec of claim uid; nil without one.
func readSpec(t *testing.T, dir, uid string) *specs.Spec {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, specFile(testDriver, uid)))
	if err != nil {
		return nil
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// TestWarnWithoutSysAdmin: without CAP_SYS_ADMIN (dropped from this
// thread's effective set) nri-gpu's start says that MIG devices made on
// demand will fail, and what grants it; with it, nothing is said.
func TestWarnWithoutSysAdmin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the capability is dropped from a root thread and raised again")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var out bytes.Buffer
	log := logrus.New()
	log.SetOutput(&out)
	warnWithoutSysAdmin(log)
	if out.Len() != 0 {
		t.Errorf("with CAP_SYS_ADMIN: %s", out.String())
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		t.Fatal(err)
	}
	saved := caps
	caps[0].Effective &^= 1 << unix.CAP_SYS_ADMIN
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		t.Fatal(err)
	}
	warnWithoutSysAdmin(log)
	if err := unix.Capset(&hdr, &saved[0]); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "without CAP_SYS_ADMIN") || !strings.Contains(out.String(), "deploy/kubernetes-dra-dynamic-mig") {
		t.Errorf("without CAP_SYS_ADMIN: %q", out.String())
	}
}
