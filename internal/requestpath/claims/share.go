package claims

// Share is a claim device's share of a GPU's memory: a device published
// shareable by memory (dra.memoryShares) that the scheduler allocated to
// several claims, each consuming part of its memory capacity (DRA's
// consumable capacity). The zero Share is none.
type Share struct {
	// ID is the allocation's share ID (status.allocation's shareID), which
	// the kubelet matches the prepared device by.
	ID string
	// MemoryMiB is the memory the claim consumes on the device
	// (consumedCapacity, rounded down to MiB); GPUMemoryMiB is the
	// device's.
	MemoryMiB, GPUMemoryMiB uint64
}

// Partial reports whether the share is less than the whole GPU: such a
// claim shares the GPU with others, is booked shared, and its containers
// are MPS clients held to it. A share of the whole memory (a claim that
// asked for none gets the policy's default, the whole memory) has the GPU
// alone.
func (s Share) Partial() bool { return s.ID != "" && s.MemoryMiB < s.GPUMemoryMiB }

// ThreadPercentage is the share's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: its
// part of the GPU's memory, as a percentage of its threads rounded up (a
// claim of 20Gi on an 80Gi GPU gets 25), from 1 to 100. Proportional, so
// that claims that split the memory evenly split the threads evenly, as
// NVIDIA's device plugin's replicas do, and the shares that fit on a GPU
// by memory add up to at most its threads (plus rounding).
func (s Share) ThreadPercentage() int {
	if s.GPUMemoryMiB == 0 || s.MemoryMiB >= s.GPUMemoryMiB {
		return 100
	}
	p := int((s.MemoryMiB*100 + s.GPUMemoryMiB - 1) / s.GPUMemoryMiB)
	return max(p, 1)
}
