package pipeline

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
)

// The defects an outside review of the claim path reproduced, each with
// the test that shows it closed (the numbers are the review's), and a
// table of containers of every kind that CreateContainer and Synchronize
// must book alike.

// withClaims gives p the prepared claims prep, booked as the plugin books
// them (ClaimHoldings, SyncClaims); it returns ClaimHoldings' warnings.
func withClaims(t *testing.T, p *Path, prep *claims.Prepared) []string {
	t.Helper()
	hs, warnings := ClaimHoldings(p.Source, p.Sharing, prep)
	if err := p.Table.SyncClaims(hs, ""); err != nil {
		t.Fatal(err)
	}
	p.Claims = prep
	return warnings
}

// TestReviewDefect1MPSReplicaBesideClaim: a container that the kubelet
// gave a replica of an MPS GPU and that also holds a claim's GPU is
// refused by the MPS rule (one MPS GPU and nothing else), as without the
// claim beside another GPU; a time-slicing replica beside a claim is
// booked as the kubelet's replica, shared, and its shared-replicas
// annotation is checked against the plan.
func TestReviewDefect1MPSReplicaBesideClaim(t *testing.T) {
	pod := &api.PodSandbox{Id: "p-m", Name: "m", Namespace: "ml"}
	env := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"}
	p := mpsPath(t)
	withClaims(t, p, claims.New([]claims.Device{claimDev(trainClaim, 1, false)}))
	before := alloc.Summary(p.Table.State())
	ctr := replicaContainer("m", "mps:"+uuid(0)+"=1/4", claimEnv(trainClaim, env, 1), 0)
	ctr.Linux = pluginLinux(0, 1)
	adj, res, err := p.Handle(context.Background(), pod, ctr)
	if want := "a container gets replicas of one MPS GPU and nothing else"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("an MPS replica beside a claim's GPU: %v (MPS client %v, NVIDIA_VISIBLE_DEVICES=%q)\nwant %q", err, res.MPS, envOf(adj)["NVIDIA_VISIBLE_DEVICES"], want)
	}
	if got := alloc.Summary(p.Table.State()); got != before {
		t.Errorf("table %s\nwant %s", got, before)
	}
	// The claim's entry forged (no node): the replica alone, an MPS client.
	forged := replicaContainer("f", "mps:"+uuid(0)+"=1/4", claimEnv(trainClaim, env, 1), 0)
	if _, res, err := p.Handle(context.Background(), pod, forged); err != nil || res.MPS == nil || len(res.Claims) != 0 {
		t.Errorf("an MPS replica with a forged claim entry: %v, MPS %v, claims %v", err, res.MPS, res.Claims)
	}

	// Time-slicing, on an exclusive node.
	ts := replicaPath(t, sharing.TimeSlicing, false, sharing.Exclusive)
	withClaims(t, ts, claims.New([]claims.Device{claimDev(trainClaim, 1, false)}))
	ctr = replicaContainer("t", "time-slicing:"+uuid(0)+"=1/4", claimEnv(trainClaim, nil, 1), 0)
	ctr.Linux = pluginLinux(0, 1)
	_, res, err = ts.Handle(context.Background(), pod, ctr)
	if err != nil || res.Holding == nil || !res.Holding.Kubelet || res.Holding.Mode != sharing.Shared || !slices.Equal(res.Holding.GPUs, []int{0}) || len(res.Claims) != 1 {
		t.Errorf("a time-slicing replica beside a claim: %v, holding %+v, claims %+v; want GPU 0 the kubelet's, shared", err, res.Holding, res.Claims)
	}
	bad := replicaContainer("b", "time-slicing:"+uuid(0)+"=1/8", claimEnv(trainClaim, nil, 1), 0)
	bad.Linux = pluginLinux(0, 1)
	if _, _, err := ts.Handle(context.Background(), pod, bad); err == nil || !strings.Contains(err.Error(), "shared as 8 time-slicing replicas, but this node shares it as") {
		t.Errorf("a replica annotation the plan does not back, beside a claim: %v", err)
	}
}

