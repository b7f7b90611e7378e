package pipeline

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// claimDev is device gpu-<i> of the benchmark node prepared for claim
// cl, as the DRA driver records it.
func claimDev(cl claims.Claim, i int, admin bool) claims.Device {
	name := fmt.Sprintf("gpu-%d", i)
	node := fmt.Sprintf("/dev/nvidia%d", i)
	return claims.Device{Claim: cl, Request: "gpu", Name: name, UUID: uuid(i), Node: node, Nodes: []string{node},
		AdminAccess: admin, CDIDevice: "k8s.gpu.nri-gpu.dev/claim=" + cl.UID + "-" + name}
}

var (
	trainClaim  = claims.Claim{UID: "uid-train", Namespace: "ml", Name: "train"}
	sharedClaim = claims.Claim{UID: "uid-shared", Namespace: "ml", Name: "shared"}
	adminClaim  = claims.Claim{UID: "uid-admin", Namespace: "ops", Name: "probe"}
)

// preparedClaims: claim ml/train holds GPUs 1 and 3, ml/shared GPU 5,
// and ops/probe has GPU 1 by adminAccess.
func preparedClaims() *claims.Prepared {
	return claims.New([]claims.Device{claimDev(trainClaim, 1, false), claimDev(trainClaim, 3, false),
		claimDev(sharedClaim, 5, false), claimDev(adminClaim, 1, true)})
}

// claimEnv is the environment a claim's CDI spec sets for its devices
// (gpus), after the image's own entries.
func claimEnv(cl claims.Claim, image []string, gpus ...int) []string {
	env := slices.Clone(image)
	for _, g := range gpus {
		env = append(env, claims.EnvKey(fmt.Sprintf("gpu-%d", g))+"="+cl.UID)
	}
	return env
}

// claimPath is the request path of a node with the prepared claims,
// their holdings booked as the plugin books them (ClaimHoldings,
// SyncClaims).
func claimPath(t *testing.T, mode sharing.Mode, prep *claims.Prepared) *Path {
	t.Helper()
	src := adjust.Prepare(benchSnapshot(), layout)
	table := tableFor(src.Snapshot())
	hs, warnings := ClaimHoldings(src, mode, prep)
	if len(warnings) != 0 {
		t.Fatalf("claim holdings: %q", warnings)
	}
	if err := table.SyncClaims(hs, ""); err != nil {
		t.Fatal(err)
	}
	return &Path{Source: src, Table: table, Sharing: mode, Policy: policy.Policy{}, Claims: prep}
}

// TestClaimAssigned: a container that the runtime gave a prepared claim's
// CDI devices (the device nodes and the entries naming the claim) gets
// exactly the claim's GPUs, the control nodes and the driver files of
// its capabilities, no hook and no record; NVIDIA_VISIBLE_DEVICES names
// the claim's GPUs, whatever the image or the pod asks; the booking is
// the claim's, made when it was prepared, which its containers' going
// leaves.
func TestClaimAssigned(t *testing.T) {
	p := claimPath(t, sharing.Exclusive, preparedClaims())
	before := alloc.Summary(p.Table.State())
	want := "0=free 1=exclusive[claim ml/train] 2=free 3=exclusive[claim ml/train] 4=free 5=exclusive[claim ml/shared] 6=free 7=free"
	if before != want {
		t.Fatalf("prepared: %s\nwant %s", before, want)
	}
	// The pod asks for GPU 0 as well and the image for every GPU: neither
	// is read.
	pod := &api.PodSandbox{Id: "p-t", Name: "t", Namespace: "ml", Annotations: map[string]string{"gpus.nri-gpu.dev/container.main": "device=0"}}
	ctr := &api.Container{Id: "c-main", PodSandboxId: "p-t", Name: "main", Linux: pluginLinux(1, 3),
		Env: claimEnv(trainClaim, []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}, 1, 3)}
	adj, res, err := p.Handle(context.Background(), pod, ctr)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Warnings) != 0 {
		t.Errorf("warnings %q", res.Warnings)
	}
	if res.Request.Source != (request.Source{Kind: request.Claim, Key: "ml/train"}) {
		t.Errorf("source %v", res.Request.Source)
	}
	if got, want := envOf(adj)["NVIDIA_VISIBLE_DEVICES"], uuid(1)+","+uuid(3); got != want {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, want)
	}
	if got, want := devicePaths(adj), []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}; !slices.Equal(got, want) {
		t.Errorf("device nodes added %q, want only the control nodes %q", got, want)
	}
	if len(adj.GetMounts()) == 0 {
		t.Error("no driver files")
	}
	if adj.GetHooks() != nil {
		t.Errorf("hooks %v", adj.GetHooks())
	}
	if _, ok := adj.GetAnnotations()[alloc.Annotation]; ok {
		t.Error("a claim's container got a record")
	}
	if res.Holding != nil || len(res.Claims) != 1 || res.Claims[0].Holder.ID != "claim:uid-train" || !slices.Equal(res.Claims[0].GPUs, []int{1, 3}) {
		t.Errorf("holding %+v, claims %+v", res.Holding, res.Claims)
	}
	if got := alloc.Summary(p.Table.State()); got != before {
		t.Errorf("table %s\nwant %s", got, before)
	}
	// The container going leaves the claim's booking.
	p.Table.Release(ctr.Id)
	p.Table.Leave(ctr.Id)
	p.Table.ReleasePod(pod.Id)
	if got := alloc.Summary(p.Table.State()); got != before {
		t.Errorf("container gone: table %s\nwant %s", got, before)
	}
}

