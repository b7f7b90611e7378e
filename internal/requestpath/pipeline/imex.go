package pipeline

import (
	"fmt"
	"slices"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/policy"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// imex serves the container's IMEX channel request, a request of its own
// beside the GPUs (request.FindIMEX lists its carriers): found by key,
// authorized (policy.IMEX, and the annotation's own policy for the
// annotation's field), parsed, resolved against the channels discovery
// found, and added to the answer as device nodes, whose cgroup rules the
// runtime makes from their numbers. A channel the node lacks, or a
// carrier the policy does not allow, refuses the container: nothing of
// the answer is injected. Channels the runtime already gives the
// container (a CDI device, --device) are not added again.
func (p *Path) imex(c *call) error {
	f, err := request.FindIMEX(requestInput(c))
	if err != nil || f.Source.Kind == request.NoSource {
		return err
	}
	ns := c.pod.GetNamespace()
	for _, s := range []policy.Source{policy.Annotation, policy.IMEX} {
		if s == policy.Annotation && f.Source.Kind != request.ContainerAnnotation && f.Source.Kind != request.PodAnnotation {
			continue
		}
		if !p.Policy.Allows(s, ns) {
			return &request.Error{Source: f.Source, Msg: fmt.Sprintf("IMEX channels: not allowed in namespace %q (%s)", ns, p.Policy.Setting(s))}
		}
	}
	r, err := f.Parse()
	if err != nil || r.Empty() {
		return err
	}
	chans, err := request.SelectIMEX(r, p.Source.Snapshot().IMEXChannels)
	if err != nil {
		return err
	}
	nodes := make([]inventory.DeviceNode, 0, len(chans))
	for _, ch := range chans {
		if !hasDevicePath(c.ctr, ch.Node.Path) {
			nodes = append(nodes, ch.Node)
		}
	}
	c.res.IMEX = chans
	if len(nodes) == 0 {
		return nil
	}
	if c.adj == nil {
		c.adj = &api.ContainerAdjustment{}
	}
	for _, n := range nodes {
		c.adj.AddDevice(&api.LinuxDevice{Path: n.Path, Type: "c", Major: n.Major, Minor: n.Minor, FileMode: &api.OptionalFileMode{Value: n.Mode}})
	}
	c.res.Edits.Devices = append(slices.Clip(c.res.Edits.Devices), nodes...)
	return nil
}

// hasDevicePath reports whether the runtime gives the container a device
// node at path.
func hasDevicePath(ctr *api.Container, path string) bool {
	for _, d := range ctr.GetLinux().GetDevices() {
		if d.GetPath() == path {
			return true
		}
	}
	return false
}
