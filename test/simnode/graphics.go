package simnode

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// RenderGID is the group of the simulated /dev/dri nodes (mode 0660), as
// a distribution's "render" group owns them; a container user needs it
// among its groups to open them.
const RenderGID = 109

// DRM numbering of the simulated node: /dev/dri/card0 is the BMC's
// display (a PCI device that is no GPU), GPU i (in bus order) has
// card<i+1> and renderD<129+i>.
const (
	bmcBusID    = "0000:03:00.0"
	firstRender = 128
)

// CardPath returns the DRM card node Generate gives the GPU of index i.
func CardPath(i int) string { return fmt.Sprintf("/dev/dri/card%d", i+1) }

// RenderPath returns the DRM render node Generate gives the GPU of index i.
func RenderPath(i int) string { return fmt.Sprintf("/dev/dri/renderD%d", firstRender+1+i) }

// vendorFile is a file of the driver that is not a library loaded by
// SONAME, at the path the .run installer (and the distributions'
// packages) put it.
type vendorFile struct {
	path string // absolute, inside the node; {v} is the driver version, {lib} the library directory
	cap  string
	// content is the file's content; {v} is the driver version.
	content string
	// elf builds the file as a shared object instead; link, when not
	// empty, is the installer's symbolic link to it.
	elf  bool
	link string
	// container are the paths where a container with the capability
	// finds the file (the loaders' search paths); empty means its own.
	container []string
}

const eglICD = `{
    "file_format_version" : "1.0.0",
    "ICD" : {
        "library_path" : "%s"
    }
}
`

const vulkanICD = `{
    "file_format_version" : "1.0.1",
    "ICD": {
        "library_path": "libGLX_nvidia.so.0",
        "api_version" : "1.4.312"
    }
}
`

const vulkanLayers = `{
    "file_format_version" : "1.0.1",
    "layer": {
        "name": "VK_LAYER_NV_optimus",
        "type": "INSTANCE",
        "library_path": "libGLX_nvidia.so.0",
        "api_version" : "1.4.312",
        "implementation_version" : "1",
        "description" : "NVIDIA Optimus layer",
        "functions": {
            "vkGetInstanceProcAddr": "vk_optimusGetInstanceProcAddr",
            "vkGetDeviceProcAddr": "vk_optimusGetDeviceProcAddr"
        },
        "enable_environment": {
            "__NV_PRIME_RENDER_OFFLOAD": "1"
        },
        "disable_environment": {
            "DISABLE_LAYER_NV_OPTIMUS_1": ""
        }
    }
}
`

const xorgConf = `Section "OutputClass"
    Identifier "nvidia"
    MatchDriver "nvidia-drm"
    Driver "nvidia"
    Option "AllowEmptyInitialConfiguration"
    ModulePath "{xorg}/nvidia/xorg"
EndSection
`

// vendorFiles are the driver's other files, as the installer lays them
// out for the RHEL layout; xorgDir and wineDir differ per layout.
func vendorFiles(c *config) []vendorFile {
	xorg := "/usr/lib64/xorg/modules"
	wine := "/usr/lib64/nvidia/wine"
	if c.layout == LayoutDebian {
		xorg = "/usr/lib/xorg/modules"
		wine = "/usr/lib/x86_64-linux-gnu/nvidia/wine"
	}
	return []vendorFile{
		{path: "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", cap: CapGraphics, content: fmt.Sprintf(eglICD, "libEGL_nvidia.so.0")},
		{path: "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json", cap: CapGraphics, content: fmt.Sprintf(eglICD, "libnvidia-egl-gbm.so.1")},
		{path: "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json", cap: CapGraphics, content: fmt.Sprintf(eglICD, "libnvidia-egl-wayland.so.1")},
		{path: "/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json", cap: CapGraphics, content: fmt.Sprintf(eglICD, "libnvidia-egl-xcb.so.1")},
		{path: "/usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json", cap: CapGraphics, content: fmt.Sprintf(eglICD, "libnvidia-egl-xlib.so.1")},
		{path: "/usr/share/vulkan/icd.d/nvidia_icd.json", cap: CapGraphics, content: vulkanICD, container: []string{"/etc/vulkan/icd.d/nvidia_icd.json"}},
		{path: "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json", cap: CapGraphics, content: vulkanLayers, container: []string{"/etc/vulkan/implicit_layer.d/nvidia_layers.json"}},
		{path: "/etc/OpenCL/vendors/nvidia.icd", cap: CapGraphics, content: "libnvidia-opencl.so.1\n"},
		{path: "/usr/share/nvidia/nvoptix.bin", cap: CapGraphics, content: "NVIDIA OptiX {v} simulated shader cache\n"},
		{path: "/usr/share/X11/xorg.conf.d/10-nvidia.conf", cap: CapDisplay, content: strings.ReplaceAll(xorgConf, "{xorg}", path.Dir(xorg))},
		{path: xorg + "/drivers/nvidia_drv.so", cap: CapDisplay, elf: true},
		{path: xorg + "/extensions/libglxserver_nvidia.so.{v}", cap: CapDisplay, elf: true, link: "libglxserver_nvidia.so",
			container: []string{xorg + "/extensions/libglxserver_nvidia.so.{v}", xorg + "/extensions/libglxserver_nvidia.so"}},
		{path: wine + "/nvngx.dll", cap: CapNGX, content: "MZ simulated nvngx.dll {v}\n", container: []string{"/usr/lib/x86_64-linux-gnu/nvidia/wine/nvngx.dll"}},
		{path: wine + "/_nvngx.dll", cap: CapNGX, content: "MZ simulated _nvngx.dll {v}\n", container: []string{"/usr/lib/x86_64-linux-gnu/nvidia/wine/_nvngx.dll"}},
	}
}

