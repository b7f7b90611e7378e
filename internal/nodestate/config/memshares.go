package config

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// DRAMemoryShares publishes GPUs as shareable by memory through DRA's
// consumable capacity (KEP-5075, the DRAConsumableCapacity feature gate):
// each GPU it names is published with allowMultipleAllocations and a
// memory capacity whose request policy defaults to the whole memory (a
// claim that asks for no memory gets the GPU alone) and takes requests
// from Minimum up, in MiB steps. A claim that requests less gets a share:
// several land on one GPU up to its memory, and each container of such a
// claim is an MPS client held to its claim's share (docs/sharing.md). Off
// unless Devices names GPUs.
type DRAMemoryShares struct {
	// Devices are the GPUs published shareable by memory (indexes, GPU
	// UUIDs or PCI bus ids, as dra.devices); empty: none. MIG devices
	// are never shared so.
	Devices []string `json:"devices,omitempty"`
	// Minimum is the smallest share (a quantity such as 1Gi, a whole
	// number of MiB); smaller requests are rounded up to it.
	Minimum string `json:"minimum,omitempty"`
}

// DefaultMemoryShareMinimum is dra.memoryShares.minimum's default.
const DefaultMemoryShareMinimum = "1Gi"

func (m *DRAMemoryShares) setDefaults() {
	if m.Minimum == "" {
		m.Minimum = DefaultMemoryShareMinimum
	}
}

// Enabled reports whether any GPU is published shareable by memory.
func (m DRAMemoryShares) Enabled() bool { return len(m.Devices) > 0 }

// MinimumBytes is Minimum in bytes (validated).
func (m DRAMemoryShares) MinimumBytes() int64 {
	q, err := resource.ParseQuantity(m.Minimum)
	if err != nil {
		return 1 << 30
	}
	return q.Value()
}

func (m DRAMemoryShares) validate() error {
	if err := checkDeviceList("dra.memoryShares.devices", m.Devices); err != nil {
		return err
	}
	q, err := resource.ParseQuantity(m.Minimum)
	if err != nil {
		return fmt.Errorf("key dra.memoryShares.minimum: %q is not a quantity (valid: a memory size such as 1Gi or 512Mi): %v", m.Minimum, err)
	}
	v, ok := q.AsInt64()
	if !ok || v < 1<<20 || v%(1<<20) != 0 {
		return fmt.Errorf("key dra.memoryShares.minimum: %q is not a whole number of MiB of at least 1Mi (valid: a memory size such as 1Gi or 512Mi; MPS limits memory in MiB)", m.Minimum)
	}
	return nil
}
