package simnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// Fixed device numbers of the NVIDIA kernel modules.
const (
	nvidiaMajor        = 195 // /dev/nvidia<minor>, nvidiactl, nvidia-modeset
	nvidiaCtlMinor     = 255
	nvidiaModesetMinor = 254
	drmMajor           = 226
)

// Makedev combines a major and a minor device number into a dev_t exactly
// like glibc's makedev(3) does on Linux (the 64-bit encoding, which is the
// classic major<<8|minor for small numbers).
func Makedev(major, minor uint32) uint64 {
	dev := (uint64(major) & 0x00000fff) << 8
	dev |= (uint64(major) & 0xfffff000) << 32
	dev |= uint64(minor) & 0x000000ff
	dev |= (uint64(minor) & 0xffffff00) << 12
	return dev
}

// Major returns the major number of dev, like glibc's major(3).
func Major(dev uint64) uint32 {
	return uint32((dev&0x00000000000fff00)>>8 | (dev&0xfffff00000000000)>>32)
}

// Minor returns the minor number of dev, like glibc's minor(3).
func Minor(dev uint64) uint32 {
	return uint32(dev&0x00000000000000ff | (dev&0x00000ffffff00000)>>12)
}

// staticCharMajors are the statically numbered character devices of a
// typical x86_64 GPU server, as /proc/devices lists them.
var staticCharMajors = []struct {
	major int
	name  string
}{
	{1, "mem"}, {4, "/dev/vc/0"}, {4, "tty"}, {4, "ttyS"}, {5, "/dev/tty"},
	{5, "/dev/console"}, {5, "/dev/ptmx"}, {5, "ttyprintk"}, {7, "vcs"},
	{10, "misc"}, {13, "input"}, {21, "sg"}, {29, "fb"}, {89, "i2c"},
	{99, "ppdev"}, {108, "ppp"}, {128, "ptm"}, {136, "pts"}, {180, "usb"},
	{188, "ttyUSB"}, {189, "usb_device"}, {nvidiaMajor, "nvidia"},
	{202, "cpu/msr"}, {203, "cpu/cpuid"}, {drmMajor, "drm"},
}

// dynamicCharDevices get majors handed out from the top of the dynamic range
// (511 downwards), skipping the nvidia-uvm major.
var dynamicCharDevices = []string{
	"hidraw", "aux", "bsg", "watchdog", "ptp", "pps", "rtc", "dma_heap",
	"nvidia-nvlink", "nvidia-nvswitch", "nvidia-caps", "nvidia-caps-imex-channels",
}

var blockMajors = `Block devices:
  7 loop
  8 sd
  9 md
 11 sr
 65 sd
 66 sd
 67 sd
 68 sd
 69 sd
 70 sd
 71 sd
128 sd
129 sd
130 sd
131 sd
132 sd
133 sd
134 sd
135 sd
253 device-mapper
254 mdp
259 blkext
`

// procDevices renders /proc/devices for a node whose nvidia-uvm major is uvm.
func procDevices(uvm int) (string, error) {
	type entry struct {
		major int
		name  string
	}
	var list []entry
	for _, e := range staticCharMajors {
		if e.major == uvm {
			return "", fmt.Errorf("simnode: nvidia-uvm major %d collides with %q", uvm, e.name)
		}
		list = append(list, entry{e.major, e.name})
	}
	list = append(list, entry{uvm, "nvidia-uvm"})
	next := 511
	for _, name := range dynamicCharDevices {
		if next == uvm {
			next--
		}
		list = append(list, entry{next, name})
		next--
	}
	// The kernel lists by major; a stable sort keeps the order of names
	// registered under the same major.
	sort.SliceStable(list, func(i, j int) bool { return list[i].major < list[j].major })
	var b strings.Builder
	b.WriteString("Character devices:\n")
	for _, e := range list {
		fmt.Fprintf(&b, "%3d %s\n", e.major, e.name)
	}
	b.WriteString("\n")
	b.WriteString(blockMajors)
	return b.String(), nil
}

