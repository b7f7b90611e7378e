package config

import (
	"fmt"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// DRADynamicMIG makes MIG devices on demand on the GPUs it names, through
// DRA's partitionable devices (KEP-4815, the DRAPartitionableDevices
// feature gate, beta and on by default in Kubernetes 1.37, alpha and off
// in 1.34): such a GPU
// is published whole and as every placement of every MIG profile, all
// consuming one counter set of the GPU, so that the scheduler picks a
// profile and a place that fit and the driver creates the GPU and compute
// instance when the claim is prepared (and destroys them at unprepare).
// The GPUs must be in MIG mode, with no MIG device an operator made. Off
// unless Devices names GPUs.
type DRADynamicMIG struct {
	// Devices are the GPUs MIG devices are made on (indexes, GPU UUIDs
	// or PCI bus ids, as dra.devices); empty: none.
	Devices []string `json:"devices,omitempty"`
}

// Enabled reports whether any GPU has MIG devices made on demand.
func (m DRADynamicMIG) Enabled() bool { return len(m.Devices) > 0 }

// Has reports whether GPU g (not a MIG device) is one of Devices.
func (m DRADynamicMIG) Has(g inventory.GPU) bool {
	return m.Enabled() && g.MIG == nil && DeviceList(m.Devices).Matches(g, g)
}

// validate checks dra.dynamicMIG against the rest of the dra key.
func (m DRADynamicMIG) validate(d DRA) error {
	if !m.Enabled() {
		return nil
	}
	if err := checkDeviceList("dra.dynamicMIG.devices", m.Devices); err != nil {
		return err
	}
	if !d.Enabled {
		return fmt.Errorf("key dra.dynamicMIG.devices: set without dra.enabled: MIG devices are made on demand by nri-gpu's DRA driver only (set dra.enabled: true, or remove dra.dynamicMIG)")
	}
	shared := map[string]bool{}
	for _, e := range d.MemoryShares.Devices {
		if k, err := deviceKey(e); err == nil {
			shared[k] = true
		}
	}
	for _, e := range m.Devices {
		if k, _ := deviceKey(e); shared[k] {
			return fmt.Errorf("key dra.dynamicMIG.devices: %q is in dra.memoryShares.devices too: a GPU is shared by memory or split into MIG devices, not both", e)
		}
	}
	return nil
}
