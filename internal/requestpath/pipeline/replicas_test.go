package pipeline

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// replicaPath is the request path of the memory snapshot's node on which
// the device plugin shares GPU 0 (the first device of nvidia.com/gpu) as
// 4 replicas of strategy (sharing.TimeSlicing or sharing.MPS), in the
// node's mode, with the table told so as the plugin tells it.
func replicaPath(t *testing.T, strategy string, fail bool, mode sharing.Mode) *Path {
	t.Helper()
	prep := adjust.Prepare(benchSnapshot(), layout)
	plan := sharing.NewPlan(sharing.Spec{ResourceName: "nvidia.com/gpu", MIGStrategy: sharing.MIGStrategyNone, MPSRoot: "/run/nri-gpu/mps",
		Strategy: strategy, FailRequestsGreaterThanOne: fail,
		Resources: []sharing.Resource{{Name: "nvidia.com/gpu", SharedName: "nvidia.com/gpu", Replicas: 4, Count: 1}}}, prep.Devices())
	if _, ok := plan.Share(uuid(0)); !ok {
		t.Fatalf("the plan does not replicate GPU 0: %+v", plan)
	}
	table := tableFor(prep.Snapshot())
	rep := map[int]string{}
	for _, g := range prep.Devices() {
		if sh, ok := plan.Share(g.ID()); ok {
			rep[g.Index] = sh.String()
		}
	}
	table.SetReplicated(rep)
	return &Path{Source: prep, Table: table, Sharing: mode, Shares: plan}
}

// replicaContainer is a container the kubelet gave replicas: the device
// nodes and the kubelet annotation of the GPUs, and the shared-replicas
// annotation shared (none when empty).
func replicaContainer(id, shared string, env []string, gpus ...int) *api.Container {
	ids := make([]string, len(gpus))
	for i, g := range gpus {
		ids[i] = uuid(g)
	}
	c := kubeletContainer(id, strings.Join(ids, ","), env, gpus...)
	c.Annotations = map[string]string{alloc.KubeletAnnotationFor("nvidia.com/gpu"): strings.Join(ids, ",")}
	if shared != "" {
		c.Annotations[alloc.KubeletSharedAnnotation("nvidia.com/gpu")] = shared
	}
	return c
}

