package cdispec

import (
	"fmt"
	"sort"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Resolvable reads the CDI specs in dirs (the runtime's spec directories,
// as this process sees them) and returns, for each GPU of the snapshot that
// a spec defines as nvidia.com/gpu=<UUID>, that qualified device name;
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
	for _, g := range snap.GPUs {
		name := Kind + "=" + g.UUID
		if cache.GetDevice(name) != nil {
			names[g.UUID] = name
		}
	}
	return names, warnings
}
