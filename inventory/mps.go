package inventory

// DefaultMPSPipeDir is the MPS control daemon's pipe directory when
// CUDA_MPS_PIPE_DIRECTORY does not name another.
const DefaultMPSPipeDir = "/tmp/nvidia-mps"

// EnvMPSPipeDir is the variable that names the MPS pipe directory, to the
// daemon (in its environment) and to its clients (in theirs).
const EnvMPSPipeDir = "CUDA_MPS_PIPE_DIRECTORY"

// EnvMPSPrefix starts the variables that MPS clients read
// (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, ...).
const EnvMPSPrefix = "CUDA_MPS_"

// EnvMPSActiveThreadPercentage and EnvMPSPinnedDeviceMemLimit are an MPS
// client's own limits: the share of the GPU's threads, and the device
// memory it may pin ("0=20389M": device 0 of those the client sees).
const (
	EnvMPSActiveThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPinnedDeviceMemLimit   = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// DevShm is where POSIX shared memory is, in a container as on the host:
// MPS clients and their server meet there.
const DevShm = "/dev/shm"
