package config

import "path/filepath"

// DevCharLinks configures the /dev/char/<major>:<minor> links nri-gpu
// keeps for the device nodes it injects (package devchar): with the
// systemd cgroup driver they keep a container's GPUs through `systemctl
// daemon-reload`.
type DevCharLinks struct {
	// Enabled makes nri-gpu create the missing links when it discovers
	// the node; default true. The links outlive nri-gpu: one goes only
	// when its device node is gone from the host (nri-gpu cleanup removes
	// them at an uninstall).
	Enabled *bool `json:"enabled,omitempty"`
	// StateDir is where nri-gpu records the links it made, as nri-gpu
	// sees it: a host directory, so that the next nri-gpu (a restart, a
	// replaced pod) finds the record; empty (the default) is hostRoot +
	// DefaultDevCharStateDir.
	StateDir string `json:"stateDir,omitempty"`
}

// DefaultDevCharStateDir is where the record is by default, under
// hostRoot: the host's /run, which outlives nri-gpu's stops and restarts
// and, a tmpfs, goes at a reboot with the links it lists (the systemd unit
// keeps it: RuntimeDirectoryPreserve). The shipped DaemonSet sets
// /var/lib/nri-gpu, its host directory.
const DefaultDevCharStateDir = "/run/nri-gpu"

// StateDirUnder returns the state directory for a node whose host root is
// hostRoot.
func (d DevCharLinks) StateDirUnder(hostRoot string) string {
	if d.StateDir != "" {
		return d.StateDir
	}
	return filepath.Join(hostRoot, DefaultDevCharStateDir)
}

// On reports whether the links are kept.
func (d DevCharLinks) On() bool { return d.Enabled == nil || *d.Enabled }

func (d *DevCharLinks) setDefaults() {
	if d.Enabled == nil {
		on := true
		d.Enabled = &on
	}
}

func (d DevCharLinks) validate() error {
	if d.StateDir == "" {
		return nil
	}
	return checkPath("devCharLinks.stateDir", d.StateDir)
}
