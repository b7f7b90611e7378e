package pipeline

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// claimed is a device of a prepared claim that a container holds, with
// the unit of the inventory it is.
type claimed struct {
	dev  claims.Device
	unit inventory.GPU
}

// claimedDevices returns the prepared claim devices (p.Claims) the
// container holds (heldClaims); an environment entry that is not backed
// is reported in a warning, and the container is classified as if it did
// not have it.
func (p *Path) claimedDevices(c *call) []claimed {
	held, forged := heldClaims(p.Source, p.Claims, c.ctr)
	if len(forged) > 0 {
		c.res.Warnings = append(c.res.Warnings, forgedWarning(forged))
	}
	return held
}

// heldClaims returns the devices of the prepared claims prep that the
// container holds: those whose environment entry (claims.EnvKey, which
// the claim's CDI spec sets) names their claim, and whose identifying
// device node the container has from the runtime, by path
// (claims.Prepared.ForContainer) and by number (hasGPUNode). The entries
// alone are no proof: a pod author can write them; device nodes they
// cannot add. An entry that is not backed so, or that names a device the
// inventory no longer has, holds nothing: it is returned in forged.
// Linear in the environment (nothing is read beyond
// request.MaxEnvEntries entries: the request's own steps refuse more) and
// the device nodes.
func heldClaims(src adjust.Source, prep *claims.Prepared, ctr *api.Container) (held []claimed, forged []string) {
	env := ctr.GetEnv()
	if prep == nil || len(env) > request.MaxEnvEntries {
		return nil, nil
	}
	devs := ctr.GetLinux().GetDevices()
	nodes := make([]string, 0, len(devs))
	for _, d := range devs {
		if strings.HasPrefix(d.GetPath(), "/dev/nvidia") {
			nodes = append(nodes, d.GetPath())
		}
	}
	ds, forged := prep.ForContainer(env, nodes)
	for _, d := range ds {
		g, ok := findGPU(src.Devices(), d.UUID)
		switch {
		case !ok:
			forged = append(forged, claims.EnvKey(d.Name)+"="+d.Claim.UID+" (device "+d.Name+", "+d.UUID+", is not in the inventory now)")
		case !hasGPUNode(ctr, g):
			forged = append(forged, claims.EnvKey(d.Name)+"="+d.Claim.UID+" (the container's "+d.Node+" is not the device's node by number)")
		default:
			held = append(held, claimed{dev: d, unit: g})
		}
	}
	return held, forged
}

// forgedWarning says that environment entries of claims were ignored.
func forgedWarning(forged []string) string {
	return "environment " + few(forged) + " ignored: names no device of a prepared claim whose device node the runtime gave the container; " +
		"nothing is booked or injected for it"
}

