package config

import "fmt"

// Health configures the GPU health nri-gpu follows through NVML's XID
// events (where NVML is available).
type Health struct {
	// IgnoredXIDs are the XIDs that say nothing about the GPU's health
	// (an application's error); unset means DefaultIgnoredXIDs, an empty
	// list none.
	IgnoredXIDs []uint64 `json:"ignoredXIDs,omitempty"`
}

// DefaultIgnoredXIDs are the application XIDs NVIDIA's device plugin
// ignores by default: 13 (graphics engine exception), 31 (GPU memory page
// fault), 43 (GPU stopped processing), 45 (preemptive cleanup), 68 (video
// processor exception), 109 (context switch timeout).
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// maxIgnoredXIDs bounds health.ignoredXIDs.
const maxIgnoredXIDs = 256

// maxXID bounds an XID number (the driver's are below 200 today).
const maxXID = 65535

func (h *Health) setDefaults() {
	if h.IgnoredXIDs == nil {
		h.IgnoredXIDs = append([]uint64(nil), DefaultIgnoredXIDs...)
	}
}

func (h Health) validate() error {
	if len(h.IgnoredXIDs) > maxIgnoredXIDs {
		return fmt.Errorf("key health.ignoredXIDs: %d entries (at most %d)", len(h.IgnoredXIDs), maxIgnoredXIDs)
	}
	for _, x := range h.IgnoredXIDs {
		if x == 0 || x > maxXID {
			return fmt.Errorf("key health.ignoredXIDs: %d is not an XID (valid: 1 to %d)", x, maxXID)
		}
	}
	return nil
}
