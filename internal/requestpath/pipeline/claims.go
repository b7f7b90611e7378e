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

// staleClaim is a claim device that a container has (its environment
// entry and its identifying node) whose GPU is not the one it was
// prepared on: gone from the inventory, or another GPU at its node (now,
// where at is set).
type staleClaim struct {
	dev claims.Device
	now inventory.GPU
	at  bool
	why string
}

// heldClaims returns the devices of the prepared claims prep that the
// container of a pod in namespace ns holds: those whose environment entry
// (claims.EnvKey, which the claim's CDI spec sets) names their claim,
// whose claim is of the pod's namespace, and whose identifying device
// node the container has from the runtime, by path
// (claims.Prepared.ForContainer) and by number (hasGPUNode). The entries
// alone are no proof: a pod author can write them; device nodes they
// cannot add, unless privileged (every node of the host), so a
// privileged container holds none. A device whose node the container has
// but which is not the GPU it was prepared on (identity: gone, or another
// GPU at its node after a driver reload or a swap) is stale. Every other
// entry holds nothing and is returned in forged. Linear in the
// environment (nothing is read beyond request.MaxEnvEntries entries: the
// request's own steps refuse more) and the device nodes.
func heldClaims(devs []inventory.GPU, prep *claims.Prepared, ns string, ctr *api.Container, privileged bool) (held []claimed, stale []staleClaim, forged []string) {
	env := ctr.GetEnv()
	if prep == nil || len(env) > request.MaxEnvEntries {
		return nil, nil, nil
	}
	cds := ctr.GetLinux().GetDevices()
	nodes := make([]string, 0, len(cds))
	for _, d := range cds {
		if strings.HasPrefix(d.GetPath(), "/dev/nvidia") {
			nodes = append(nodes, d.GetPath())
		}
	}
	ds, forged := prep.ForContainer(env, nodes)
	for _, d := range ds {
		entry := func() string { return claims.EnvKey(d.Name) + "=" + d.Claim.UID }
		if privileged {
			forged = append(forged, entry()+" (the container is privileged: its device nodes prove nothing)")
			continue
		}
		if d.Claim.Namespace != ns {
			forged = append(forged, entry()+" (claim "+d.Claim.Namespace+"/"+d.Claim.Name+" is not of the pod's namespace "+ns+")")
			continue
		}
		now, at, why := identity(devs, d)
		switch {
		case why != "":
			stale = append(stale, staleClaim{dev: d, now: now, at: at, why: why})
		case !hasGPUNode(ctr, now):
			forged = append(forged, entry()+" (the container's "+d.Node+" is not the device's node by number)")
		default:
			held = append(held, claimed{dev: d, unit: now})
		}
	}
	return held, stale, forged
}

// forgedWarning says that environment entries of claims were ignored.
func forgedWarning(forged []string) string {
	return "environment " + few(forged) + " ignored: names no device of a prepared claim of the pod's namespace whose device node the runtime gave the container; " +
		"nothing is booked or injected for it"
}

// staleWarnings say, for Synchronize, that the stale claim devices of a
// container book nothing.
func staleWarnings(stale []staleClaim) []string {
	out := make([]string, 0, len(stale))
	for _, s := range stale {
		out = append(out, "claim "+s.dev.Claim.Namespace+"/"+s.dev.Claim.Name+": "+s.why+": nothing booked for it")
	}
	return out
}

// stale refuses a container whose claim devices are not the GPUs they
// were prepared on (heldClaims): what its claim holds is not what its
// device node reaches, so nothing is injected or booked; the claim must
// be prepared again.
func (p *Path) stale(g given) error {
	if len(g.stale) == 0 {
		return nil
	}
	s := g.stale[0]
	return &request.Error{Source: request.Source{Kind: request.Claim, Key: s.dev.Claim.Namespace + "/" + s.dev.Claim.Name},
		Msg: s.why + ": nothing injected or booked; the claim must be prepared again"}
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

// joinClaims joins the holdings of the claims whose devices the
// container holds, by claim, once whichever containers and pods use them
// (alloc.ClaimHolder, Table.Join): the plugin books a claim when it is
// prepared (Table.SyncClaims), so this finds it booked, or books it where
// it was not. A device of an adminAccess request is not held. A conflict
// with an exclusive holding refuses the container, naming the holder.
func (p *Path) joinClaims(held []claimed) ([]alloc.Holding, error) {
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
	var out []alloc.Holding
	for _, cl := range order {
		hd := alloc.ClaimHolder(cl.UID, cl.Namespace, cl.Name)
		h, _, err := p.Table.Join(alloc.Request{Holder: hd, Mode: claimMode(p.Sharing, shared[cl.UID]), GPUs: byClaim[cl.UID], Source: hd.String(), Runtime: true})
		if err != nil {
			return out, err
		}
		h.Runtime = true
		out = append(out, h)
	}
	return out, nil
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
// the runtime's (a count never gets them), whichever containers use
// them. A device that is not the GPU it was prepared on (identity: gone
// from the inventory, or another GPU at its node) holds nothing and is
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
		g, _, why := identity(devs, d)
		if why != "" {
			warnings = append(warnings, fmt.Sprintf("claim %s/%s: %s: not booked", d.Claim.Namespace, d.Claim.Name, why))
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

// claimShare is the MPS share of a claim device whose GpuConfig asks for
// sharing strategy MPS (claims.Device.MPS): its GPU's daemon, with the
// claim's limits.
func claimShare(d claims.Device) sharing.Share {
	return sharing.Share{UUID: d.UUID, Resource: "claim " + d.Claim.Namespace + "/" + d.Claim.Name, Strategy: sharing.MPS, Replicas: 1, MPS: d.MPS}
}
