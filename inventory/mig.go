package inventory

import "fmt"

// MIGDevice is one MIG device: a compute instance (CI) of a GPU instance
// (GI) of a MIG-enabled GPU. It is handed out on its own; its parent GPU
// is not handed out whole while MIG is enabled.
type MIGDevice struct {
	// UUID is "MIG-<uuid>", as NVML and NVIDIA_VISIBLE_DEVICES name it.
	UUID string
	// Index is the MIG device's index under its GPU, the <mig> of the
	// toolkit's <gpu>:<mig> form.
	Index int
	// Parent is the parent GPU's Index; ParentUUID its UUID.
	Parent     int
	ParentUUID string
	// Profile is the MIG profile, "1g.10gb".
	Profile string
	// MemoryMiB is the instance's memory (its GPU instance's).
	MemoryMiB uint64
	// GI and CI are the GPU instance and compute instance ids.
	GI, CI int
	// GINode and CINode are /dev/nvidia-caps/nvidia-cap<minor> of the GI's
	// and the CI's access capability (major nvidia-caps), whether or not
	// the host has the nodes: the runtime creates them from the numbers.
	GINode, CINode DeviceNode
	// Placement is the GPU instance's profile and memory slices, as NVML
	// reports them; nil when it does not.
	Placement *MIGPlacement
	// Engines are the instance's multiprocessors and engines (its GPU
	// instance profile's, as NVML reports them); zero when unknown.
	Engines MIGEngines
}

// MIGPlacement is where a GPU instance lies on its GPU: its GPU
// instance profile id (NVML's, 19 for a 1g.10gb) and the memory slices
// it occupies, from Start for Size slices.
type MIGPlacement struct {
	ProfileID   int
	Start, Size int
}

// MIGEngines are a MIG device's multiprocessors and engines.
type MIGEngines struct {
	Multiprocessors, CopyEngines, Decoders, Encoders, JPEGs, OFAs uint32
}

// Name is the MIG device's <gpu>:<mig> name.
func (m MIGDevice) Name() string { return fmt.Sprintf("%d:%d", m.Parent, m.Index) }

// MIGControl are the node-wide MIG management capabilities
// (/proc/driver/nvidia/capabilities/mig/config and monitor), as nodes
// /dev/nvidia-caps/nvidia-cap<minor>; nil when the node has none.
type MIGControl struct {
	Config  *DeviceNode
	Monitor *DeviceNode
}

// MIGKeyBase is where the keys of MIG devices start. MIG devices are
// units of allocation like GPUs; their key in the request path and the
// allocation table (GPU.Index of the unit) is MIGKey(parent, index): above
// every GPU index, contiguous per parent, so that ranges of them read as
// "0:0-0:6".
const MIGKeyBase = 1 << 16

// MIGKey returns the unit key of MIG device mig of the GPU with index
// parent.
func MIGKey(parent, mig int) int { return MIGKeyBase*(parent+1) + mig }

// IsMIGKey reports whether a unit key is a MIG device's.
func IsMIGKey(k int) bool { return k >= MIGKeyBase }

// UnitLabel names a unit key as users write it: "3" for a GPU, "0:1" for a
// MIG device.
func UnitLabel(k int) string {
	if IsMIGKey(k) {
		return fmt.Sprintf("%d:%d", k/MIGKeyBase-1, k%MIGKeyBase)
	}
	return fmt.Sprint(k)
}

// UnitKind says "GPU" or "MIG device" for a unit key, for messages.
func UnitKind(k int) string {
	if IsMIGKey(k) {
		return "MIG device"
	}
	return "GPU"
}

// Unit returns the MIG device as a device of the request path: a GPU
// value whose Index is its key, UUID its MIG UUID, Node its parent's
// device node, and MIG the device itself.
func (m MIGDevice) Unit(parent GPU) GPU {
	u := parent
	u.Index = MIGKey(m.Parent, m.Index)
	u.UUID = m.UUID
	u.Model = parent.Model + " MIG " + m.Profile
	u.MIGEnabled = false
	mc := m
	u.MIG = &mc
	return u
}

// Units returns what the snapshot hands out: its GPUs without MIG, then
// the MIG devices, by key.
func (s *Snapshot) Units() []GPU {
	if len(s.MIG) == 0 && !s.anyMIGEnabled() {
		return s.GPUs
	}
	out := make([]GPU, 0, len(s.GPUs)+len(s.MIG))
	parents := map[int]GPU{}
	for _, g := range s.GPUs {
		if g.MIGEnabled {
			parents[g.Index] = g
			continue
		}
		out = append(out, g)
	}
	for _, m := range s.MIG {
		if p, ok := parents[m.Parent]; ok {
			out = append(out, m.Unit(p))
		}
	}
	return out
}

func (s *Snapshot) anyMIGEnabled() bool {
	for _, g := range s.GPUs {
		if g.MIGEnabled {
			return true
		}
	}
	return false
}
