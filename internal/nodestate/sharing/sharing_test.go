package sharing_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// parse returns the devicePlugin key of a configuration.
func parse(t *testing.T, yaml string) config.DevicePlugin {
	t.Helper()
	c, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c.DevicePlugin
}

// advertised lists "resource=UUIDxreplicas" for each unit of p, with the
// UUIDs cut to their first 12 characters.
func advertised(p *sharing.Plan) []string {
	var out []string
	for _, u := range p.Units {
		out = append(out, fmt.Sprintf("%s=%sx%d", u.Resource, u.GPU.ID()[:12], u.Replicas))
	}
	return out
}

// TestPlan checks which resource each device is advertised as, as how
// many replicas: every GPU under devices: all; the first N under a
// count; listed ones (index, UUID) under a list, the others whole under
// the base name; renameByDefault and rename; MIG devices of one profile
// under migStrategy mixed.
func TestPlan(t *testing.T) {
	snap := simnode.MemorySnapshot()
	gpu := func(i int) string { return snap.GPUs[i].UUID[:12] }
	ts := func(extra string) string {
		return "devicePlugin:\n  enabled: true\n" + extra
	}
	for _, tc := range []struct {
		name, yaml string
		snap       *inventory.Snapshot
		want       []string
		warnings   []string
	}{
		{"no sharing", ts(""), snap, []string{"nvidia.com/gpu=" + gpu(0) + "x1", "nvidia.com/gpu=" + gpu(1) + "x1"}, nil},
		{"all, 4 replicas", ts("  sharing:\n    timeSlicing:\n      resources: [{name: nvidia.com/gpu, replicas: 4}]\n"), snap,
			[]string{"nvidia.com/gpu=" + gpu(0) + "x4", "nvidia.com/gpu=" + gpu(1) + "x4"}, nil},
		{"a count, renamed by default", ts("  sharing:\n    timeSlicing:\n      renameByDefault: true\n      resources: [{name: nvidia.com/gpu, replicas: 2, devices: 1}]\n"), snap,
			[]string{"nvidia.com/gpu.shared=" + gpu(0) + "x2", "nvidia.com/gpu=" + gpu(1) + "x1"}, nil},
		{"a list by UUID and index, renamed", ts("  sharing:\n    timeSlicing:\n      resources: [{name: nvidia.com/gpu, rename: example.com/ts, replicas: 3, devices: [\"" + snap.GPUs[1].UUID + "\", 0, 7]}]\n"), snap,
			[]string{"example.com/ts=" + gpu(0) + "x3", "example.com/ts=" + gpu(1) + "x3"},
			[]string{"devicePlugin.sharing.timeSlicing.resources[0].devices: 7 names no device of nvidia.com/gpu on this node: not replicated"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := *tc.snap
			s.GPUs = s.GPUs[:2]
			p := sharing.NewPlan(parse(t, tc.yaml).SharingSpec(), s.Units())
			if d := cmp.Diff(tc.want, advertised(p)); d != "" {
				t.Errorf("advertised (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.warnings, p.Warnings); d != "" {
				t.Errorf("warnings (-want +got):\n%s", d)
			}
		})
	}

	mig := simnode.MemoryMIGSnapshot()
	p := sharing.NewPlan(parse(t, "devicePlugin:\n  enabled: true\n  migStrategy: mixed\n  sharing:\n    timeSlicing:\n      renameByDefault: true\n      resources: [{name: nvidia.com/mig-2g.20gb, replicas: 2, devices: [\"1:1\"]}]\n").SharingSpec(), mig.Units())
	if d := cmp.Diff([]string{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-2g.20gb.shared"}, sortedResources(p)); d != "" {
		t.Errorf("MIG resources (-want +got):\n%s", d)
	}
	m := mig.MIG[8] // 1:1, a 2g.20gb
	if sh, ok := p.Share(m.UUID); !ok || sh.Resource != "nvidia.com/mig-2g.20gb.shared" || sh.Replicas != 2 || sh.MPS != nil || sh.FailRequestsGreaterThanOne {
		t.Errorf("MIG device 1:1: %+v, %v", sh, ok)
	}
	if _, ok := p.Share(mig.MIG[7].UUID); ok {
		t.Errorf("MIG device 1:0 shared, not listed")
	}
}

func sortedResources(p *sharing.Plan) []string {
	r := p.Resources()
	slices.Sort(r)
	return r
}

// TestPlanMPS checks the MPS daemon planned per GPU: its directories
// under mpsRoot, the limits of one replica (100/replicas percent of the
// threads, memory/replicas MiB; no memory limit where NVML gave no
// memory), not ready until WithMPS says so, and WithMPS leaving the plan
// it copies alone.
func TestPlanMPS(t *testing.T) {
	snap := simnode.MemorySnapshot()
	units := snap.Units()[:2]
	units[0].MemoryMiB = 81559
	c := parse(t, "devicePlugin:\n  enabled: true\n  mpsRoot: /run/mps\n  sharing:\n    mps:\n      resources: [{name: nvidia.com/gpu, replicas: 3}]\n")
	p := sharing.NewPlan(c.SharingSpec(), units)
	want := map[string]sharing.Share{
		units[0].UUID: {UUID: units[0].UUID, Resource: "nvidia.com/gpu", Strategy: "mps", Replicas: 3, FailRequestsGreaterThanOne: true, MPS: &sharing.MPSDaemon{
			PipeDir: "/run/mps/" + units[0].UUID + "/pipe", LogDir: "/run/mps/" + units[0].UUID + "/log", ShmDir: "/run/mps/shm",
			MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: 33, PinnedMemoryMiB: 27186}, Why: "nri-gpu mps has not reported the MPS control daemon ready"}},
		units[1].UUID: {UUID: units[1].UUID, Resource: "nvidia.com/gpu", Strategy: "mps", Replicas: 3, FailRequestsGreaterThanOne: true, MPS: &sharing.MPSDaemon{
			PipeDir: "/run/mps/" + units[1].UUID + "/pipe", LogDir: "/run/mps/" + units[1].UUID + "/log", ShmDir: "/run/mps/shm",
			MPSLimits: sharing.MPSLimits{ActiveThreadPercentage: 33}, Why: "nri-gpu mps has not reported the MPS control daemon ready"}},
	}
	if d := cmp.Diff(want, p.Shares); d != "" {
		t.Errorf("shares (-want +got):\n%s", d)
	}
	if th, mem := p.Shares[units[0].UUID].MPS.Limits(); th != "33" || mem != "27186M" {
		t.Errorf("limits %q %q", th, mem)
	}
	if th, mem := p.Shares[units[1].UUID].MPS.Limits(); th != "33" || mem != "" {
		t.Errorf("limits without memory %q %q", th, mem)
	}
	q, changed := p.WithMPS(map[string]sharing.MPSStatus{units[0].UUID: {Ready: true, Why: "ignored"}}, "no report")
	if !changed || !q.Shares[units[0].UUID].MPS.Ready || q.Shares[units[0].UUID].MPS.Why != "" || q.Shares[units[1].UUID].MPS.Why != "no report" {
		t.Errorf("WithMPS: %+v %+v, changed %v", q.Shares[units[0].UUID].MPS, q.Shares[units[1].UUID].MPS, changed)
	}
	if p.Shares[units[0].UUID].MPS.Ready {
		t.Error("WithMPS modified the plan it copied")
	}
	if _, changed := q.WithMPS(map[string]sharing.MPSStatus{units[0].UUID: {Ready: true}}, "no report"); changed {
		t.Error("WithMPS with the same status says it changed")
	}
	if n := len(q.MPSDaemons()); n != 2 {
		t.Errorf("%d daemons", n)
	}
}

// TestReplicaID checks replica device IDs: <uuid>::<n>, and what is not
// one.
func TestReplicaID(t *testing.T) {
	if id := sharing.ReplicaID("GPU-a", 3); id != "GPU-a::3" {
		t.Errorf("ReplicaID = %q", id)
	}
	for _, tc := range []struct {
		id   string
		uuid string
		n    int
		ok   bool
	}{
		{"GPU-a::0", "GPU-a", 0, true},
		{"GPU-a::12", "GPU-a", 12, true},
		{"GPU-a", "", 0, false},
		{"GPU-a::", "", 0, false},
		{"::1", "", 0, false},
		{"GPU-a::-1", "", 0, false},
		{"GPU-a::+1", "", 0, false},
		{"GPU-a::01", "", 0, false},
		{"GPU-a::1x", "", 0, false},
		{"GPU-a::99999", "", 0, false},
	} {
		uuid, n, ok := sharing.SplitReplicaID(tc.id)
		if uuid != tc.uuid || n != tc.n || ok != tc.ok {
			t.Errorf("SplitReplicaID(%q) = %q, %d, %v; want %q, %d, %v", tc.id, uuid, n, ok, tc.uuid, tc.n, tc.ok)
		}
	}
}
