// Package nvidiadra holds what the suite needs to run NVIDIA's own DRA
// driver for GPUs (gpu-kubelet-plugin, built by harness.InstallNVIDIADRA)
// beside nri-gpu: go-nvfm, our stand-in for a module of NVIDIA's that the
// Go module proxy does not serve, and the check that the simulated NVML
// exports every function NVIDIA's NVML bindings bind.
package nvidiadra
