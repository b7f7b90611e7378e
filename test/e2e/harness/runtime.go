package harness

import "context"

// Runtime is a running private CRI runtime with NRI enabled: a containerd
// (2.4, 2.2 or 1.7) or a CRI-O. The end-to-end suite runs every case that is
// not specific to one runtime on each of them.
type Runtime interface {
	// Name is the runtime and its version, e.g. "containerd-2.4.2",
	// "containerd-1.7.36", "crio-1.34.0".
	Name() string
	// CRI is the CRI client connected to the runtime.
	CRI() *CRI
	// NRISocketPath is the socket external NRI plugins connect to.
	NRISocketPath() string
	// NRIPluginDir and NRIPluginConfigDir are the directories of the
	// pre-registered NRI plugins the runtime starts itself.
	NRIPluginDir() string
	NRIPluginConfigDir() string
	// CDIDir is the only CDI spec directory the runtime reads.
	CDIDir() string
	// TempDir is the runtime's private directory; all its state is under it.
	TempDir() string
	// Restart stops the runtime (its containers keep running) and starts it
	// again on the same state.
	Restart(ctx context.Context) error
	// Stop stops the runtime, its containers and removes its directory.
	Stop() error
	// LogTail is the last n bytes of the runtime's log.
	LogTail(n int64) string
}