// TestReviewDefect6GPUReplacedAtNode: after a restart in which a claim
// device's node is another GPU (a driver reload, a swap) or no GPU, a
// container of the claim is refused, saying so, and nothing is booked for
// the GPU now at that node, at CreateContainer or at Synchronize; the
// claim books nothing for it either.
func TestReviewDefect6GPUReplacedAtNode(t *testing.T) {
	for _, tc := range []struct {
		name, uuid, want string
		node             int
	}{
		{"another UUID at the node", "GPU-0ld00000-558d-fb20-8eca-25de8b98f5a7", "device gpu-0 was prepared as GPU-0ld00000-558d-fb20-8eca-25de8b98f5a7 at /dev/nvidia0, which is " + uuid(0) + " now", 0},
		{"the GPU moved to another node", uuid(1), "device gpu-0 was prepared as " + uuid(1) + " at /dev/nvidia0, which is " + uuid(0) + " now", 0},
		{"no GPU at the node", "GPU-9", "device gpu-9 (GPU-9, /dev/nvidia9) is not in the node's inventory now", 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := adjust.Prepare(benchSnapshot(), layout)
			p := &Path{Source: src, Table: tableFor(src.Snapshot()), Sharing: sharing.Exclusive}
			dev := claimDev(trainClaim, tc.node, false)
			dev.UUID = tc.uuid
			if w := withClaims(t, p, claims.New([]claims.Device{dev})); len(w) != 1 {
				t.Errorf("claim holdings: warnings %q, want one", w)
			}
			free := alloc.Summary(p.Table.State())
			if free != "0=free 1=free 2=free 3=free 4=free 5=free 6=free 7=free" {
				t.Errorf("the claim booked a GPU it was not prepared on: %s", free)
			}
			pod := &api.PodSandbox{Id: "p-t", Name: "t", Namespace: "ml"}
			ctr := &api.Container{Id: "c-t", PodSandboxId: pod.Id, Name: "main", Linux: pluginLinux(tc.node), Env: claimEnv(trainClaim, []string{"NVIDIA_VISIBLE_DEVICES=all"}, tc.node)}
			adj, res, err := p.Handle(context.Background(), pod, ctr)
			if adj != nil || err == nil || !strings.Contains(err.Error(), "claim ml/train: "+tc.want) {
				t.Errorf("CreateContainer: %v, %v (holding %+v)\nwant %q", adj, err, res.Holding, tc.want)
			}
			if got := alloc.Summary(p.Table.State()); got != free {
				t.Errorf("table %s\nwant %s", got, free)
			}
			ctr.State = api.ContainerState_CONTAINER_RUNNING
			hs, warnings := synchronize(p, []*api.PodSandbox{pod}, []*api.Container{ctr})
			if len(hs) != 0 || len(warnings) != 1 || !strings.Contains(warnings[0], tc.want) {
				t.Errorf("Synchronize: %+v, %q", hs, warnings)
			}
		})
	}
}

// TestReviewDefect7PrivilegedForgesClaim: a privileged container's claim
// entries grant nothing (its device nodes prove nothing), in the claim's
// namespace or another, under a policy that denies everything: no claim,
// no GPU, no driver file; the entries are reported.
func TestReviewDefect7PrivilegedForgesClaim(t *testing.T) {
	for _, ns := range []string{"evil", "ml"} {
		p := claimPath(t, sharing.Exclusive, preparedClaims())
		p.Policy = policy.Policy{Default: policy.DefaultDeny, VisibleDevices: policy.VisibleDevicesDeny}
		before := alloc.Summary(p.Table.State())
		pod := &api.PodSandbox{Id: "p-e", Name: "e", Namespace: ns}
		ctr := &api.Container{Id: "c-e", PodSandboxId: pod.Id, Name: "main", Linux: privilegedLinux(), Env: claimEnv(trainClaim, nil, 1)}
		adj, res, err := p.Handle(context.Background(), pod, ctr)
		if err != nil || res.Request.Source.Kind == request.Claim || len(res.Claims) != 0 || len(adj.GetMounts()) != 0 || len(adj.GetLinux().GetDevices()) != 0 {
			t.Errorf("%s: privileged with a claim's entry: %v, source %v, claims %+v, %d mounts", ns, err, res.Request.Source, res.Claims, len(adj.GetMounts()))
		}
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "the container is privileged") {
			t.Errorf("%s: warnings %q", ns, res.Warnings)
		}
		if got := alloc.Summary(p.Table.State()); got != before {
			t.Errorf("%s: table %s\nwant %s", ns, got, before)
		}
	}
}

