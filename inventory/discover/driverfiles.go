package discover

import "github.com/nri-gpu/nri-gpu/inventory"

// The driver's user-space files by capability, after the NVIDIA container
// toolkit's lists (see shared/node-facts.md). Names of libraries are the
// file name up to and including ".so"; the installed files carry the driver
// version as suffix and are found through ld.so.cache or the usual
// directories.
var (
	libraryNames = map[inventory.Capability][]string{
		inventory.Utility: {"libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"},
		inventory.Compute: {
			"libcuda.so", "libcudadebugger.so", "libnvidia-opencl.so",
			"libnvidia-gpucomp.so", "libnvidia-ptxjitcompiler.so",
			"libnvidia-allocator.so", "libnvidia-pkcs11.so",
			"libnvidia-pkcs11-openssl3.so", "libnvidia-nvvm.so",
		},
		inventory.Video: {"libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"},
		inventory.Graphics: {
			"libnvidia-eglcore.so", "libnvidia-glcore.so", "libnvidia-tls.so",
			"libnvidia-glsi.so", "libnvidia-fbc.so", "libnvidia-rtcore.so",
			"libnvoptix.so", "libGLX_nvidia.so", "libEGL_nvidia.so",
			"libGLESv2_nvidia.so", "libGLESv1_CM_nvidia.so", "libnvidia-glvkspirv.so",
		},
		inventory.NGX: {"libnvidia-ngx.so"},
	}

	binaryNames = map[inventory.Capability][]string{
		inventory.Utility: {"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"},
		inventory.Compute: {"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"},
	}

	// libraryDirs are searched (besides ld.so.cache) for 64-bit libraries,
	// relative to the driver root.
	libraryDirs = []string{
		"usr/lib64",
		"usr/lib/x86_64-linux-gnu",
		"usr/lib/x86_64-linux-gnu/nvidia/current",
		"usr/lib/x86_64-linux-gnu/vdpau",
		"usr/lib/aarch64-linux-gnu",
		"usr/lib/aarch64-linux-gnu/nvidia/current",
		"usr/lib/aarch64-linux-gnu/vdpau",
		"lib64",
		"usr/lib",
		"lib",
	}

	// compat32Dirs are searched for 32-bit libraries (compat32).
	compat32Dirs = []string{
		"usr/lib32",
		"usr/lib/i386-linux-gnu",
		"usr/lib/i386-linux-gnu/nvidia/current",
		"usr/lib/i386-linux-gnu/vdpau",
		"usr/lib",
		"lib32",
	}

	// binaryDirs are searched for the driver's binaries.
	binaryDirs = []string{"usr/bin", "usr/sbin", "bin", "sbin"}

	// firmwareDirs hold the GSP firmware, under "nvidia/<version>".
	firmwareDirs = []string{"lib/firmware", "usr/lib/firmware"}
)