// TestKubeletReplicas: on a node whose mode is exclusive, containers the
// kubelet gave replicas of GPU 0 are booked shared with each other, with
// or without the shared-replicas annotation, and GPU 0 is never given
// whole: not to a count, not to a request that names it. Two replicas of
// GPU 0 in one container give it once, or are refused under
// failRequestsGreaterThanOne with the reason. An annotation that the plan
// does not back (another strategy, another count, a device not given, a
// device the node does not replicate, malformed) refuses the container,
// naming the disagreement, and books nothing.
func TestKubeletReplicas(t *testing.T) {
	p := replicaPath(t, sharing.TimeSlicing, false, sharing.Exclusive)
	pod := &api.PodSandbox{Id: "p-k", Name: "k", Namespace: "ml"}
	ts := "time-slicing:" + uuid(0)
	for _, c := range []*api.Container{
		replicaContainer("a", ts+"=1/4", nil, 0),
		replicaContainer("b", ts+"=1/4", nil, 0),
		replicaContainer("c", "", nil, 0), // no annotation: the plan says shared
		replicaContainer("d", ts+"=2/4", nil, 0),
	} {
		adj, res, err := p.Handle(context.Background(), pod, c)
		if err != nil || res.Holding == nil || res.Holding.Mode != sharing.Shared {
			t.Fatalf("%s: %v, %+v", c.Id, err, res.Holding)
		}
		if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != uuid(0) {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want GPU 0 once", c.Id, got)
		}
	}
	whole := replicaContainer("w", "", nil, 1) // GPU 1 is not replicated: exclusive as the node says
	if _, _, err := p.Handle(context.Background(), pod, whole); err != nil {
		t.Fatal(err)
	}
	const as = "4 time-slicing replicas of nvidia.com/gpu"
	want := "0=shared(replicas)[kubelet:ml/k/a,kubelet:ml/k/b,kubelet:ml/k/c,kubelet:ml/k/d] 1=exclusive[kubelet:ml/k/w] 2=free 3=free 4=free 5=free 6=free 7=free"
	if got := alloc.Summary(p.Table.State()); got != want {
		t.Errorf("table %s\nwant  %s", got, want)
	}
	own := func(id, ann string) *api.Container {
		return &api.Container{Id: id, PodSandboxId: "p-" + id, Name: id, Annotations: map[string]string{"gpus.nri-gpu.dev/container." + id: ann}}
	}
	for _, tc := range []struct {
		ctr  *api.Container
		want string // in the error; "" for GPUs other than 0
	}{
		{own("named", "device=0"), "GPU 0 is shared as " + as + " (devicePlugin.sharing): it is handed out only as the device plugin's replicas, never whole or exclusively"},
		{own("exclusive", "device=0,exclusive=true"), "is handed out only as the device plugin's replicas"},
		{own("count", "count=7"), "shared as the device plugin's replicas: GPU 0: " + as},
		{own("one", "count=1"), ""},
	} {
		opod := &api.PodSandbox{Id: tc.ctr.PodSandboxId, Name: tc.ctr.Id, Namespace: "ml", Annotations: tc.ctr.Annotations}
		_, res, err := p.Handle(context.Background(), opod, tc.ctr)
		switch {
		case tc.want == "" && (err != nil || res.Holding == nil || slices.Contains(res.Holding.GPUs, 0)):
			t.Errorf("%s: %v, %+v", tc.ctr.Id, err, res.Holding)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v; want %q", tc.ctr.Id, err, tc.want)
		}
	}

	strict := replicaPath(t, sharing.TimeSlicing, true, sharing.Shared)
	for _, tc := range []struct {
		name string
		p    *Path
		ctr  *api.Container
		want string
	}{
		{"two replicas, failRequestsGreaterThanOne", strict, replicaContainer("x", ts+"=2/4", nil, 0),
			"maximum request size for shared resources is 1; found 2 (device " + uuid(0) + ", " + as + ", failRequestsGreaterThanOne)"},
		{"another strategy", p, replicaContainer("x", "mps:"+uuid(0)+"=1/4", nil, 0), "says device " + uuid(0) + " is shared as 4 mps replicas, but this node shares it as " + as},
		{"another count", p, replicaContainer("x", ts+"=1/8", nil, 0), "shared as 8 time-slicing replicas, but this node shares it as " + as},
		{"a device not given", p, replicaContainer("x", ts+"=1/4,"+uuid(2)+"=1/4", nil, 0), "names device " + uuid(2) + ", which is not among the devices the kubelet gave the container"},
		{"a device not replicated", p, replicaContainer("x", "time-slicing:"+uuid(2)+"=1/4", nil, 2), "says device " + uuid(2) + " is shared as 4 time-slicing replicas, but this node does not replicate it"},
		{"malformed", p, replicaContainer("x", ts+"=5/4", nil, 0), "is not <uuid>=<given>/<replicas>"},
	} {
		before := alloc.Summary(tc.p.Table.State())
		_, _, err := tc.p.Handle(context.Background(), pod, tc.ctr)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), alloc.KubeletSharedAnnotation("nvidia.com/gpu")) {
			t.Errorf("%s: %v\nwant %q", tc.name, err, tc.want)
		}
		if after := alloc.Summary(tc.p.Table.State()); after != before {
			t.Errorf("%s: the refusal booked: %s", tc.name, after)
		}
	}
}

// mpsPath is replicaPath under MPS with GPU 0's daemon ready, holding
// each client to 25% of the threads and 20389 MiB.
func mpsPath(t *testing.T) *Path {
	p := replicaPath(t, sharing.MPS, true, sharing.Shared)
	sh := p.Shares.Shares[uuid(0)]
	m := *sh.MPS
	m.PinnedMemoryMiB = 20389
	sh.MPS = &m
	p.Shares.Shares[uuid(0)] = sh
	p.Shares, _ = p.Shares.WithMPS(map[string]sharing.MPSStatus{uuid(0): {Ready: true}}, "")
	return p
}

