package deviceplugin

import (
	"slices"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// MIGResourcePrefix starts the resource of a MIG profile under the mixed
// strategy: nvidia.com/mig-1g.10gb, as NVIDIA's device plugin names it.
const MIGResourcePrefix = config.MIGResourcePrefix

// Resources returns the device plugins a configuration asks for on a node
// with snapshot snap, by devicePlugin.migStrategy:
//
//   - none: resourceName advertises the GPUs without MIG; MIG devices are
//     not advertised (a MIG-enabled GPU is never handed out whole);
//   - single: resourceName advertises the GPUs without MIG and every MIG
//     device (meant for nodes whose GPUs are all in one profile, as with
//     NVIDIA's single strategy);
//   - mixed: resourceName advertises the GPUs without MIG, and each MIG
//     profile of the node is a resource of its own,
//     nvidia.com/mig-<profile>. The profiles are those of snap; Supervise
//     follows the node's, starting and stopping the resources of profiles
//     that a layout change made appear or go.
func Resources(c config.DevicePlugin, snap *inventory.Snapshot) []Options {
	whole := func(g inventory.GPU) bool { return g.MIG == nil }
	base := Options{ResourceName: c.ResourceName, SocketDir: c.SocketDir, DevRoot: c.DevRoot, Select: whole}
	switch c.MIGStrategy {
	case config.MIGStrategySingle:
		base.Select = nil
		return []Options{base}
	case config.MIGStrategyMixed:
		out := []Options{base}
		var profiles []string
		for _, m := range snap.MIG {
			if !slices.Contains(profiles, m.Profile) {
				profiles = append(profiles, m.Profile)
			}
		}
		slices.Sort(profiles)
		for _, p := range profiles {
			out = append(out, Options{ResourceName: MIGResourcePrefix + p, SocketDir: c.SocketDir, DevRoot: c.DevRoot,
				Select: func(g inventory.GPU) bool { return g.MIG != nil && g.MIG.Profile == p }})
		}
		return out
	}
	return []Options{base}
}
