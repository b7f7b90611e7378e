package deviceplugin

import (
	"slices"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// MIGResourcePrefix starts the resource of a MIG profile under the mixed
// strategy: nvidia.com/mig-1g.10gb, as NVIDIA's device plugin names it.
const MIGResourcePrefix = config.MIGResourcePrefix

// Resources returns the device plugins a configuration asks for on a node
// with snapshot snap: one per resource of the sharing plan of c
// (sharing.NewPlan), and always resourceName. By devicePlugin.migStrategy
// (sharing.BaseResource):
//
//   - none: resourceName advertises the GPUs without MIG; MIG devices are
//     not advertised (a MIG-enabled GPU is never handed out whole);
//   - single: resourceName advertises the GPUs without MIG and every MIG
//     device (meant for nodes whose GPUs are all in one profile, as with
//     NVIDIA's single strategy);
//   - mixed: resourceName advertises the GPUs without MIG, and each MIG
//     profile of the node is a resource of its own,
//     nvidia.com/mig-<profile>.
//
// devicePlugin.sharing then moves the devices it replicates to their
// rename (or keeps them under their resource), as replicas. The resources
// are those of snap; Supervise follows the node's, starting and stopping
// the resources that a layout or configuration change made appear or go.
func Resources(c config.DevicePlugin, snap *inventory.Snapshot) []Options {
	return resourcesOf(c, sharing.NewPlan(c.SharingSpec(), snap.Units()))
}

// resourcesOf returns the device plugins of plan's resources, with
// resourceName first.
func resourcesOf(c config.DevicePlugin, plan *sharing.Plan) []Options {
	names := []string{c.ResourceName}
	for _, r := range plan.Resources() {
		if !slices.Contains(names, r) {
			names = append(names, r)
		}
	}
	out := make([]Options, 0, len(names))
	for _, r := range names {
		out = append(out, Options{ResourceName: r, SocketDir: c.SocketDir, DevRoot: c.DevRoot, Config: &c})
	}
	return out
}