// TestClaimShared: one claim used by two containers of a pod and by a
// second pod books its GPU once, on an exclusive node too; an adminAccess
// claim's container gets its GPU, held exclusively by another claim,
// without holding it.
func TestClaimShared(t *testing.T) {
	p := claimPath(t, sharing.Exclusive, preparedClaims())
	before := alloc.Summary(p.Table.State())
	for _, c := range []struct{ pod, ctr string }{{"a", "main"}, {"a", "sidecar"}, {"b", "main"}} {
		pod := &api.PodSandbox{Id: "p-" + c.pod, Name: c.pod, Namespace: "ml"}
		ctr := &api.Container{Id: c.pod + "-" + c.ctr, PodSandboxId: pod.Id, Name: c.ctr, Linux: pluginLinux(5), Env: claimEnv(sharedClaim, nil, 5)}
		adj, res, err := p.Handle(context.Background(), pod, ctr)
		if err != nil {
			t.Fatalf("%s/%s: %v", c.pod, c.ctr, err)
		}
		if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != uuid(5) {
			t.Errorf("%s/%s: NVIDIA_VISIBLE_DEVICES=%q", c.pod, c.ctr, got)
		}
		if len(res.Claims) != 1 || res.Claims[0].Holder.ID != "claim:uid-shared" {
			t.Errorf("%s/%s: claims %+v", c.pod, c.ctr, res.Claims)
		}
	}
	admin := &api.Container{Id: "probe", PodSandboxId: "p-o", Name: "probe", Linux: pluginLinux(1), Env: claimEnv(adminClaim, nil, 1)}
	adj, res, err := p.Handle(context.Background(), &api.PodSandbox{Id: "p-o", Name: "o", Namespace: "ops"}, admin)
	if err != nil {
		t.Fatalf("adminAccess: %v", err)
	}
	if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != uuid(1) || len(adj.GetMounts()) == 0 || len(res.Claims) != 0 {
		t.Errorf("adminAccess: NVIDIA_VISIBLE_DEVICES=%q, %d mounts, claims %+v", got, len(adj.GetMounts()), res.Claims)
	}
	if got := alloc.Summary(p.Table.State()); got != before {
		t.Errorf("table %s\nwant %s", got, before)
	}
}

