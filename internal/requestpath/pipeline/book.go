package pipeline

import (
	"fmt"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// runtimeSource names the runtime's own devices in the table's refusals.
const runtimeSource = "the GPUs the runtime gave the container (device plugin, --device or CDI)"

// kubeletSource is the source of the kubelet's assignments.
var kubeletSource = request.Source{Kind: request.Kubelet, Key: alloc.KubeletAnnotation}

// givenHolding is the holding of the GPUs the runtime gave a container
// besides its claims' (given.gpus), for holder h: the runtime's choice
// (alloc.Holding.Runtime), so that no count request hands them out again,
// on a shared node either; the kubelet's where they are its assignment;
// in the node's sharing mode, or shared where every one of them is shared
// as the device plugin's replicas. CreateContainer books it (bookGiven)
// and Synchronize rebuilds it (Holdings): one function, one holding.
func (p *Path) givenHolding(h alloc.Holder, g given) alloc.Holding {
	mode := p.Sharing
	if p.replicated(g.gpus) {
		mode = sharing.Shared
	}
	return alloc.Holding{Holder: h, Mode: mode, GPUs: indexes(g.gpus), Kubelet: g.kubelet, Runtime: len(g.gpus) > 0}
}

// replicated reports whether the node's sharing plan shares every one of
// gpus as the device plugin's replicas (none: false).
func (p *Path) replicated(gpus []inventory.GPU) bool {
	for _, g := range gpus {
		if _, ok := p.Shares.Share(g.ID()); !ok {
			return false
		}
	}
	return len(gpus) > 0
}

// bookGiven books what the runtime gave the container: its claims'
// devices, by claim (joinClaims), and the GPUs besides them
// (givenHolding), which the container keeps exactly. A conflict with an
// exclusive holding, or a GPU a claim holds (alloc: only its claim
// reaches it), refuses the container, naming the holder, as for any
// request.
func (p *Path) bookGiven(c *call, g given) (*alloc.Holding, []alloc.Holding, error) {
	held, err := p.joinClaims(g.claims)
	if err != nil || len(g.gpus) == 0 {
		return nil, held, err
	}
	h := p.givenHolding(HolderOf(c.pod, c.ctr), g)
	source := runtimeSource
	if h.Kubelet {
		source = kubeletSource.String()
	}
	got, err := p.Table.Allocate(alloc.Request{Holder: h.Holder, Mode: h.Mode, GPUs: h.GPUs, Source: source, Kubelet: h.Kubelet, Runtime: true})
	if err != nil {
		return nil, held, err
	}
	h.GPUs = got
	return &h, held, nil
}

// givenNote is the note of a container whose GPUs the runtime gave and
// which carries no request: booked, nothing injected.
func givenNote(h *alloc.Holding) string {
	return fmt.Sprintf("the runtime gives the container GPUs %s: booked (%s) as the runtime's choice", indices(h.GPUs), h.Mode)
}

// book books the GPUs the request names or, for a count, those the table
// picks, and returns the GPUs the container gets, its holding and the
// booking's record (none, the zero Record, when nothing was booked: a
// request for the driver alone). A pod-level request (gpus.nri-gpu.dev/pod: a count or
// named GPUs) is the pod's: booked once, by its first container, for the
// pod (alloc.PodHolder), and every later container of the pod joins that
// holding and gets its GPUs, so that an exclusive pod-level request does
// not refuse the pod's own sidecar.
func (p *Path) book(c *call, r request.Request, sel request.Selection) ([]inventory.GPU, *alloc.Holding, alloc.Record, error) {
	if sel.Count == 0 && len(sel.GPUs) == 0 {
		return sel.GPUs, nil, alloc.Record{}, nil
	}
	mode := p.Sharing
	if x := r.Exclusive; x != nil {
		mode = sharing.Shared
		if *x {
			mode = sharing.Exclusive
		}
	}
	req := alloc.Request{Holder: HolderOf(c.pod, c.ctr), Mode: mode, Count: sel.Count, Source: r.Source.String(), GPUs: indexes(sel.GPUs)}
	podLevel := r.Source.Kind == request.PodAnnotation
	var got []int
	var err error
	if podLevel {
		req.Member = req.Holder.ID
		req.Holder = alloc.PodHolder(req.Holder.PodID, req.Holder.Namespace, req.Holder.Pod)
		var h alloc.Holding
		h, _, err = p.Table.Join(req)
		got, mode = h.GPUs, h.Mode
	} else {
		got, err = p.Table.Allocate(req)
	}
	if err != nil {
		return nil, nil, alloc.Record{}, err
	}
	gpus := sel.GPUs
	if sel.Count > 0 {
		// Named GPUs keep the order the user gave; picked ones come in
		// index order.
		gpus = byIndex(p.Source.Devices(), got)
	}
	rec := alloc.Record{Mode: mode.String(), Pod: podLevel, GPUs: make([]string, 0, len(gpus))}
	for _, g := range gpus {
		rec.GPUs = append(rec.GPUs, g.ID())
	}
	return gpus, &alloc.Holding{Holder: req.Holder, Mode: mode, GPUs: got}, rec, nil
}

// checkManagement refuses a management container where it would reach a
// GPU that another container holds exclusively. It books nothing: a
// monitoring agent that held every GPU shared would keep every exclusive
// request off the node. (A management container that is already running
// when an exclusive holder comes keeps its view: management namespaces
// are the operator's, policy.managementNamespaces.) Its answer carries a
// record of no GPU, which says so, so that Synchronize does not take the
// GPU nodes it was given for the runtime's.
func (p *Path) checkManagement(c *call, r request.Request, sel request.Selection) (alloc.Record, error) {
	err := p.Table.Check(alloc.Request{Holder: HolderOf(c.pod, c.ctr), Mode: sharing.Shared, Source: r.Source.String(), GPUs: indexes(sel.GPUs)})
	return alloc.Record{Mode: sharing.Shared.String(), GPUs: []string{}}, err
}

// indices writes GPU indices as "0, 2".
func indices(idx []int) string {
	s := make([]string, len(idx))
	for i, g := range idx {
		s[i] = inventory.UnitLabel(g)
	}
	return strings.Join(s, ", ")
}

// indexes returns the GPUs' indices, in their order.
func indexes(gs []inventory.GPU) []int {
	out := make([]int, 0, len(gs))
	for _, g := range gs {
		out = append(out, g.Index)
	}
	return out
}

// byIndex returns the devices of the given indices, in that order.
func byIndex(devs []inventory.GPU, idx []int) []inventory.GPU {
	out := make([]inventory.GPU, 0, len(idx))
	for _, i := range idx {
		for _, g := range devs {
			if g.Index == i {
				out = append(out, g)
				break
			}
		}
	}
	return out
}
