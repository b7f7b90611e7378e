package deviceplugin

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// GetPreferredAllocation ranks, for each container, the devices the
// kubelet may give it: whole GPUs by topology (prefer), replicas of shared
// GPUs by the allocation policy (preferReplicas).
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	known, policy := p.devices.snapshot()
	gpus := make(map[string]inventory.GPU, len(known))
	for id, e := range known {
		gpus[id] = e.gpu
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		available, must, size := cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize())
		var ids []string
		if slices.ContainsFunc(available, func(id string) bool { return known[id].share != nil }) {
			ids = preferReplicas(known, policy, available, must, size)
		} else {
			ids = prefer(gpus, available, must, size)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// preferReplicas picks size devices among available, with every one of
// must, as NVIDIA's device plugin does for replicas: the devices that
// must be included first, then one at a time the free replica of the GPU
// that has the fewest of its replicas given out (distributed) or the most
// (packed), counting those given out by this pick; among equals the GPU
// this pick took the fewest from, then the first advertised. Under MPS a
// container reaches one daemon, so there the GPUs this pick already took
// from come first whatever the policy. IDs that are no device of the
// resource are passed over.
func preferReplicas(known map[string]entry, policy string, available, must []string, size int) []string {
	taken := map[string]bool{}
	var out []string
	picked := map[string]int{} // by GPU, in this pick
	for _, id := range must {
		if !taken[id] {
			taken[id] = true
			out = append(out, id)
			picked[known[id].gpu.ID()]++
		}
	}
	free := map[string]int{} // free replicas by GPU
	var candidates []string
	for _, id := range available {
		if e, ok := known[id]; ok && !taken[id] {
			taken[id] = true
			candidates = append(candidates, id)
			free[e.gpu.ID()]++
		}
	}
	givenOut := func(id string) int {
		e := known[id]
		replicas := 1
		if e.share != nil {
			replicas = e.share.Replicas
		}
		return replicas - free[e.gpu.ID()]
	}
	for len(out) < size && len(candidates) > 0 {
		best := 0
		for i := 1; i < len(candidates); i++ {
			if better(known, policy, picked, givenOut, candidates[i], candidates[best]) {
				best = i
			}
		}
		id := candidates[best]
		candidates = slices.Delete(candidates, best, best+1)
		out = append(out, id)
		g := known[id].gpu.ID()
		picked[g]++
		free[g]--
	}
	return out
}

// better reports whether replica a is to be picked before b.
func better(known map[string]entry, policy string, picked map[string]int, givenOut func(string) int, a, b string) bool {
	ga, gb := known[a].gpu.ID(), known[b].gpu.ID()
	if sh := known[a].share; sh != nil && sh.Strategy == sharing.MPS && (picked[ga] > 0) != (picked[gb] > 0) {
		return picked[ga] > 0
	}
	if oa, ob := givenOut(a), givenOut(b); oa != ob {
		if policy == config.PolicyPacked {
			return oa > ob
		}
		return oa < ob
	}
	if picked[ga] != picked[gb] {
		return picked[ga] < picked[gb]
	}
	return false
}

// prefer picks size GPUs among available, with every one of must, by this
// rule (docs/design.md, "Preferred allocation"):
//
//  1. the GPUs that must be included, first;
//  2. then GPUs of one NUMA node: the node that already holds most of the
//     GPUs that must be included; else the node whose free GPUs are enough
//     for the rest, with the fewest free GPUs (so that larger groups stay
//     whole for larger requests); else the node with the most free GPUs,
//     and again for what is left; ties go to the lower node number, and
//     GPUs of unknown NUMA node form a group of their own that comes last
//     among equals;
//  3. within a node, the GPUs nearest each other (and the included ones)
//     by PCI bus id: the run of consecutive free GPUs, in bus id order,
//     whose bus ids span least; ties go to the lowest bus id.
//
// IDs that are no GPU of the node are passed over. It returns fewer than
// size IDs only when available has fewer.
func prefer(gpus map[string]inventory.GPU, available, must []string, size int) []string {
	taken := map[string]bool{}
	var out []string
	mustOn := map[int][]uint64{} // bus keys of the included GPUs, by NUMA node
	for _, id := range must {
		if taken[id] {
			continue
		}
		taken[id] = true
		out = append(out, id)
		if g, ok := gpus[id]; ok {
			mustOn[g.NUMANode] = append(mustOn[g.NUMANode], busKey(g))
		}
	}
	groups := map[int][]inventory.GPU{}
	for _, id := range available {
		g, ok := gpus[id]
		if !ok || taken[id] {
			continue
		}
		taken[id] = true
		groups[g.NUMANode] = append(groups[g.NUMANode], g)
	}
	for n := range groups {
		slices.SortFunc(groups[n], func(a, b inventory.GPU) int {
			return cmp.Or(cmp.Compare(busKey(a), busKey(b)), strings.Compare(a.ID(), b.ID()))
		})
	}
	for left := size - len(out); left > 0 && len(groups) > 0; {
		n := bestGroup(groups, mustOn, left)
		g := groups[n]
		k := min(left, len(g))
		for _, c := range nearest(g, k, mustOn[n]) {
			out = append(out, c.ID())
		}
		delete(groups, n)
		left -= k
	}
	return out
}

// bestGroup returns the NUMA node whose GPUs to take next for left more
// GPUs (rule 2 of prefer).
func bestGroup(groups map[int][]inventory.GPU, mustOn map[int][]uint64, left int) int {
	nodes := make([]int, 0, len(groups))
	for n := range groups {
		nodes = append(nodes, n)
	}
	slices.SortFunc(nodes, func(a, b int) int {
		la, lb := len(groups[a]), len(groups[b])
		fa, fb := la >= left, lb >= left
		c := cmp.Compare(len(mustOn[b]), len(mustOn[a])) // more included GPUs first
		if c == 0 && fa != fb {
			c = map[bool]int{true: -1, false: 1}[fa] // a node that fits first
		}
		if c == 0 && fa {
			c = cmp.Compare(la, lb) // the tightest fit
		}
		if c == 0 && !fa {
			c = cmp.Compare(lb, la) // the most GPUs
		}
		if c == 0 && (a < 0) != (b < 0) {
			c = map[bool]int{true: 1, false: -1}[a < 0] // unknown NUMA node last
		}
		return cmp.Or(c, cmp.Compare(a, b))
	})
	return nodes[0]
}

// nearest returns the k GPUs of g (sorted by bus id) whose bus ids, with
// those of the included GPUs inc, span least (rule 3 of prefer).
func nearest(g []inventory.GPU, k int, inc []uint64) []inventory.GPU {
	if k >= len(g) {
		return g
	}
	best, bestSpan := 0, uint64(0)
	for i := 0; i+k <= len(g); i++ {
		lo, hi := busKey(g[i]), busKey(g[i+k-1])
		for _, b := range inc {
			lo, hi = min(lo, b), max(hi, b)
		}
		if span := hi - lo; i == 0 || span < bestSpan {
			best, bestSpan = i, span
		}
	}
	return g[best : best+k]
}

// busKey orders PCI bus ids ("0000:38:00.0") as numbers: domain, bus,
// device, function. A GPU without one (another vendor's CDI device) is 0.
func busKey(g inventory.GPU) uint64 {
	dom, rest, ok := strings.Cut(g.BusID, ":")
	if !ok {
		return 0
	}
	bus, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return 0
	}
	dev, fn, ok := strings.Cut(rest, ".")
	if !ok {
		return 0
	}
	var key uint64
	for _, p := range []struct {
		s    string
		bits int
	}{{dom, 16}, {bus, 8}, {dev, 5}, {fn, 3}} {
		v, err := strconv.ParseUint(p.s, 16, p.bits)
		if err != nil {
			return 0
		}
		key = key<<p.bits | v
	}
	return key
}
