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
			// Older drivers' (fatbinaryloader, compiler) and newer
			// drivers' (tileiras: Tile IR JIT), as libnvidia-container
			// lists them.
			"libnvidia-fatbinaryloader.so", "libnvidia-compiler.so", "libnvidia-tileiras.so",
		},
		inventory.Video: {"libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"},
		inventory.Graphics: {
			"libnvidia-eglcore.so", "libnvidia-glcore.so", "libnvidia-tls.so",
			"libnvidia-glsi.so", "libnvidia-fbc.so", "libnvidia-rtcore.so",
			"libnvoptix.so", "libGLX_nvidia.so", "libEGL_nvidia.so",
			"libGLESv2_nvidia.so", "libGLESv1_CM_nvidia.so", "libnvidia-glvkspirv.so",
			// Older drivers (libnvidia-container lists them).
			"libnvidia-ifr.so", "libnvidia-cbl.so", "libnvidia-vulkan-producer.so",
			// The EGL external platforms: GBM, Wayland, X11. They carry
			// their own versions, not the driver's (unversioned below).
			"libnvidia-egl-gbm.so", "libnvidia-egl-wayland.so", "libnvidia-egl-wayland2.so",
			"libnvidia-egl-xcb.so", "libnvidia-egl-xlib.so",
		},
		inventory.NGX: {"libnvidia-ngx.so"},
	}

	// unversionedLibraries carry versions of their own rather than the
	// driver's: no warning when their file name lacks the driver version.
	unversionedLibraries = map[string]bool{
		"libnvidia-egl-gbm.so": true, "libnvidia-egl-wayland.so": true, "libnvidia-egl-wayland2.so": true,
		"libnvidia-egl-xcb.so": true, "libnvidia-egl-xlib.so": true,
	}

	binaryNames = map[inventory.Capability][]string{
		inventory.Utility: {"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"},
		inventory.Compute: {"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"},
		// The toolkit's graphics discovery mounts nvidia-xconfig, for
		// containers that run an X server.
		inventory.Display: {"nvidia-xconfig"},
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

// configFile is a driver file that applications find at a fixed path: it
// is looked for under each of dirs (relative to the driver root) as rel,
// and mounted at Dst, or at its own path when Dst is empty.
type configFile struct {
	cap  inventory.Capability
	rel  string
	dirs []string
	dst  string
}

// Where the toolkit looks for the driver's configuration files: /etc and
// the XDG data directories.
var (
	etcDirs   = []string{"etc"}
	shareDirs = []string{"etc", "usr/local/share", "usr/share"}
	// xorgDirs hold the X.Org modules of the driver (the toolkit's
	// search list, for the 64-bit library directories).
	xorgDirs = []string{
		"usr/lib64/nvidia/xorg", "usr/lib/x86_64-linux-gnu/nvidia/xorg", "usr/lib/aarch64-linux-gnu/nvidia/xorg",
		"usr/lib64/xorg/modules/drivers", "usr/lib64/xorg/modules/extensions",
		"usr/lib/xorg/modules/drivers", "usr/lib/xorg/modules/extensions",
		"usr/lib64/xorg/modules/updates/drivers", "usr/lib64/xorg/modules/updates/extensions",
		"usr/lib/xorg/modules/updates/drivers", "usr/lib/xorg/modules/updates/extensions",
		"usr/lib/x86_64-linux-gnu/xorg/modules/drivers", "usr/lib/x86_64-linux-gnu/xorg/modules/extensions",
	}
	// wineDirs hold the NGX DLLs for Windows applications under Wine
	// and Proton.
	wineDirs = []string{"usr/lib/x86_64-linux-gnu/nvidia/wine", "usr/lib64/nvidia/wine", "usr/lib/nvidia/wine"}
)

// configFiles are the driver's files that are not libraries loaded by
// SONAME, by capability, after the NVIDIA Container Toolkit's graphics
// discovery (docs/capabilities.md compares them file by file). The
// version placeholder "{v}" stands for the driver version.
var configFiles = []configFile{
	{inventory.Graphics, "glvnd/egl_vendor.d/10_nvidia.json", shareDirs, "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"},
	{inventory.Graphics, "egl/egl_external_platform.d/15_nvidia_gbm.json", shareDirs, "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"},
	{inventory.Graphics, "egl/egl_external_platform.d/10_nvidia_wayland.json", shareDirs, "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json"},
	{inventory.Graphics, "egl/egl_external_platform.d/09_nvidia_wayland2.json", shareDirs, "/usr/share/egl/egl_external_platform.d/09_nvidia_wayland2.json"},
	{inventory.Graphics, "egl/egl_external_platform.d/20_nvidia_xcb.json", shareDirs, "/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json"},
	{inventory.Graphics, "egl/egl_external_platform.d/20_nvidia_xlib.json", shareDirs, "/usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json"},
	{inventory.Graphics, "nvidia/nvoptix.bin", shareDirs, "/usr/share/nvidia/nvoptix.bin"},
	{inventory.Graphics, "vulkan/icd.d/nvidia_icd.json", shareDirs, "/etc/vulkan/icd.d/nvidia_icd.json"},
	{inventory.Graphics, "vulkan/icd.d/nvidia_icd.x86_64.json", shareDirs, "/etc/vulkan/icd.d/nvidia_icd.x86_64.json"},
	{inventory.Graphics, "vulkan/icd.d/nvidia_layers.json", shareDirs, "/etc/vulkan/icd.d/nvidia_layers.json"},
	{inventory.Graphics, "vulkan/implicit_layer.d/nvidia_layers.json", shareDirs, "/etc/vulkan/implicit_layer.d/nvidia_layers.json"},
	{inventory.Graphics, "OpenCL/vendors/nvidia.icd", etcDirs, "/etc/OpenCL/vendors/nvidia.icd"},

	{inventory.Display, "X11/xorg.conf.d/10-nvidia.conf", shareDirs, "/usr/share/X11/xorg.conf.d/10-nvidia.conf"},
	{inventory.Display, "X11/xorg.conf.d/nvidia-drm-outputclass.conf", shareDirs, "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf"},
	// X.Org modules, at their host paths (a ModulePath of the mounted
	// xorg.conf.d stays valid). libglxserver_nvidia.so is what X.Org
	// loads; the installer's link to the versioned file becomes a second
	// mount of that file, as NRI has no symbolic links.
	{inventory.Display, "nvidia_drv.so", xorgDirs, ""},
	{inventory.Display, "libglxserver_nvidia.so.{v}", xorgDirs, ""},
	{inventory.Display, "libglxserver_nvidia.so.{v}", xorgDirs, "{dir}/libglxserver_nvidia.so"},

	{inventory.NGX, "nvngx.dll", wineDirs, "/usr/lib/x86_64-linux-gnu/nvidia/wine/nvngx.dll"},
	{inventory.NGX, "_nvngx.dll", wineDirs, "/usr/lib/x86_64-linux-gnu/nvidia/wine/_nvngx.dll"},
}

// ipcEndpoint is a driver daemon's socket or pipe directory, found at one
// of paths (relative to the driver root, as the toolkit looks) and mounted
// at its first path.
type ipcEndpoint struct {
	cap   inventory.Capability
	paths []string
	dir   bool
}

// ipcEndpoints are those libnvidia-container mounts: the persistenced and
// fabric manager sockets with utility (libnvidia-ml talks to them), the
// MPS pipe directory with compute (libcuda connects to an MPS server
// there; its path is the discovery's, Options.MPSPipeDir).
var ipcEndpoints = []ipcEndpoint{
	{inventory.Utility, []string{"run/nvidia-persistenced/socket", "var/run/nvidia-persistenced/socket"}, false},
	{inventory.Utility, []string{"run/nvidia-fabricmanager/socket", "var/run/nvidia-fabricmanager/socket"}, false},
	{inventory.Compute, []string{"tmp/nvidia-mps"}, true},
}