// claimSource names the claims of held in messages: "claim ml/train",
// "claim ml/train, ml/probe".
func claimSource(held []claimed) request.Source {
	var names []string
	for _, h := range held {
		n := h.dev.Claim.Namespace + "/" + h.dev.Claim.Name
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return request.Source{Kind: request.Claim, Key: strings.Join(names, ", ")}
}

// bookClaims books the claims' devices by claim, once whichever
// containers and pods use them (alloc.ClaimHolder, Table.Join): the
// plugin books a claim when it is prepared (Table.SyncClaims), so this
// finds it booked, or books it where it was not. A device of an
// adminAccess request is not held. A GPU the runtime gave the container
// besides the claims' (a device plugin's) is booked as the runtime's
// choice for the container (bookGiven). A conflict with an exclusive
// holding refuses the container, naming the holder.
func (p *Path) bookClaims(c *call, gv given, held []claimed) error {
	if err := c.live(); err != nil {
		return err
	}
	byClaim := map[string][]int{}
	shared := map[string]bool{}
	var order []claims.Claim
	for _, h := range held {
		if h.dev.AdminAccess {
			continue
		}
		if _, ok := byClaim[h.dev.Claim.UID]; !ok {
			order = append(order, h.dev.Claim)
		}
		byClaim[h.dev.Claim.UID] = append(byClaim[h.dev.Claim.UID], h.unit.Index)
		shared[h.dev.Claim.UID] = shared[h.dev.Claim.UID] || h.dev.Share.Partial()
	}
	for _, cl := range order {
		hd := alloc.ClaimHolder(cl.UID, cl.Namespace, cl.Name)
		h, _, err := p.Table.Join(alloc.Request{Holder: hd, Mode: claimMode(p.Sharing, shared[cl.UID]), GPUs: byClaim[cl.UID], Source: hd.String(), Runtime: true})
		if err != nil {
			return err
		}
		h.Runtime = true
		c.res.Claims = append(c.res.Claims, h)
	}
	var extra []int
	for _, g := range gv.gpus {
		if !slices.ContainsFunc(held, func(h claimed) bool { return h.unit.Index == g.Index }) {
			extra = append(extra, g.Index)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	return p.bookGiven(c, extra, false)
}

// claimRequest is the request of a container that prepared claims gave
// devices: those devices, with the driver capabilities of its
// NVIDIA_DRIVER_CAPABILITIES (request.ClaimRequest).
func (p *Path) claimRequest(c *call, held []claimed) (request.Request, error) {
	if err := c.live(); err != nil {
		return request.Request{}, err
	}
	ids := make([]string, 0, len(held))
	for _, h := range held {
		if !slices.Contains(ids, h.unit.UUID) {
			ids = append(ids, h.unit.UUID)
		}
	}
	err := request.CheckMounts(len(c.ctr.GetMounts()))
	if err == nil {
		c.res.Request, err = request.ClaimRequest(claimSource(held).Key, ids, c.ctr.GetEnv())
	}
	return c.res.Request, err
}

// keepClaimed returns the devices the container gets: those whose device
// nodes the runtime gave it (the claims' and any other), whatever the
// request named, in index order; for a privileged container, whose nodes
// say nothing, the claims' devices.
func (p *Path) keepClaimed(c *call, gv given, held []claimed) []inventory.GPU {
	if !gv.every {
		c.res.GPUs = gv.gpus
		return c.res.GPUs
	}
	var gpus []inventory.GPU
	for _, h := range held {
		if !slices.ContainsFunc(gpus, func(g inventory.GPU) bool { return g.Index == h.unit.Index }) {
			gpus = append(gpus, h.unit)
		}
	}
	slices.SortFunc(gpus, func(a, b inventory.GPU) int { return a.Index - b.Index })
	c.res.GPUs = gpus
	return gpus
}

// claimMode is the mode a claim is booked in: shared where it holds a
// share of a GPU's memory (claims.Share.Partial), whatever the node's
// mode, since the scheduler puts other claims' shares on that GPU; else
// the node's.
func claimMode(node sharing.Mode, share bool) sharing.Mode {
	if share {
		return sharing.Shared
	}
	return node
}

// ClaimHoldings returns what the prepared claims hold in the allocation
// table: one holding per claim (alloc.ClaimHolder) of its devices that
// are not of an adminAccess request, in the node's sharing mode (shared
// for a claim with a share of a GPU's memory, claimMode) and marked as
// the runtime's (a count never gets them), whichever containers
// use them. A device the inventory does not have holds nothing and is
// reported. The plugin books them when a claim is prepared and at every
// Synchronize (alloc.Table.SyncClaims), so that node-local requests see a
// claim's devices as held before its first container exists.
func ClaimHoldings(src adjust.Source, mode sharing.Mode, prep *claims.Prepared) ([]alloc.Holding, []string) {
	devs := src.Devices()
	var hs []alloc.Holding
	var warnings []string
	at := map[string]int{}
	for _, d := range prep.Devices() {
		if d.AdminAccess {
			continue
		}
		g, ok := findGPU(devs, d.UUID)
		if !ok {
			warnings = append(warnings, fmt.Sprintf("claim %s/%s: device %s (%s) is not in the inventory: not booked", d.Claim.Namespace, d.Claim.Name, d.Name, d.UUID))
			continue
		}
		i, ok := at[d.Claim.UID]
		if !ok {
			i = len(hs)
			at[d.Claim.UID] = i
			hs = append(hs, alloc.Holding{Holder: alloc.ClaimHolder(d.Claim.UID, d.Claim.Namespace, d.Claim.Name), Mode: mode, Runtime: true})
		}
		hs[i].Mode = claimMode(hs[i].Mode, d.Share.Partial())
		if !slices.Contains(hs[i].GPUs, g.Index) {
			hs[i].GPUs = append(hs[i].GPUs, g.Index)
		}
	}
	for i := range hs {
		slices.Sort(hs[i].GPUs)
	}
	return hs, warnings
}

// claimMPS returns the MPS share the container is a client of through
// its claims (a device whose claim's GpuConfig asks for sharing strategy
// MPS), or nil. Such a container holds that one device and no other
// (the driver prepares an MPS claim with one device; another claim's or
// the runtime's device beside it is refused, as an MPS client reaches one
// daemon), and only while the daemon is ready.
func (p *Path) claimMPS(c *call, gv given, held []claimed) (*sharing.Share, error) {
	var with []claimed
	for _, h := range held {
		if h.dev.MPS != nil {
			with = append(with, h)
		}
	}
	if len(with) == 0 {
		return nil, nil
	}
	h := with[0]
	src := request.Source{Kind: request.Claim, Key: h.dev.Claim.Namespace + "/" + h.dev.Claim.Name}
	extra := len(held) > 1
	for _, g := range gv.gpus {
		extra = extra || g.ID() != h.dev.UUID
	}
	if extra {
		return nil, &request.Error{Source: src, Msg: fmt.Sprintf("device %s is shared with MPS, and the container has other GPUs beside it: "+
			"an MPS client reaches the GPU of one MPS control daemon only (CUDA_MPS_PIPE_DIRECTORY), so a container gets one MPS GPU and nothing else", h.dev.Name)}
	}
	m := h.dev.MPS
	if !m.Ready {
		return nil, &request.Error{Source: src, Msg: fmt.Sprintf("device %s (%s) is shared with MPS and its MPS control daemon is not ready (%s): "+
			"new containers on it are refused until nri-gpu mps reports it ready; running ones keep their pipe", h.dev.Name, h.dev.UUID, m.Why)}
	}
	sh := &sharing.Share{UUID: h.dev.UUID, Resource: "claim " + src.Key, Strategy: sharing.MPS, Replicas: 1, MPS: m}
	c.res.MPS = sh
	return sh, nil
}
