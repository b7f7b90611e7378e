package dra

import (
	"fmt"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// Memory shares are held through MPS: each container of a claim that has
// a share of a GPU's memory (claims.Share.Partial) is a client of the
// GPU's MPS control daemon (the claim's GpuConfig asks for strategy MPS),
// with client limits sized from the share. One daemon serves every share
// of the GPU, of different sizes, so its own defaults cannot be any one
// claim's: they are the whole GPU (100 %, no memory limit), and each
// client's limits are the environment the request path sets
// (docs/sharing.md says what that enforces and what not).

// shareLimits checks that every partial share of devs is served through
// MPS, and sizes its client limits: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT the
// share's memory, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE its proportional part
// of the threads (claims.Share.ThreadPercentage), or the claim's own
// mpsConfig where that is lower. A partial share without sharing strategy
// MPS is refused, naming the setting: its memory would not be held.
func shareLimits(driver string, devs []claims.Device) error {
	for i := range devs {
		dv := &devs[i]
		if !dv.Share.Partial() {
			continue
		}
		if dv.MPS == nil {
			strategy := "no sharing strategy"
			if dv.Sharing != "" {
				strategy = "sharing strategy " + dv.Sharing
			}
			return fmt.Errorf("request %s: device %s: the claim has a share of %dMi of the GPU's %dMi (dra.memoryShares), with %s: nri-gpu holds a container to a memory share "+
				"through MPS only, and gives no share unheld; set sharing.strategy: %s in an opaque config of driver %s (apiVersion %s, kind %s) in the claim or its DeviceClass, "+
				"or request no memory to get the whole GPU",
				dv.Request, dv.Name, dv.Share.MemoryMiB, dv.Share.GPUMemoryMiB, strategy, StrategyMPS, driver, GpuConfigAPIVersion, GpuConfigKind)
		}
		m := *dv.MPS
		m.ActiveThreadPercentage = min(m.ActiveThreadPercentage, dv.Share.ThreadPercentage())
		if m.PinnedMemoryMiB == 0 || m.PinnedMemoryMiB > dv.Share.MemoryMiB {
			m.PinnedMemoryMiB = dv.Share.MemoryMiB
		}
		dv.MPS = &m
	}
	return nil
}

// daemonLimits are the limits of the MPS daemon of the claim device dv:
// its claim's (claims.Device.MPS), or, for a partial share, the whole
// GPU's (100 %, no memory limit), since the daemon serves every share of
// it.
func daemonLimits(dv claims.Device) sharing.MPSLimits {
	if dv.Share.Partial() {
		return sharing.MPSLimits{ActiveThreadPercentage: 100}
	}
	return dv.MPS.MPSLimits
}
