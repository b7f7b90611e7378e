package pipeline

import (
	"context"

	"github.com/containerd/nri/pkg/api"
)

// handleAdversarial runs one adversarial request. (A function of its own
// so that the same inputs also run against the request path's older
// signature, for the before-and-after figures.)
func handleAdversarial(p *Path, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, Result, error) {
	return p.Handle(context.Background(), pod, ctr)
}