// TestClaimEnvForged: the entries a claim's CDI spec sets, written by a
// pod's author (in the pod spec's env) without the devices' nodes from
// the runtime, grant nothing: no GPU, no driver file, no booking, and
// the entries are reported. Beside a request of its own, that request is
// served as any (the policy decides); beside GPUs the runtime gave, those
// are the container's, as the runtime's, unless a claim holds one (only
// its claim reaches it).
func TestClaimEnvForged(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctr  *api.Container
		// held is the table's row of the booking expected besides the
		// claims'; visible the NVIDIA_VISIBLE_DEVICES answered; err the
		// refusal.
		held, visible, err string
	}{
		{"alone", &api.Container{Name: "c", Env: claimEnv(trainClaim, nil, 1, 3)}, "", "", ""},
		{"another claim's device node", &api.Container{Name: "c", Linux: pluginLinux(5), Env: claimEnv(trainClaim, nil, 5)}, "", "",
			"GPU 5 is held by claim ml/shared (shared): a GPU that a ResourceClaim holds is reached only through that claim"},
		{"a node of another number", &api.Container{Name: "c", Env: claimEnv(trainClaim, nil, 1),
			Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 6}}}}, "6=shared[ml/f/c]", "", ""},
		{"an unprepared claim", &api.Container{Name: "c", Linux: pluginLinux(2), Env: claimEnv(claims.Claim{UID: "uid-nope"}, nil, 2)}, "2=shared[ml/f/c]", "", ""},
		{"a device plugin's GPU", &api.Container{Name: "c", Linux: pluginLinux(2), Env: claimEnv(trainClaim, nil, 1)}, "2=shared[ml/f/c]", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := claimPath(t, sharing.Shared, preparedClaims())
			before := alloc.Summary(p.Table.State())
			pod := &api.PodSandbox{Id: "p-f", Name: "f", Namespace: "ml"}
			tc.ctr.Id, tc.ctr.PodSandboxId = "c-f", pod.Id
			adj, res, err := p.Handle(context.Background(), pod, tc.ctr)
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("error %v, want %q", err, tc.err)
			}
			if tc.err == "" && err != nil {
				t.Fatal(err)
			}
			if len(res.Claims) != 0 {
				t.Errorf("booked by claim: %+v", res.Claims)
			}
			if len(res.Warnings) == 0 || !strings.Contains(res.Warnings[0], "ignored: names no device of a prepared claim") {
				t.Errorf("warnings %q", res.Warnings)
			}
			if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != tc.visible {
				t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, tc.visible)
			}
			if tc.visible == "" && (len(adj.GetMounts()) != 0 || len(adj.GetLinux().GetDevices()) != 0) {
				t.Errorf("injected %v", adj)
			}
			got := alloc.Summary(p.Table.State())
			for _, h := range p.Table.Holdings() {
				if !strings.HasPrefix(h.Holder.ID, alloc.ClaimHolderPrefix) && h.Holder.ID != tc.ctr.Id {
					t.Errorf("holding %+v", h)
				}
			}
			if tc.held != "" && !strings.Contains(got, tc.held) {
				t.Errorf("table %s, want %s", got, tc.held)
			}
			if tc.held == "" && got != before {
				t.Errorf("table %s\nwant %s", got, before)
			}
		})
	}
}

