package pipeline

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// maxSharedAnnotations bounds the shared-replicas annotations
// (alloc.KubeletSharedAnnotation, one per resource) a container's are
// searched for: the device plugin writes one per resource it serves.
const maxSharedAnnotations = 16

// replicas checks what the kubelet's assignment kub says of replicas (the
// annotations alloc.KubeletSharedAnnotation, read only beside an
// assignment that the container's device nodes back) against the node's
// sharing plan, which alone says which devices are shared and how. Every
// device the annotations name must be one of kub that the plan replicates
// with the same strategy and count of replicas; more than one replica of
// a device is refused where the plan says failRequestsGreaterThanOne. A
// device the plan replicates is shared whether or not an annotation names
// it (the allocation table books it shared: alloc.Table.SetReplicated).
// Under MPS the container gets replicas of one GPU and no other device,
// and only while that GPU's daemon is ready. It returns the MPS share the
// container is a client of, or nil.
func (p *Path) replicas(c *call, kub []inventory.GPU) (*sharing.Share, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	var shares []sharing.Share
	for _, g := range kub {
		if sh, ok := p.Shares.Share(g.ID()); ok {
			shares = append(shares, sh)
		}
	}
	if err := p.checkShared(c, kub); err != nil {
		return nil, err
	}
	c.replicated = len(shares) == len(kub)
	var mps []sharing.Share
	for _, sh := range shares {
		if sh.MPS != nil {
			mps = append(mps, sh)
		}
	}
	switch {
	case len(mps) == 0:
		return nil, nil
	case len(kub) > 1:
		return nil, &request.Error{Source: kubeletSource, Msg: fmt.Sprintf("device %s is shared as %s, and the container has %d devices: "+
			"an MPS client reaches the GPU of one MPS control daemon only (CUDA_MPS_PIPE_DIRECTORY), so a container gets replicas of one MPS GPU and nothing else",
			mps[0].UUID, mps[0], len(kub))}
	case !mps[0].MPS.Ready:
		return nil, &request.Error{Source: kubeletSource, Msg: fmt.Sprintf("device %s is shared as %s and its MPS control daemon is not ready (%s): "+
			"new containers on it are refused until nri-gpu mps reports it ready; running ones keep their pipe", mps[0].UUID, mps[0], mps[0].MPS.Why)}
	}
	c.res.MPS = &mps[0]
	return c.res.MPS, nil
}

// checkShared checks the container's shared-replicas annotations against
// the plan and the assignment kub (see replicas).
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
