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
	Profile   string
	MemoryMiB uint64
	// GI and CI are the GPU instance and compute instance ids.
	GI, CI int
	// GINode and CINode are /dev/nvidia-caps/nvidia-cap<minor> of the GI's
	// and the CI's access capability (major nvidia-caps), whether or not
	// the host has the nodes: the runtime creates them from the numbers.
	GINode, CINode DeviceNode
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
