package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// maxSharedAnnotations bounds the shared-replicas annotations
// (alloc.KubeletSharedAnnotation, one per resource) a container's are
// searched for: the device plugin writes one per resource it serves.
const maxSharedAnnotations = 16

// shares applies the sharing rules to every GPU the container holds,
// whatever its kind, and returns the MPS share it is a client of, or nil.
// Beside the kubelet's assignment, its shared-replicas annotations
// (alloc.KubeletSharedAnnotation) are checked against the node's sharing
// plan, which alone says which devices are shared and how (checkShared);
// a device the plan replicates is shared whether or not an annotation
// names it (givenHolding books it shared, and alloc.Table.SetReplicated
// keeps it so). A container that holds a GPU shared with MPS, as a
// replica of the plan or as a claim's device with GpuConfig MPS, is a
// client of that GPU's daemon: it gets that one GPU and nothing else (a
// client reaches one daemon, through CUDA_MPS_PIPE_DIRECTORY), and only
// while the daemon is ready.
func (p *Path) shares(c *call, g given) (*sharing.Share, error) {
	if g.kubelet {
		if err := p.checkShared(c, g.gpus); err != nil {
			return nil, err
		}
	}
	sh, claim, ok := p.mpsShare(g)
	if !ok {
		return nil, nil
	}
	units := indexes(g.gpus)
	for _, h := range g.claims {
		if !slices.Contains(units, h.unit.Index) {
			units = append(units, h.unit.Index)
		}
	}
	var msg string
	switch {
	case len(units) > 1 && claim == nil:
		msg = fmt.Sprintf("device %s is shared as %s, and the container has %d devices: "+
			"an MPS client reaches the GPU of one MPS control daemon only (CUDA_MPS_PIPE_DIRECTORY), so a container gets replicas of one MPS GPU and nothing else",
			sh.UUID, sh, len(units))
	case len(units) > 1:
		msg = fmt.Sprintf("device %s is shared with MPS, and the container has other GPUs beside it: "+
			"an MPS client reaches the GPU of one MPS control daemon only (CUDA_MPS_PIPE_DIRECTORY), so a container gets one MPS GPU and nothing else", claim.Name)
	case !sh.MPS.Ready && claim == nil:
		msg = fmt.Sprintf("device %s is shared as %s and its MPS control daemon is not ready (%s): "+
			"new containers on it are refused until nri-gpu mps reports it ready; running ones keep their pipe", sh.UUID, sh, sh.MPS.Why)
	case !sh.MPS.Ready:
		msg = fmt.Sprintf("device %s (%s) is shared with MPS and its MPS control daemon is not ready (%s): "+
			"new containers on it are refused until nri-gpu mps reports it ready; running ones keep their pipe", claim.Name, claim.UUID, sh.MPS.Why)
	default:
		client := sh
		return &client, nil
	}
	switch {
	case claim != nil:
		return nil, &request.Error{Source: request.Source{Kind: request.Claim, Key: claim.Claim.Namespace + "/" + claim.Claim.Name}, Msg: msg}
	case g.kubelet:
		return nil, &request.Error{Source: kubeletSource, Msg: msg}
	}
	return nil, errors.New("nri-gpu: " + runtimeSource + ": " + msg)
}

// mpsShare returns the first MPS share among the GPUs the container
// holds: a replica of the plan's MPS GPUs among those the runtime gave
// it, else a claim device whose GpuConfig asks for MPS (claim is set).
func (p *Path) mpsShare(g given) (sh sharing.Share, claim *claims.Device, ok bool) {
	for _, d := range g.gpus {
		if s, ok := p.Shares.Share(d.ID()); ok && s.MPS != nil {
			return s, nil, true
		}
	}
	for i := range g.claims {
		if d := &g.claims[i].dev; d.MPS != nil {
			return claimShare(*d), d, true
		}
	}
	return sharing.Share{}, nil, false
}

// checkShared checks the container's shared-replicas annotations against
// the plan and the assignment kub (see shares).
func (p *Path) checkShared(c *call, kub []inventory.GPU) error {
	ann := c.ctr.GetAnnotations()
	if len(ann) > maxAnnotations {
		return nil // not the kubelet's (kubeletAnnotations): kub's own are the plan's
	}
	n := 0
	for key, v := range ann {
		if !strings.HasPrefix(key, alloc.KubeletSharedPrefix) {
			continue
		}
		src := request.Source{Kind: request.Kubelet, Key: key}
		if n++; n > maxSharedAnnotations {
			return &request.Error{Source: src, Msg: fmt.Sprintf("more than %d shared-replicas annotations", maxSharedAnnotations)}
		}
		ks, err := alloc.ParseKubeletShares(v)
		if err != nil {
			return &request.Error{Source: src, Msg: err.Error()}
		}
		for _, s := range ks.Shares {
			if msg := p.disagree(ks.Strategy, s, kub); msg != "" {
				return &request.Error{Source: src, Msg: msg}
			}
		}
	}
	return nil
}

// disagree says how one device s of a shared-replicas annotation of
// strategy disagrees with the assignment kub and the plan; "" when it
// does not.
func (p *Path) disagree(strategy string, s alloc.KubeletShare, kub []inventory.GPU) string {
	if !slices.ContainsFunc(kub, func(g inventory.GPU) bool { return strings.EqualFold(g.ID(), s.UUID) }) {
		return fmt.Sprintf("names device %s, which is not among the devices the kubelet gave the container (%s): not the device plugin's", cut(s.UUID), strings.Join(uuids(kub), ", "))
	}
	sh, ok := p.Shares.Share(canonical(kub, s.UUID))
	switch {
	case !ok:
		return fmt.Sprintf("says device %s is shared as %d %s replicas, but this node does not replicate it (devicePlugin.sharing): not the device plugin's", s.UUID, s.Replicas, strategy)
	case sh.Strategy != strategy || sh.Replicas != s.Replicas:
		return fmt.Sprintf("says device %s is shared as %d %s replicas, but this node shares it as %s: not the device plugin's", s.UUID, s.Replicas, strategy, sh)
	case s.Given > 1 && sh.FailRequestsGreaterThanOne:
		return fmt.Sprintf("maximum request size for shared resources is 1; found %d (device %s, %s, failRequestsGreaterThanOne)", s.Given, s.UUID, sh)
	}
	return ""
}

// canonical returns the ID of the device of kub whose ID is id in any case.
func canonical(kub []inventory.GPU, id string) string {
	for _, g := range kub {
		if strings.EqualFold(g.ID(), id) {
			return g.ID()
		}
	}
	return id
}

// cut cuts a pod author's string for a message.
func cut(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
