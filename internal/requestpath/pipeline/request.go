package pipeline

import (
	"fmt"
	"slices"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
)

// The steps that read what a container asks for: the request of the
// kinds whose GPUs were given (kubeletRequest, claimRequest), and the
// carrier of a request of its own (find, authorize, parse), then its
// resolution against the device source (selectDevices).

// kubeletRequest is the request of a container that the kubelet gave GPUs:
// those GPUs, with the driver capabilities of its
// NVIDIA_DRIVER_CAPABILITIES (request.KubeletRequest).
func (p *Path) kubeletRequest(c *call, g given) (request.Request, error) {
	if err := request.CheckMounts(len(c.ctr.GetMounts())); err != nil {
		return request.Request{Source: kubeletSource}, err
	}
	return request.KubeletRequest(alloc.KubeletAnnotation, uuids(g.gpus), c.ctr.GetEnv())
}

// claimRequest is the request of a container that prepared claims gave
// devices: those devices, with the driver capabilities of its
// NVIDIA_DRIVER_CAPABILITIES (request.ClaimRequest).
func (p *Path) claimRequest(c *call, g given) (request.Request, error) {
	src := claimSource(g.claims)
	if err := request.CheckMounts(len(c.ctr.GetMounts())); err != nil {
		return request.Request{Source: src}, err
	}
	ids := make([]string, 0, len(g.claims))
	for _, h := range g.claims {
		if !slices.Contains(ids, h.unit.UUID) {
			ids = append(ids, h.unit.UUID)
		}
	}
	return request.ClaimRequest(src.Key, ids, c.ctr.GetEnv())
}

// find finds the carrier of the container's request, by key, without
// reading its value (request.Find); a container without one asks for
// nothing.
func (p *Path) find(c *call) (request.Found, error) {
	if err := request.CheckMounts(len(c.ctr.GetMounts())); err != nil {
		return request.Found{}, err
	}
	return request.Find(requestInput(c))
}

// authorize checks that the pod's namespace may use the request's carrier,
// before its value is read. A denied NVIDIA_VISIBLE_DEVICES is ignored,
// and set to void so that no other injector (the NVIDIA runtime, a CDI
// hook) honours it: that answer, returned with a note saying why, ends the
// path. Any other denied carrier refuses the container.
func (p *Path) authorize(c *call, f request.Found) (*api.ContainerAdjustment, string, error) {
	src := f.PolicySource()
	ns := c.pod.GetNamespace()
	if p.Policy.Allows(src, ns) {
		return nil, "", nil
	}
	if src == policy.Env {
		adj := &api.ContainerAdjustment{}
		adj.AddEnv(adjust.EnvVisibleDevices, "void")
		return adj, fmt.Sprintf("%s ignored: not allowed in namespace %q (%s); set to void", f.Source, ns, p.Policy.Setting(src)), nil
	}
	return nil, "", &request.Error{Source: f.Source, Msg: fmt.Sprintf("not allowed in namespace %q (%s)", ns, p.Policy.Setting(src))}
}

// authorizeGiven is authorize for a container whose GPUs the runtime gave.
// NVIDIA_VISIBLE_DEVICES and the device plugin's mount list are also what
// a device plugin (NVIDIA's, DEVICE_LIST_STRATEGY envvar or volume-mounts)
// hands the kubelet: where the runtime gave the container GPU device nodes
// as well (its PASS_DEVICE_SPECS=true), which a pod cannot add to its
// spec, the nodes decide its GPUs (given.gets) and the variable or list is
// not a request of the pod's author: it is served, whatever the policy,
// with the driver files of those GPUs only.
func (p *Path) authorizeGiven(c *call, f request.Found, g given) (*api.ContainerAdjustment, string, error) {
	if src := f.PolicySource(); (src == policy.Env || src == policy.DeviceList) && len(g.nodes) > 0 {
		return nil, "", nil
	}
	return p.authorize(c, f)
}

// parse parses the authorized carrier's value into the request. Find
// names the carrier's class (management or not, request.Found.Management)
// as the parse will; a parse that disagrees would have been authorized as
// the wrong class, and is refused.
func (p *Path) parse(f request.Found) (request.Request, error) {
	r, err := f.Parse()
	if err == nil && r.Kind != request.Nothing && r.PolicySource() != f.PolicySource() {
		err = &request.Error{Source: f.Source, Msg: fmt.Sprintf("reads as a %s but parses as a %s: refused", f.PolicySource(), r.PolicySource())}
	}
	return r, err
}

// selectDevices resolves the request against the device source
// (request.Select). A selection that injects nothing (Inject unset, with
// a note) ends the path.
func (p *Path) selectDevices(r request.Request) (request.Selection, error) {
	return request.Select(r, p.Source)
}
