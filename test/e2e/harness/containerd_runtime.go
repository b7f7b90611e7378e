package harness

// Containerd as a Runtime. (The interface's accessors; the CRI-O run of the
// suite added them. If another change adds the same methods, keep one set.)

var _ Runtime = (*Containerd)(nil)

// Name is "containerd-" and the version without its "v", e.g. "containerd-2.4.2".
func (c *Containerd) Name() string {
	return "containerd-" + trimV(c.Opts.Tools.ContainerdVersion)
}

// NRISocketPath is the NRI socket for external plugins.
func (c *Containerd) NRISocketPath() string { return c.NRISocket }

// NRIPluginDir is the directory of pre-registered plugins.
func (c *Containerd) NRIPluginDir() string { return c.NRIPluginPath }

// NRIPluginConfigDir is the directory of their configs.
func (c *Containerd) NRIPluginConfigDir() string { return c.NRIPluginConfig }

// CDIDir is the only CDI spec directory containerd reads.
func (c *Containerd) CDIDir() string { return c.CDISpecDir }

// TempDir is containerd's private directory.
func (c *Containerd) TempDir() string { return c.Dir }

func trimV(v string) string {
	if len(v) > 0 && v[0] == 'v' {
		return v[1:]
	}
	return v
}