// TestClaimsHeldForNodeLocal: node-local requests (annotations, the
// environment) see the GPUs of prepared claims as held from the claim's
// Prepare, before any container of it exists, and free after its
// Unprepare; forged claim entries beside such a request do not change
// that.
func TestClaimsHeldForNodeLocal(t *testing.T) {
	ask := func(p *Path, name string, ann map[string]string, env []string) (*api.ContainerAdjustment, Result, error) {
		pod := &api.PodSandbox{Id: "p-" + name, Name: name, Namespace: "ml", Annotations: ann}
		return p.Handle(context.Background(), pod, &api.Container{Id: "c-" + name, PodSandboxId: pod.Id, Name: "main", Env: env})
	}
	p := claimPath(t, sharing.Exclusive, preparedClaims())
	// The image's "all", with forged entries naming the claim: refused,
	// naming the claim that holds GPU 1.
	_, res, err := ask(p, "all", nil, claimEnv(trainClaim, []string{"NVIDIA_VISIBLE_DEVICES=all"}, 1))
	if err == nil || !strings.Contains(err.Error(), "GPU 1 cannot be held exclusively: it is held by claim ml/train") {
		t.Errorf("all on an exclusive node with claims: %v", err)
	}
	if len(res.Warnings) == 0 || !strings.Contains(res.Warnings[0], claims.EnvKey("gpu-1")+"=uid-train") {
		t.Errorf("forged entries not reported: %q", res.Warnings)
	}
	// A count gets the free GPUs only.
	_, res, err = ask(p, "five", map[string]string{"gpus.nri-gpu.dev/container.main": "5"}, nil)
	if err != nil || res.Holding == nil || !slices.Equal(res.Holding.GPUs, []int{0, 2, 4, 6, 7}) {
		t.Fatalf("count of the free GPUs: %v, %+v", err, res.Holding)
	}
	p.Table.Release("c-five")
	if _, _, err = ask(p, "six", map[string]string{"gpus.nri-gpu.dev/container.main": "6"}, nil); err == nil {
		t.Error("a count of 6 met with 3 of 8 GPUs held by claims")
	}
	// On a shared node too: a count never gets a claim's GPU.
	sp := claimPath(t, sharing.Shared, preparedClaims())
	if _, _, err = ask(sp, "six", map[string]string{"gpus.nri-gpu.dev/container.main": "6"}, nil); err == nil {
		t.Error("shared node: a count of 6 met with 3 of 8 GPUs held by claims")
	}
	// ml/train unprepared: its GPUs are free.
	var rest []claims.Device
	for _, d := range p.Claims.Devices() {
		if d.Claim != trainClaim {
			rest = append(rest, d)
		}
	}
	prep := claims.New(rest)
	hs, _ := ClaimHoldings(p.Source, sharing.Exclusive, prep)
	if err := p.Table.SyncClaims(hs, ""); err != nil {
		t.Fatal(err)
	}
	p.Claims = prep
	if _, res, err = ask(p, "one", map[string]string{"gpus.nri-gpu.dev/container.main": "device=1"}, nil); err != nil || !slices.Equal(res.Holding.GPUs, []int{1}) {
		t.Errorf("GPU 1 after its claim's Unprepare: %v, %+v", err, res.Holding)
	}
}

// TestClaimHoldingsSynchronize: at Synchronize, a running container of a
// claim holds nothing itself (the claim holds its GPUs, ClaimHoldings),
// only the GPUs the runtime gave it besides; its forged entries hold
// nothing either; a claim device the inventory lacks is reported.
func TestClaimHoldingsSynchronize(t *testing.T) {
	prep := preparedClaims()
	src := adjust.Prepare(benchSnapshot(), layout)
	pod := &api.PodSandbox{Id: "p-s", Name: "s", Namespace: "ml"}
	running := func(id string, env []string, gpus ...int) *api.Container {
		return &api.Container{Id: id, PodSandboxId: pod.Id, Name: id, State: api.ContainerState_CONTAINER_RUNNING, Linux: pluginLinux(gpus...), Env: env}
	}
	ctrs := []*api.Container{
		running("train", claimEnv(trainClaim, nil, 1, 3), 1, 3),
		running("mixed", claimEnv(sharedClaim, nil, 5), 5, 6),
		running("forged", claimEnv(trainClaim, nil, 1), 2),
	}
	hs, warnings := holdingsWith(src, sharing.Exclusive, prep, []*api.PodSandbox{pod}, ctrs)
	if len(warnings) != 1 || !strings.Contains(warnings[0], "ml/s/forged") {
		t.Errorf("warnings %q", warnings)
	}
	chs, cw := ClaimHoldings(src, sharing.Exclusive, prep)
	if len(cw) != 0 {
		t.Errorf("claim warnings %q", cw)
	}
	table := tableFor(src.Snapshot())
	table.Rebuild(append(hs, chs...))
	want := "0=free 1=exclusive[claim ml/train] 2=exclusive[ml/s/forged] 3=exclusive[claim ml/train] 4=free 5=exclusive[claim ml/shared] 6=exclusive[ml/s/mixed] 7=free"
	if got := alloc.Summary(table.State()); got != want {
		t.Errorf("rebuilt %s\nwant %s", got, want)
	}
	gone := claims.New([]claims.Device{{Claim: trainClaim, Name: "gpu-9", UUID: "GPU-gone", Node: "/dev/nvidia9"}})
	if hs, w := ClaimHoldings(src, sharing.Exclusive, gone); len(hs) != 0 || len(w) != 1 || !strings.Contains(w[0], "GPU-gone") {
		t.Errorf("device not in the inventory: %+v, %q", hs, w)
	}
}

