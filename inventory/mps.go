package inventory

// DefaultMPSPipeDir is the MPS control daemon's pipe directory when
// CUDA_MPS_PIPE_DIRECTORY does not name another.
const DefaultMPSPipeDir = "/tmp/nvidia-mps"

// EnvMPSPipeDir is the variable that names the MPS pipe directory, to the
// daemon (in its environment) and to its clients (in theirs).
const EnvMPSPipeDir = "CUDA_MPS_PIPE_DIRECTORY"
