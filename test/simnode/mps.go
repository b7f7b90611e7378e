package simnode

import _ "embed"

// mpsControlC is the stand-in MPS control daemon (mpscontrol.c), laid out
// as the driver's nvidia-cuda-mps-control: the real one's command line
// (-d, -f, or a client reading commands on stdin) and control pipe, for
// the commands nri-gpu uses, recorded in its control.log.
//
//go:embed mpscontrol.c
var mpsControlC string

// MPSControlLog is the stand-in daemon's log in its log directory
// (CUDA_MPS_LOG_DIRECTORY), where NVIDIA's daemon writes its own: one
// "Cmd:<command>" line per command it ran, and a line
// "CUDA_VISIBLE_DEVICES=<value>" of the environment it was started with.
const MPSControlLog = "control.log"

// MPSControlPID is the file in the pipe directory where the daemon writes
// its process id, as NVIDIA's does.
const MPSControlPID = "nvidia-cuda-mps-control.pid"