// TestClaimMIG: a MIG device of a claim is identified by its compute
// instance's capability node: the container gets the MIG device, and
// NVIDIA_VISIBLE_DEVICES names it.
func TestClaimMIG(t *testing.T) {
	s := simnode.MemoryMIGSnapshot()
	src := adjust.Prepare(s, layout)
	u := migUUID(s, 0, 1)
	ci := capNode(simnode.CIMinor(0, 8, 0))
	gi := capNode(simnode.GIMinor(0, 8))
	dev := claims.Device{Claim: trainClaim, Request: "mig", Name: "gpu-0-mig-1", UUID: u, MIG: true, Node: ci, Nodes: []string{"/dev/nvidia0", gi, ci}}
	prep := claims.New([]claims.Device{dev})
	table := tableFor(s)
	hs, w := ClaimHoldings(src, sharing.Exclusive, prep)
	if len(w) != 0 || table.SyncClaims(hs, "") != nil {
		t.Fatalf("claim holdings: %q", w)
	}
	linux := &api.LinuxContainer{Devices: []*api.LinuxDevice{
		{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0},
		{Path: gi, Type: "c", Major: simnode.MemoryCapsMajor, Minor: int64(simnode.GIMinor(0, 8))},
		{Path: ci, Type: "c", Major: simnode.MemoryCapsMajor, Minor: int64(simnode.CIMinor(0, 8, 0))},
	}}
	p := &Path{Source: src, Table: table, Sharing: sharing.Exclusive, Claims: prep}
	ctr := &api.Container{Id: "m", PodSandboxId: "p-m", Name: "m", Linux: linux, Env: []string{claims.EnvKey(dev.Name) + "=" + trainClaim.UID}}
	adj, res, err := p.Handle(context.Background(), &api.PodSandbox{Id: "p-m", Name: "m", Namespace: "ml"}, ctr)
	if err != nil {
		t.Fatal(err)
	}
	if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != u || len(res.Claims) != 1 {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, claims %+v", got, res.Claims)
	}
	for _, d := range devicePaths(adj) {
		if d == "/dev/nvidia0" || strings.HasPrefix(d, "/dev/nvidia-caps/") {
			t.Errorf("device node %s added: the runtime gave it", d)
		}
	}
}

