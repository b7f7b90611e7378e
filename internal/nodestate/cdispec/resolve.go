package cdispec

import (
	"fmt"
	"sort"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Resolvable reads the CDI specs in dirs (the runtime's spec directories,
// as this process sees them) and returns, for each GPU and MIG device of
// the snapshot that a spec defines as nvidia.com/gpu=<UUID> (MIG-<uuid>
// for a MIG device, as the toolkit's specs name it too), that qualified
// device name;
// warnings name the specs the CDI library refused.
func Resolvable(snap *inventory.Snapshot, dirs []string) (map[string]string, []string) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	var warnings []string
	if err != nil {
		warnings = append(warnings, fmt.Sprintf("reading CDI specs in %v: %v", dirs, err))
	}
	if cache == nil {
		return nil, warnings
	}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			warnings = append(warnings, fmt.Sprintf("CDI spec %s: %v", path, e))
		}
	}
	sort.Strings(warnings)
	names := map[string]string{}
	uuids := make([]string, 0, len(snap.GPUs)+len(snap.MIG))
	for _, g := range snap.GPUs {
		uuids = append(uuids, g.UUID)
	}
	for _, m := range snap.MIG {
		uuids = append(uuids, m.UUID)
	}
	for _, u := range uuids {
		name := Kind + "=" + u
		if cache.GetDevice(name) != nil {
			names[u] = name
		}
	}
	return names, warnings
}
