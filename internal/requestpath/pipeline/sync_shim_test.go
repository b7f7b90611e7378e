package pipeline

import (
	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// synchronize is what Synchronize rebuilds from the runtime's containers
// on p's node. (A function of its own, as handleAdversarial, so that the
// same tests also run against the older Synchronize, for the defects'
// before-and-after.)
func synchronize(p *Path, pods []*api.PodSandbox, ctrs []*api.Container) ([]alloc.Holding, []string) {
	return p.Holdings(pods, ctrs)
}

// holdings is synchronize on a node of src in mode, without claims or a
// sharing plan.
func holdings(src adjust.Source, mode sharing.Mode, pods []*api.PodSandbox, ctrs []*api.Container) ([]alloc.Holding, []string) {
	return holdingsWith(src, mode, nil, pods, ctrs)
}

// holdingsWith is holdings on a node with the prepared claims prep.
func holdingsWith(src adjust.Source, mode sharing.Mode, prep *claims.Prepared, pods []*api.PodSandbox, ctrs []*api.Container) ([]alloc.Holding, []string) {
	return synchronize(&Path{Source: src, Sharing: mode, Claims: prep}, pods, ctrs)
}