// TestMPSClient: a container the kubelet gave a replica of an MPS GPU gets
// the GPU's pipe directory from nri-gpu's host directory at
// /tmp/nvidia-mps (and not the node-wide one), the daemons' /dev/shm, and
// one replica's limits, whatever the pod spec and image set: applied to
// the container's OCI spec as the runtime applies an adjustment, its
// CUDA_MPS_* are exactly nri-gpu's, any other empty. While the daemon is not ready new
// containers on the GPU are refused with its reason; an MPS replica with
// another GPU is refused.
func TestMPSClient(t *testing.T) {
	p := mpsPath(t)
	d := p.Shares.Shares[uuid(0)].MPS
	pod := &api.PodSandbox{Id: "p-k", Name: "k", Namespace: "ml"}
	podEnv := []string{"PATH=/usr/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G",
		"CUDA_MPS_PIPE_DIRECTORY=/elsewhere", "CUDA_MPS_LOG_DIRECTORY=/tmp/log", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}
	ctr := replicaContainer("m", "mps:"+uuid(0)+"=1/4", podEnv, 0)
	p.EmitCDI, p.RuntimeCDI, p.CDINames = true, true, map[string]string{uuid(0): "nvidia.com/gpu=0"}
	adj, res, err := p.Handle(context.Background(), pod, ctr)
	if err != nil || res.MPS == nil || res.Holding.Mode != sharing.Shared {
		t.Fatalf("%v, %+v", err, res)
	}
	if !strings.HasPrefix(res.Emit, "edits (an MPS client") || len(adj.GetCDIDevices()) != 0 {
		t.Errorf("emit %q, CDI devices %v: an MPS client gets edits", res.Emit, adj.GetCDIDevices())
	}
	mounts := map[string][]string{}
	for _, m := range adj.GetMounts() {
		mounts[m.Destination] = append(mounts[m.Destination], m.Source)
	}
	if got := mounts[inventory.DefaultMPSPipeDir]; !slices.Equal(got, []string{d.PipeDir}) || d.PipeDir != "/run/nri-gpu/mps/"+uuid(0)+"/pipe" {
		t.Errorf("/tmp/nvidia-mps from %v, want %s alone", got, d.PipeDir)
	}
	if got := mounts["/dev/shm"]; !slices.Equal(got, []string{"/run/nri-gpu/mps/shm"}) {
		t.Errorf("/dev/shm from %v", got)
	}
	// The container's environment once the runtime applied the answer
	// (the cluster tests read it in a running container).
	env := applyEnv(podEnv, adj)
	var mps []string
	for _, e := range env {
		if strings.HasPrefix(e, "CUDA_MPS_") {
			mps = append(mps, e)
		}
	}
	slices.Sort(mps)
	if want := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_LOG_DIRECTORY=", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20389M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}; !slices.Equal(mps, want) {
		t.Errorf("the container's CUDA_MPS_* %q\nwant %q", mps, want)
	}
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "LD_LIBRARY_PATH=") }) {
		t.Error("no driver libraries: the MPS part replaced the driver files' answer")
	}

	down, _ := p.Shares.WithMPS(map[string]sharing.MPSStatus{uuid(0): {Why: "the daemon exited (signal: killed)"}}, "")
	p.Shares = down
	_, _, err = p.Handle(context.Background(), pod, replicaContainer("n", "mps:"+uuid(0)+"=1/4", nil, 0))
	if want := "its MPS control daemon is not ready (the daemon exited (signal: killed)): new containers on it are refused until nri-gpu mps reports it ready"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("daemon down: %v\nwant %q", err, want)
	}
	if h := p.Table.Holdings(); len(h) != 1 || h[0].Holder.ID != "m" {
		t.Errorf("holdings after the refusal: %+v (the running client keeps its own)", h)
	}
	p = mpsPath(t)
	_, _, err = p.Handle(context.Background(), pod, replicaContainer("two", "mps:"+uuid(0)+"=1/4", nil, 0, 1))
	if want := "a container gets replicas of one MPS GPU and nothing else"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("an MPS replica and a whole GPU: %v", err)
	}
}

// applyEnv applies adj's environment to env as NRI's runtime side does
// (pkg/runtime-tools/generate, AdjustEnv): a key set replaces the
// container's value where it has one, a key marked for removal goes
// (which NRI's adaptation does not pass on: mpsClient sets none).
func applyEnv(env []string, adj *api.ContainerAdjustment) []string {
	mod := map[string]*api.KeyValue{}
	for _, kv := range adj.GetEnv() {
		k, _ := api.IsMarkedForRemoval(kv.Key)
		mod[k] = kv
	}
	var out []string
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		m, ok := mod[k]
		if !ok {
			out = append(out, e)
			continue
		}
		delete(mod, k)
		if _, removed := m.IsMarkedForRemoval(); !removed {
			out = append(out, m.Key+"="+m.Value)
		}
	}
	for _, kv := range adj.GetEnv() {
		if _, removed := kv.IsMarkedForRemoval(); !removed && mod[kv.Key] == kv {
			out = append(out, kv.Key+"="+kv.Value)
		}
	}
	return out
}