// moduleSource is the C source of a simulated X.Org module.
const moduleSource = `/* %[1]s: simulated X.Org module of driver %[2]s, generated by
 * github.com/nri-gpu/nri-gpu/test/simnode. It is not the NVIDIA driver. */
const char nri_gpu_sim_module[] = "%[1]s %[2]s";
`

// vendorJobs returns the gcc jobs of the ELF vendor files, in the order
// of vendorFiles' ELF entries.
func vendorJobs(c *config) []elfJob {
	var jobs []elfJob
	for _, f := range vendorFiles(c) {
		if !f.elf {
			continue
		}
		name := path.Base(strings.ReplaceAll(f.path, "{v}", c.version))
		jobs = append(jobs, elfJob{name: name, source: fmt.Sprintf(moduleSource, name, c.version), args: []string{"-shared", "-fPIC"}})
	}
	return jobs
}

// writeVendorFiles lays out vendorFiles; built holds the ELF files of
// vendorJobs.
func writeVendorFiles(root string, c *config, built []string) ([]File, error) {
	var files []File
	for _, f := range vendorFiles(c) {
		p := strings.ReplaceAll(f.path, "{v}", c.version)
		dst := filepath.Join(root, filepath.FromSlash(p))
		if f.elf {
			if err := copyFile(built[0], dst, 0o755); err != nil {
				return nil, err
			}
			built = built[1:]
		} else if err := writeFile(dst, []byte(strings.ReplaceAll(f.content, "{v}", c.version)), 0o644); err != nil {
			return nil, err
		}
		if f.link != "" {
			if err := symlink(path.Base(p), filepath.Join(filepath.Dir(dst), f.link)); err != nil {
				return nil, err
			}
		}
		container := []string{p}
		if f.container != nil {
			container = nil
			for _, dst := range f.container {
				container = append(container, strings.ReplaceAll(dst, "{v}", c.version))
			}
		}
		files = append(files, File{Path: p, Capability: f.cap, Container: container})
	}
	return files, nil
}

// writeDRM lays out the DRM side of the GPUs: the sysfs drm directories
// by bus id, the /dev/dri nodes (226:N, mode 0660, group RenderGID; empty
// regular files without c.deviceNodes) and the /dev/dri/by-path links
// udev makes. The BMC's card0 is there too, under a bus that is no GPU.
func writeDRM(root string, c *config) error {
	dri := filepath.Join(root, "dev", "dri")
	if err := os.RemoveAll(dri); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dri, "by-path"), 0o755); err != nil {
		return err
	}
	type drm struct {
		bus, name string
		minor     int
		kind      string
	}
	nodes := []drm{{bmcBusID, "card0", 0, "card"}}
	for i, g := range c.gpus {
		nodes = append(nodes,
			drm{g.BusID, path.Base(CardPath(i)), i + 1, "card"},
			drm{g.BusID, path.Base(RenderPath(i)), firstRender + 1 + i, "render"})
	}
	for _, n := range nodes {
		pci, err := pciDeviceDir(root, n.bus, "")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(pci, "drm", n.name), 0o755); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(pci, "drm", n.name, "dev"), fmt.Appendf(nil, "%d:%d\n", drmMajor, n.minor), 0o444); err != nil {
			return err
		}
		p := filepath.Join(dri, n.name)
		if c.deviceNodes {
			if err := syscall.Mknod(p, syscall.S_IFCHR|0o660, int(Makedev(drmMajor, uint32(n.minor)))); err != nil {
				return fmt.Errorf("simnode: mknod %s: %w", p, err)
			}
			if err := os.Chown(p, 0, RenderGID); err != nil {
				return err
			}
		} else if err := writeFile(p, nil, 0o660); err != nil {
			return err
		}
		if err := os.Chmod(p, 0o660); err != nil {
			return err
		}
		if err := os.Symlink("../"+n.name, filepath.Join(dri, "by-path", "pci-"+n.bus+"-"+n.kind)); err != nil {
			return err
		}
	}
	return nil
}

// IPC endpoints the driver's daemons make (Options.IPC).
const (
	PersistencedSocket  = "/run/nvidia-persistenced/socket"
	FabricManagerSocket = "/run/nvidia-fabricmanager/socket"
	MPSPipeDir          = "/tmp/nvidia-mps"
)

// writeIPC makes the persistenced and fabric manager sockets (socket
// files made with mknod, which needs no privilege; nothing listens) and
// the MPS pipe directory.
func writeIPC(root string) error {
	for _, s := range []string{PersistencedSocket, FabricManagerSocket} {
		p := filepath.Join(root, filepath.FromSlash(s))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := syscall.Mknod(p, syscall.S_IFSOCK|0o666, 0); err != nil {
			return fmt.Errorf("simnode: mknod %s: %w", s, err)
		}
	}
	return os.MkdirAll(filepath.Join(root, filepath.FromSlash(MPSPipeDir)), 0o755)
}