// TestClaimMPSMIG: the containers of two claims with GpuConfig MPS on
// two MIG devices of one GPU are clients of their own MIG device's
// daemon: each gets its MIG device, that daemon's pipe directory at
// /tmp/nvidia-mps and its claim's CUDA_MPS_* limits, never the other's.
func TestClaimMPSMIG(t *testing.T) {
	s := simnode.MemoryMIGSnapshot()
	src := adjust.Prepare(s, layout)
	mig := func(cl claims.Claim, idx, gi, threads int) claims.Device {
		u := migUUID(s, 0, idx)
		ci := capNode(simnode.CIMinor(0, gi, 0))
		return claims.Device{Claim: cl, Request: "gpu", Name: fmt.Sprintf("gpu-0-mig-%d", idx), UUID: u, MIG: true, Node: ci,
			Nodes: []string{"/dev/nvidia0", capNode(simnode.GIMinor(0, gi)), ci}, Sharing: "MPS",
			MPS: &sharing.MPSDaemon{PipeDir: "/run/nri-gpu/mps/" + u + "/pipe", LogDir: "/run/nri-gpu/mps/" + u + "/log", ShmDir: "/run/nri-gpu/mps/shm",
				MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: threads, PinnedMemoryMiB: 4096}, Ready: true}}
	}
	a, b := claims.Claim{UID: "uid-a", Namespace: "ml", Name: "a"}, claims.Claim{UID: "uid-b", Namespace: "ml", Name: "b"}
	devs := []claims.Device{mig(a, 1, 8, 30), mig(b, 2, 9, 50)}
	prep := claims.New(devs)
	table := tableFor(s)
	hs, w := ClaimHoldings(src, sharing.Exclusive, prep)
	if len(w) != 0 || table.SyncClaims(hs, "") != nil {
		t.Fatalf("claim holdings: %q", w)
	}
	p := &Path{Source: src, Table: table, Sharing: sharing.Exclusive, Claims: prep}
	for i, dv := range devs {
		gi := 8 + i
		linux := &api.LinuxContainer{Devices: []*api.LinuxDevice{
			{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0},
			{Path: capNode(simnode.GIMinor(0, gi)), Type: "c", Major: simnode.MemoryCapsMajor, Minor: int64(simnode.GIMinor(0, gi))},
			{Path: dv.Node, Type: "c", Major: simnode.MemoryCapsMajor, Minor: int64(simnode.CIMinor(0, gi, 0))},
		}}
		pod := &api.PodSandbox{Id: "p-" + dv.Claim.Name, Name: dv.Claim.Name, Namespace: "ml"}
		env := []string{claims.EnvKey(dv.Name) + "=" + dv.Claim.UID, "CUDA_MPS_PIPE_DIRECTORY=/elsewhere"}
		ctr := &api.Container{Id: "c-" + dv.Claim.Name, PodSandboxId: pod.Id, Name: "main", Linux: linux, Env: env}
		adj, res, err := p.Handle(context.Background(), pod, ctr)
		if err != nil || res.MPS == nil || res.MPS.UUID != dv.UUID {
			t.Fatalf("claim %s: %v, %+v", dv.Claim.Name, err, res)
		}
		if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != dv.UUID {
			t.Errorf("claim %s: NVIDIA_VISIBLE_DEVICES=%q, want its MIG device %s", dv.Claim.Name, got, dv.UUID)
		}
		var pipes []string
		for _, m := range adj.GetMounts() {
			if m.Destination == "/tmp/nvidia-mps" {
				pipes = append(pipes, m.Source)
			}
		}
		if !slices.Equal(pipes, []string{dv.MPS.PipeDir}) {
			t.Errorf("claim %s: /tmp/nvidia-mps from %v, want its MIG device's %s", dv.Claim.Name, pipes, dv.MPS.PipeDir)
		}
		var got []string
		for _, e := range applyEnv(env, adj) {
			if strings.HasPrefix(e, "CUDA_MPS_") {
				got = append(got, e)
			}
		}
		slices.Sort(got)
		want := []string{fmt.Sprintf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d", dv.MPS.ActiveThreadPercentage), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}
		if !slices.Equal(got, want) {
			t.Errorf("claim %s: CUDA_MPS_* %q\nwant %q", dv.Claim.Name, got, want)
		}
	}
}

// mpsClaimDev is claimDev with sharing strategy MPS: the daemon of GPU i
// ready (or not) with the claim's limits.
func mpsClaimDev(cl claims.Claim, i int, ready bool) claims.Device {
	d := claimDev(cl, i, false)
	d.Sharing = "MPS"
	d.MPS = &sharing.MPSDaemon{PipeDir: "/run/nri-gpu/mps/" + uuid(i) + "/pipe", LogDir: "/run/nri-gpu/mps/" + uuid(i) + "/log", ShmDir: "/run/nri-gpu/mps/shm",
		MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: 30, PinnedMemoryMiB: 8192}, Ready: ready}
	if !ready {
		d.MPS.Why = "nri-gpu mps reports no running MPS control daemon"
	}
	return d
}