// gpuInfo renders /proc/driver/nvidia/gpus/<bus>/information the way the
// kernel module's nv_procfs_read_gpu_info does.
func gpuInfo(g GPU, version string) string {
	excluded := "No"
	if g.Excluded {
		excluded = "Yes"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Model: \t\t %s\n", g.Model)
	fmt.Fprintf(&b, "IRQ:   \t\t %d\n", 0)
	fmt.Fprintf(&b, "GPU UUID: \t %s\n", g.UUID)
	fmt.Fprintf(&b, "Video BIOS: \t %s\n", "96.00.99.00.01")
	fmt.Fprintf(&b, "Bus Type: \t %s\n", "PCIe")
	fmt.Fprintf(&b, "DMA Size: \t %d bits\n", 52)
	fmt.Fprintf(&b, "DMA Mask: \t 0x%x\n", uint64(1)<<52-1)
	fmt.Fprintf(&b, "Bus Location: \t %s\n", g.BusID)
	fmt.Fprintf(&b, "Device Minor: \t %d\n", g.Minor)
	fmt.Fprintf(&b, "GPU Firmware: \t %s\n", version)
	fmt.Fprintf(&b, "GPU Excluded:\t %s\n", excluded)
	return b.String()
}

// writeGPUInfo writes the per-GPU information files. With clean, GPU
// directories left over from an earlier Generate are removed first.
func writeGPUInfo(root string, c *config, clean bool) error {
	dir := filepath.Join(root, "proc", "driver", "nvidia", "gpus")
	pci := filepath.Join(root, "sys", "bus", "pci", "devices")
	if clean {
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		if err := os.RemoveAll(pci); err != nil {
			return err
		}
	}
	for _, g := range c.gpus {
		p := filepath.Join(dir, g.BusID, "information")
		if err := writeFile(p, []byte(gpuInfo(g, c.version)), 0o644); err != nil {
			return err
		}
		if g.NUMANode != "" {
			if err := writeFile(filepath.Join(pci, g.BusID, "numa_node"), []byte(g.NUMANode+"\n"), 0o444); err != nil {
				return err
			}
		}
	}
	return os.MkdirAll(dir, 0o755)
}

// moduleParams is /proc/driver/nvidia/params as a driver loaded with its
// defaults reports it (the first lines; "Name: value" each): the
// libraries create and fix up device nodes (ModifyDeviceFiles: 1) as
// root:root mode 0666 (DeviceFileMode 438).
const moduleParams = "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n" +
	"InitializeSystemMemoryAllocations: 1\nUsePageAttributeTable: 4294967295\nEnableMSI: 1\nEnablePCIeGen3: 0\nMemoryPoolSize: 0\n"

// writeVersionFiles writes /proc/driver/nvidia/version and params,
// /sys/module/nvidia/version and /proc/sys/kernel/osrelease.
func writeVersionFiles(root string, c *config) error {
	if c.kernel != "-" {
		if err := writeFile(filepath.Join(root, "proc", "sys", "kernel", "osrelease"), []byte(c.kernel+"\n"), 0o644); err != nil {
			return err
		}
	}
	proc := kernelVersionLine(c.arch, c.version) + "\n" + "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"
	if err := writeFile(filepath.Join(root, "proc", "driver", "nvidia", "version"), []byte(proc), 0o644); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(root, "proc", "driver", "nvidia", "params"), []byte(moduleParams), 0o644); err != nil {
		return err
	}
	return writeFile(filepath.Join(root, "sys", "module", "nvidia", "version"), []byte(c.version+"\n"), 0o644)
}

// devNode is one /dev entry of the NVIDIA modules.
type devNode struct {
	name         string
	major, minor int
}

func devNodes(c *config) []devNode {
	var nodes []devNode
	for _, g := range c.gpus {
		nodes = append(nodes, devNode{fmt.Sprintf("nvidia%d", g.Minor), nvidiaMajor, g.Minor})
	}
	return append(nodes,
		devNode{"nvidiactl", nvidiaMajor, nvidiaCtlMinor},
		devNode{"nvidia-modeset", nvidiaMajor, nvidiaModesetMinor},
		devNode{"nvidia-uvm", c.uvmMajor, 0},
		devNode{"nvidia-uvm-tools", c.uvmMajor, 1},
	)
}

// writeDevNodes creates the /dev/nvidia* nodes, mode 0666: character
// devices with c.deviceNodes, empty regular files otherwise.
func writeDevNodes(root string, c *config) error {
	dir := filepath.Join(root, "dev")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range devNodes(c) {
		p := filepath.Join(dir, d.name)
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if c.deviceNodes {
			dev := Makedev(uint32(d.major), uint32(d.minor))
			if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(dev)); err != nil {
				return fmt.Errorf("simnode: mknod %s (%d:%d): %w", p, d.major, d.minor, err)
			}
		} else {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
			if err != nil {
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		}
		// Undo the umask.
		if err := os.Chmod(p, 0o666); err != nil {
			return err
		}
	}
	return nil
}

// writeKernel lays out the kernel side of the node: /proc, /sys and /dev.
func writeKernel(n *Node, c *config) error {
	if err := writeGPUInfo(n.Root, c, true); err != nil {
		return err
	}
	if err := writeVersionFiles(n.Root, c); err != nil {
		return err
	}
	devices, err := procDevices(c.uvmMajor)
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(n.Root, "proc", "devices"), []byte(devices), 0o644); err != nil {
		return err
	}
	if err := writeDevNodes(n.Root, c); err != nil {
		return err
	}
	if err := writeIMEXChannels(n.Root, c); err != nil {
		return err
	}
	return writeDRM(n.Root, c)
}
