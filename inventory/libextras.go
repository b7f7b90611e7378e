package inventory

import "path"

// LibraryExtra is a driver file that a container also finds below its
// 64-bit library directory, under a name of its own: where a loader looks
// for it relative to the driver's libraries, not by SONAME.
type LibraryExtra struct {
	// Name is the file's path relative to the library directory.
	Name string
	// Capability is the capability that brings it (not necessarily the
	// source file's own).
	Capability Capability
	// File is the discovered driver file whose content it is.
	File DriverFile
}

// GBMBackend is where GBM finds the NVIDIA backend relative to a library
// directory: the NVIDIA Container Toolkit links gbm/nvidia-drm_gbm.so to
// libnvidia-allocator.so.1 for graphics.
const GBMBackend = "gbm/nvidia-drm_gbm.so"

// EnvGBMBackendsPath is the variable that points GBM (Mesa's libgbm) at
// the directory of its backends.
const EnvGBMBackendsPath = "GBM_BACKENDS_PATH"

// wineDir is where Proton looks for the NGX DLLs: nvidia/wine beside the
// loaded libGLX_nvidia.so.0, that is below the library directory.
const wineDir = "nvidia/wine"

// LibraryExtras returns the extra entries of the 64-bit library directory
// that files (a snapshot's) call for: the GBM backend (the allocator
// library) with graphics, the NGX Wine DLLs with ngx. An entry exists only
// when its capability has 64-bit libraries, so that every prepared library
// directory of the capability can hold it. The order is files' order.
func LibraryExtras(files []DriverFile) []LibraryExtra {
	var present Capabilities
	for _, f := range files {
		if f.Kind == Library {
			present |= Capabilities(f.Capability)
		}
	}
	var out []LibraryExtra
	for _, f := range files {
		switch {
		case f.Kind == Library && f.Name == "libnvidia-allocator.so.1" && present.Has(Graphics):
			out = append(out, LibraryExtra{Name: GBMBackend, Capability: Graphics, File: f})
		case f.Kind == Config && f.Capability == NGX && path.Ext(f.Name) == ".dll" && present.Has(NGX):
			out = append(out, LibraryExtra{Name: path.Join(wineDir, path.Base(f.Name)), Capability: NGX, File: f})
		}
	}
	return out
}