// TestClaimMPS: the containers of two pods of a claim with GpuConfig MPS
// are clients of its GPU's daemon: its pipe directory at /tmp/nvidia-mps,
// the daemons' /dev/shm, and exactly the claim's CUDA_MPS_* once the
// answer is applied, whatever the pod spec sets (higher limits, another
// pipe directory, a log directory); the claim booked once. Refused while
// the daemon is not ready, naming why, and beside another GPU.
func TestClaimMPS(t *testing.T) {
	mpsClaim := claims.Claim{UID: "uid-mps", Namespace: "ml", Name: "infer"}
	p := claimPath(t, sharing.Exclusive, claims.New([]claims.Device{mpsClaimDev(mpsClaim, 2, true), claimDev(trainClaim, 1, false)}))
	before := alloc.Summary(p.Table.State())
	raise := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=81559M", "CUDA_MPS_PIPE_DIRECTORY=/elsewhere",
		"CUDA_MPS_LOG_DIRECTORY=/tmp/log", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}
	for _, tc := range []struct {
		pod  string
		env  []string
		want []string
	}{
		{"a", []string{"NVIDIA_DRIVER_CAPABILITIES=compute,utility"}, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}},
		{"b", raise, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30", "CUDA_MPS_LOG_DIRECTORY=", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}},
	} {
		pod := &api.PodSandbox{Id: "p-" + tc.pod, Name: tc.pod, Namespace: "ml"}
		env := claimEnv(mpsClaim, tc.env, 2)
		ctr := &api.Container{Id: "c-" + tc.pod, PodSandboxId: pod.Id, Name: "main", Linux: pluginLinux(2), Env: env}
		adj, res, err := p.Handle(context.Background(), pod, ctr)
		if err != nil || res.MPS == nil || res.MPS.UUID != uuid(2) {
			t.Fatalf("pod %s: %v, %+v", tc.pod, err, res)
		}
		mounts := map[string][]string{}
		for _, m := range adj.GetMounts() {
			mounts[m.Destination] = append(mounts[m.Destination], m.Source)
		}
		if got := mounts["/tmp/nvidia-mps"]; !slices.Equal(got, []string{"/run/nri-gpu/mps/" + uuid(2) + "/pipe"}) {
			t.Errorf("pod %s: /tmp/nvidia-mps from %v", tc.pod, got)
		}
		if got := mounts["/dev/shm"]; !slices.Equal(got, []string{"/run/nri-gpu/mps/shm"}) {
			t.Errorf("pod %s: /dev/shm from %v", tc.pod, got)
		}
		var got []string
		for _, e := range applyEnv(env, adj) {
			if strings.HasPrefix(e, "CUDA_MPS_") {
				got = append(got, e)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("pod %s: CUDA_MPS_* %q\nwant %q", tc.pod, got, tc.want)
		}
	}
	if got := alloc.Summary(p.Table.State()); got != before {
		t.Errorf("table %s\nwant %s (the claim booked once)", got, before)
	}

	// The daemon not ready.
	down := claimPath(t, sharing.Exclusive, claims.New([]claims.Device{mpsClaimDev(mpsClaim, 2, false)}))
	ctr := &api.Container{Id: "c-d", PodSandboxId: "p-d", Name: "main", Linux: pluginLinux(2), Env: claimEnv(mpsClaim, nil, 2)}
	_, _, err := down.Handle(context.Background(), &api.PodSandbox{Id: "p-d", Name: "d", Namespace: "ml"}, ctr)
	if want := "claim ml/infer: device gpu-2 (" + uuid(2) + ") is shared with MPS and its MPS control daemon is not ready (nri-gpu mps reports no running MPS control daemon)"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("daemon down: %v\nwant %q", err, want)
	}
	// Beside another claim's GPU.
	both := claimPath(t, sharing.Exclusive, claims.New([]claims.Device{mpsClaimDev(mpsClaim, 2, true), claimDev(trainClaim, 1, false)}))
	ctr = &api.Container{Id: "c-2", PodSandboxId: "p-2", Name: "main", Linux: pluginLinux(1, 2),
		Env: append(claimEnv(mpsClaim, nil, 2), claimEnv(trainClaim, nil, 1)...)}
	_, _, err = both.Handle(context.Background(), &api.PodSandbox{Id: "p-2", Name: "two", Namespace: "ml"}, ctr)
	if want := "a container gets one MPS GPU and nothing else"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("MPS beside another GPU: %v", err)
	}
}