// TestReviewDefect7ClaimNamespace: a container whose claim entries and
// device nodes name a claim of another namespace than its pod's does not
// hold the claim: the entries are reported, and the GPUs of its nodes,
// which the claim holds, refuse it.
func TestReviewDefect7ClaimNamespace(t *testing.T) {
	p := claimPath(t, sharing.Exclusive, preparedClaims())
	before := alloc.Summary(p.Table.State())
	pod := &api.PodSandbox{Id: "p-e", Name: "e", Namespace: "evil"}
	ctr := &api.Container{Id: "c-e", PodSandboxId: pod.Id, Name: "main", Linux: pluginLinux(1, 3), Env: claimEnv(trainClaim, nil, 1, 3)}
	adj, res, err := p.Handle(context.Background(), pod, ctr)
	if adj != nil || err == nil || len(res.Claims) != 0 {
		t.Errorf("another namespace's claim: %v, %v, claims %+v", adj, err, res.Claims)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "claim ml/train is not of the pod's namespace evil") {
		t.Errorf("warnings %q", res.Warnings)
	}
	if got := alloc.Summary(p.Table.State()); got != before {
		t.Errorf("table %s\nwant %s", got, before)
	}
}

// agreePath is the memory snapshot's node in shared mode with GPU 0
// shared as 4 MPS replicas (its daemon ready) and these claims prepared:
// ml/train on GPUs 1 and 3, ml/shared on GPU 5, ml/moved on gpu-7 as a GPU
// that is no longer the one at /dev/nvidia7, ml/gone on gpu-9, which the
// node no longer has.
func agreePath(t *testing.T) *Path {
	p := mpsPath(t)
	moved := claimDev(claims.Claim{UID: "uid-moved", Namespace: "ml", Name: "moved"}, 7, false)
	moved.UUID = "GPU-0ld00007-558d-fb20-8eca-25de8b98f5a7"
	gone := claimDev(claims.Claim{UID: "uid-gone", Namespace: "ml", Name: "gone"}, 9, false)
	withClaims(t, p, claims.New([]claims.Device{claimDev(trainClaim, 1, false), claimDev(trainClaim, 3, false), claimDev(sharedClaim, 5, false), moved, gone}))
	return p
}

// applied is ctr as the runtime creates it with the answer adj, running:
// the answer's device nodes, annotations and environment added.
func applied(ctr *api.Container, adj *api.ContainerAdjustment) *api.Container {
	out := &api.Container{Id: ctr.Id, PodSandboxId: ctr.PodSandboxId, Name: ctr.Name, State: api.ContainerState_CONTAINER_RUNNING,
		Env: applyEnv(ctr.Env, adj), CDIDevices: ctr.CDIDevices, Annotations: map[string]string{}, Linux: &api.LinuxContainer{}}
	for k, v := range ctr.Annotations {
		out.Annotations[k] = v
	}
	for k, v := range adj.GetAnnotations() {
		out.Annotations[k] = v
	}
	out.Linux.Devices = append(slices.Clone(ctr.GetLinux().GetDevices()), adj.GetLinux().GetDevices()...)
	out.Linux.Resources = ctr.GetLinux().GetResources()
	return out
}

