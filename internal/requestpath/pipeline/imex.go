package pipeline

import (
	"fmt"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// imex serves the container's IMEX channel request, a request of its own
// beside the GPUs (request.FindIMEX lists its carriers), and adds it to
// the kind's answer adj, returning the channels and the device nodes it
// added: found by key, authorized (policy.IMEX, and the
// annotation's own policy for the annotation's field), parsed, resolved
// against the channels discovery found, and added to the answer as device
// nodes, whose cgroup rules the runtime makes from their numbers. A
// channel the node lacks, or a carrier the policy does not allow, refuses
// the container: nothing of the answer is injected. Channels the runtime
// already gives the container (a CDI device, --device) are not added
// again. Linear in the channels and the container's device nodes
// (givenChannels).
func (p *Path) imex(c *call, adj *api.ContainerAdjustment) (*api.ContainerAdjustment, []inventory.IMEXChannel, []inventory.DeviceNode, error) {
	f, err := request.FindIMEX(requestInput(c))
	if err != nil || f.Source.Kind == request.NoSource {
		return adj, nil, nil, err
	}
	ns := c.pod.GetNamespace()
	for _, s := range []policy.Source{policy.Annotation, policy.IMEX} {
		if s == policy.Annotation && f.Source.Kind != request.ContainerAnnotation && f.Source.Kind != request.PodAnnotation {
			continue
		}
		if !p.Policy.Allows(s, ns) {
			return nil, nil, nil, &request.Error{Source: f.Source, Msg: fmt.Sprintf("IMEX channels: not allowed in namespace %q (%s)", ns, p.Policy.Setting(s))}
		}
	}
	r, err := f.Parse()
	if err != nil || r.Empty() {
		return adj, nil, nil, err
	}
	chans, err := request.SelectIMEX(r, p.Source.Snapshot().IMEXChannels)
	if err != nil {
		return nil, nil, nil, err
	}
	given := givenChannels(c.ctr, chans)
	nodes := make([]inventory.DeviceNode, 0, len(chans))
	for i, ch := range chans {
		if given == nil || !given[i] {
			nodes = append(nodes, ch.Node)
		}
	}
	if len(nodes) == 0 {
		return adj, chans, nil, nil
	}
	if adj == nil {
		adj = &api.ContainerAdjustment{}
	}
	for _, n := range nodes {
		adj.AddDevice(&api.LinuxDevice{Path: n.Path, Type: "c", Major: n.Major, Minor: n.Minor, FileMode: &api.OptionalFileMode{Value: n.Mode}})
	}
	return adj, chans, nodes, nil
}

// givenChannels reports, for each of chans, whether the runtime gives the
// container a device node at its path already. One pass over the
// container's nodes (at most maxDevices: serve refuses more) against the
// channels' paths, put in a set once: linear in both, where looking each
// channel up among the nodes was their product (2048 channels against 4096
// nodes). Nil when the container has no device node.
func givenChannels(ctr *api.Container, chans []inventory.IMEXChannel) []bool {
	devs := ctr.GetLinux().GetDevices()
	if len(devs) == 0 || len(chans) == 0 {
		return nil
	}
	at := make(map[string]int, len(chans))
	for i, ch := range chans {
		at[ch.Node.Path] = i
	}
	given := make([]bool, len(chans))
	for _, d := range devs {
		if i, ok := at[d.GetPath()]; ok {
			given[i] = true
		}
	}
	return given
}
