package mps

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// DriverFiles returns, from a discovery of the node with cfg, the driver's
// nvidia-cuda-mps-control and the directories of its compute and utility
// libraries, as this process reads them (under driverRootMount): what the
// supervisor runs the daemons from. Nothing that a request could name.
func DriverFiles(cfg config.Config, snap *inventory.Snapshot) (binary string, libDirs []string, err error) {
	mount := cfg.DriverRootMount
	if mount == "" {
		mount = cfg.DriverRoot
	}
	local := func(host string) (string, bool) {
		rel, err := filepath.Rel(cfg.DriverRoot, host)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", false
		}
		return filepath.Join(mount, rel), true
	}
	for _, f := range snap.Files {
		switch {
		case f.Kind == inventory.Binary && f.Name == ControlBinary:
			if p, ok := local(f.HostPath); ok {
				binary = p
			}
		case f.Kind == inventory.Library && (f.Capability == inventory.Compute || f.Capability == inventory.Utility):
			if p, ok := local(f.HostPath); ok && !slices.Contains(libDirs, filepath.Dir(p)) {
				libDirs = append(libDirs, filepath.Dir(p))
			}
		}
	}
	if binary == "" {
		return "", nil, fmt.Errorf("discovery found no %s under driverRoot %s (the driver's compute binaries)", ControlBinary, cfg.DriverRoot)
	}
	return binary, libDirs, nil
}
