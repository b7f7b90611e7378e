package pipeline

import (
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// containerName is the container's name for per-container annotations:
// NRI's name, else the kubelet's CRI label io.kubernetes.container.name
// among the container's labels. CRI-O's NRI takes the name from that label
// only (as a spec annotation), containerd's from the CRI metadata; a
// container with neither has no name, and request.Find refuses it where
// the pod has per-container annotations.
func containerName(ctr *api.Container) string {
	if n := ctr.GetName(); n != "" {
		return n
	}
	return ctr.GetLabels()[request.ContainerNameLabel]
}

// requestInput is what the request carriers of the call's container are
// read from: the pod's annotations, the container's name (containerName),
// env and mounts. GPU and IMEX requests read the same input.
func requestInput(c *call) request.Input {
	return request.Input{
		Annotations: c.pod.GetAnnotations(),
		Name:        containerName(c.ctr),
		Env:         c.ctr.GetEnv(),
		Mounts:      mounts(c.ctr),
	}
}

// mounts returns the container's mounts that may be the device plugin's
// device list, as the request package sees them: only those whose
// destination names its directory (request.DeviceListName), so that a
// container's other mounts cost no copy.
func mounts(ctr *api.Container) []inventory.Mount {
	n := 0
	for _, m := range ctr.GetMounts() {
		if strings.Contains(m.GetDestination(), request.DeviceListName) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]inventory.Mount, 0, n)
	for _, m := range ctr.GetMounts() {
		if strings.Contains(m.GetDestination(), request.DeviceListName) {
			out = append(out, inventory.Mount{Source: m.GetSource(), Destination: m.GetDestination()})
		}
	}
	return out
}