// TestClassifyAgrees feeds containers of every kind to CreateContainer
// and to Synchronize on the same node: a container served is created with
// the answer, and Synchronize must rebuild exactly what CreateContainer
// booked (its own holding, its pod's, its claims'), and the GPUs it was
// given must be among those booked for it or its claims; a container
// refused books nothing, and Synchronize (had the runtime made it
// without nri-gpu) books for it only the GPUs it holds itself (held).
func TestClassifyAgrees(t *testing.T) {
	type row struct {
		name   string
		ns     string
		ann    map[string]string
		ctr    *api.Container
		refuse string
		held   []int
	}
	rec := func(gpus ...int) string {
		r := alloc.Record{Mode: "shared"}
		for _, g := range gpus {
			r.GPUs = append(r.GPUs, uuid(g))
		}
		return r.Encode()
	}
	vanished := &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia9", Type: "c", Major: 195, Minor: 9}}}
	otherNumber := &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia2", Type: "c", Major: 195, Minor: 6}}}
	rows := []row{
		{name: "own request, a count", ann: map[string]string{"gpus.nri-gpu.dev/container.main": "1"}, ctr: &api.Container{}},
		{name: "own request, the pod's", ann: map[string]string{"gpus.nri-gpu.dev/pod": "device=4,exclusive=true"}, ctr: &api.Container{}},
		{name: "own request, the image's env", ctr: &api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=2"}}},
		{name: "none", ctr: &api.Container{Env: []string{"PATH=/bin"}}},
		{name: "privileged, no request", ctr: &api.Container{Linux: privilegedLinux()}},
		{name: "privileged, a count", ann: map[string]string{"gpus.nri-gpu.dev/container.main": "1"}, ctr: &api.Container{Linux: privilegedLinux()}},
		{name: "privileged, a claim's entry", ctr: &api.Container{Linux: privilegedLinux(), Env: claimEnv(trainClaim, nil, 1)}},
		{name: "management", ns: "gpu-operator", ann: map[string]string{"nvidia.cdi.k8s.io/pod": "management.nvidia.com/gpu=all"}, ctr: &api.Container{}},
		{name: "the kubelet's", ctr: kubeletContainer("", uuid(2)+","+uuid(4), nil, 2, 4)},
		{name: "the kubelet's MPS replica", ctr: replicaContainer("", "mps:"+uuid(0)+"=1/4", nil, 0)},
		{name: "an MPS replica beside a claim", ctr: func() *api.Container {
			c := replicaContainer("", "mps:"+uuid(0)+"=1/4", claimEnv(trainClaim, nil, 1, 3), 0)
			c.Linux = pluginLinux(0, 1, 3)
			return c
		}(), refuse: "one MPS GPU and nothing else", held: []int{0}},
		{name: "a claim", ctr: &api.Container{Linux: pluginLinux(1, 3), Env: claimEnv(trainClaim, []string{"NVIDIA_VISIBLE_DEVICES=all"}, 1, 3)}},
		{name: "a claim and a device plugin's GPU", ctr: &api.Container{Linux: pluginLinux(5, 6), Env: claimEnv(sharedClaim, nil, 5)}},
		{name: "a claim of another namespace", ns: "evil", ctr: &api.Container{Linux: pluginLinux(1, 3), Env: claimEnv(trainClaim, nil, 1, 3)},
			refuse: "a GPU that a ResourceClaim holds is reached only through that claim", held: []int{1, 3}},
		{name: "a claim whose GPU was replaced", ctr: &api.Container{Linux: pluginLinux(7), Env: []string{claims.EnvKey("gpu-7") + "=uid-moved"}},
			refuse: "device gpu-7 was prepared as GPU-0ld00007"},
		{name: "a claim whose GPU vanished", ctr: &api.Container{Linux: vanished, Env: []string{claims.EnvKey("gpu-9") + "=uid-gone", "NVIDIA_VISIBLE_DEVICES=all"}},
			refuse: "device gpu-9 (" + uuid(9) + ", /dev/nvidia9) is not in the node's inventory now"},
		{name: "a forged claim entry, the image's env", ctr: &api.Container{Env: claimEnv(trainClaim, []string{"NVIDIA_VISIBLE_DEVICES=2"}, 1)}},
		{name: "a device plugin's GPU", ctr: &api.Container{Linux: pluginLinux(6), Env: []string{"NVIDIA_VISIBLE_DEVICES=" + uuid(6)}}},
		{name: "a node of another number at a GPU's path", ctr: &api.Container{Linux: otherNumber, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}},
		{name: "a CDI device", ctr: &api.Container{CDIDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=4"}}, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}},
		{name: "a forged kubelet annotation, a device plugin's GPU",
			ann: map[string]string{alloc.KubeletAnnotation: uuid(6)}, ctr: kubeletContainer("", uuid(6), nil, 6)},
		{name: "a forged kubelet annotation, its own request",
			ann: map[string]string{alloc.KubeletAnnotation: uuid(4), "gpus.nri-gpu.dev/container.main": "device=4"}, ctr: kubeletContainer("", uuid(4), nil)},
		{name: "a forged record, a device plugin's GPU",
			ann: map[string]string{alloc.Annotation: rec(6)}, ctr: &api.Container{Linux: pluginLinux(6), Annotations: map[string]string{alloc.Annotation: rec(6)}}},
		{name: "a forged record, the kubelet's", ctr: func() *api.Container {
			c := kubeletContainer("", uuid(2), nil, 2)
			c.Annotations[alloc.Annotation] = rec(2)
			return c
		}()},
		{name: "a forged record, a claim", ctr: &api.Container{Linux: pluginLinux(1, 3), Env: claimEnv(trainClaim, nil, 1, 3), Annotations: map[string]string{alloc.Annotation: rec(1, 3)}}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			p := agreePath(t)
			claimsOnly := p.Table.Holdings()
			ns := r.ns
			if ns == "" {
				ns = "ml"
			}
			pod := &api.PodSandbox{Id: "p-x", Name: "x", Namespace: ns, Annotations: r.ann}
			ctr := r.ctr
			ctr.Id, ctr.PodSandboxId, ctr.Name = "c-x", pod.Id, "main"
			adj, res, err := p.Handle(context.Background(), pod, ctr)
			if r.refuse != "" {
				if err == nil || !strings.Contains(err.Error(), r.refuse) {
					t.Errorf("CreateContainer: %v, want a refusal with %q", err, r.refuse)
				}
				if d := cmp.Diff(claimsOnly, p.Table.Holdings()); d != "" {
					t.Errorf("a refused container booked (-before +after):\n%s", d)
				}
				ctr.State = api.ContainerState_CONTAINER_RUNNING
				hs, _ := synchronize(p, []*api.PodSandbox{pod}, []*api.Container{ctr})
				var held []int
				for _, h := range hs {
					held = append(held, h.GPUs...)
				}
				if !slices.Equal(held, r.held) {
					t.Errorf("Synchronize of the container made without nri-gpu: it holds %v, want %v", held, r.held)
				}
				return
			}
			if err != nil {
				t.Fatalf("CreateContainer: %v", err)
			}
			booked := p.Table.Holdings()
			mine := map[int]bool{}
			for _, h := range booked {
				if h.Holder.ID == ctr.Id || h.Holder.PodID == pod.Id || slices.ContainsFunc(res.Claims, func(c alloc.Holding) bool { return c.Holder.ID == h.Holder.ID }) {
					for _, g := range h.GPUs {
						mine[g] = true
					}
				}
			}
			if res.Holding != nil || len(res.Claims) > 0 {
				for _, g := range res.GPUs {
					if !mine[g.Index] {
						t.Errorf("given GPU %d, which is booked for neither the container nor its claims (%+v)", g.Index, booked)
					}
				}
			}
			hs, _ := synchronize(p, []*api.PodSandbox{pod}, []*api.Container{applied(ctr, adj)})
			chs, _ := ClaimHoldings(p.Source, p.Sharing, p.Claims)
			rebuilt := tableFor(p.Source.Snapshot())
			rebuilt.Rebuild(append(hs, chs...))
			if d := cmp.Diff(booked, rebuilt.Holdings()); d != "" {
				t.Errorf("Synchronize rebuilds other holdings than CreateContainer booked (-CreateContainer +Synchronize):\n%s", d)
			}
		})
	}
}
