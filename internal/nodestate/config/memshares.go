package config

import (
	"fmt"
	"strconv"
	"strings"
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
	// Minimum is the smallest share, a whole number of Mi, Gi or Ti
	// (1Gi, 512Mi); smaller requests are rounded up to it.
	Minimum string `json:"minimum,omitempty"`
	// AcrossNamespaces lets claims of different namespaces share one
	// GPU's memory. Off, a share is prepared only beside shares of its
	// own namespace's claims: one MPS control daemon, its control socket
	// in one read-write pipe directory, serves every share of a GPU, so
	// its clients can reach each other's daemon.
	AcrossNamespaces bool `json:"acrossNamespaces,omitempty"`
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
	v, err := parseMiB(m.Minimum)
	if err != nil {
		return 1 << 30
	}
	return v
}

// parseMiB reads a size of whole Mi, Gi or Ti ("512Mi", "1Gi") in bytes,
// at least 1Mi and at most 1Pi.
func parseMiB(s string) (int64, error) {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"Mi", 20}, {"Gi", 30}, {"Ti", 40}} {
		num, ok := strings.CutSuffix(s, u.suffix)
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n < 1 || n > 1<<(50-u.shift) || strconv.FormatInt(n, 10) != num {
			break
		}
		return n << u.shift, nil
	}
	return 0, fmt.Errorf("not a whole number of Mi, Gi or Ti from 1Mi to 1024Ti")
}

func (m DRAMemoryShares) validate() error {
	if err := checkDeviceList("dra.memoryShares.devices", m.Devices); err != nil {
		return err
	}
	if _, err := parseMiB(m.Minimum); err != nil {
		return fmt.Errorf("key dra.memoryShares.minimum: %q is %v (valid: a memory size such as 1Gi or 512Mi; MPS limits memory in MiB)", m.Minimum, err)
	}
	return nil
}
