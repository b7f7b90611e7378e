package simnode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PCIeRootFor returns the PCIe root complex ("pci<domain>:<bus>") that
// the simulated node puts the PCI device at busID under: the bus number
// with its low four bits clear ("0000:1b:00.0" -> "pci0000:10"). The
// default GPUs (DefaultBusID) each get a root of their own, as on an HGX
// board, where each GPU sits behind its own root port; a device at the
// next bus number (a NIC beside a GPU, AddPCIDevice) shares the GPU's.
func PCIeRootFor(busID string) string {
	bus := strings.ToLower(busID)
	dom, rest, ok := strings.Cut(bus, ":")
	if !ok || len(rest) < 2 {
		return ""
	}
	n, err := strconv.ParseUint(rest[:2], 16, 8)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("pci%s:%02x", dom, n&^0xf)
}

// pciDeviceDir makes the sysfs directory of the PCI device at bus under
// root, where the kernel has it, below its root complex and root port
// (/sys/devices/pci0000:10/0000:10:01.0/0000:1b:00.0), with
// /sys/bus/pci/devices/<bus> a relative link to it, and returns the
// directory. A directory already at /sys/bus/pci/devices/<bus> is kept.
func pciDeviceDir(root, bus, pcieRoot string) (string, error) {
	link := filepath.Join(root, "sys", "bus", "pci", "devices", bus)
	if fi, err := os.Lstat(link); err == nil && fi.IsDir() {
		return link, nil
	}
	if pcieRoot == "" {
		pcieRoot = PCIeRootFor(bus)
	}
	if pcieRoot == "" {
		return "", fmt.Errorf("simnode: no PCIe root for bus id %q", bus)
	}
	port := strings.TrimPrefix(pcieRoot, "pci") + ":01.0"
	rel := filepath.Join("devices", pcieRoot, port, bus)
	dir := filepath.Join(root, "sys", rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return "", err
	}
	if err := symlink(filepath.Join("..", "..", "..", rel), link); err != nil {
		return "", err
	}
	return dir, nil
}

// removePCI removes the simulated PCI devices of /sys.
func removePCI(root string) error {
	for _, d := range []string{filepath.Join(root, "sys", "bus", "pci", "devices"), filepath.Join(root, "sys", "devices")} {
		if err := os.RemoveAll(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// PCIDevice is a PCI device of the simulated node other than a GPU: a
// NIC beside a GPU, for DRA drivers that align devices by PCIe root.
type PCIDevice struct {
	BusID string // "0000:1c:00.0"
	// Root is its PCIe root complex; empty: PCIeRootFor(BusID).
	Root string
	// Class is its PCI class (sysfs "class"); empty: 0x020000, an
	// Ethernet controller.
	Class string
	// NUMANode, when not empty, is written to numa_node.
	NUMANode string
}

// AddPCIDevice lays out d in the node's sysfs as the kernel has it: its
// directory under its root complex, /sys/bus/pci/devices/<bus> linking to
// it, its class and NUMA node files.
func (n *Node) AddPCIDevice(d PCIDevice) error {
	bus := strings.ToLower(strings.TrimSpace(d.BusID))
	if !busIDRE.MatchString(bus) || len(bus) != len("0000:00:00.0") {
		return fmt.Errorf("simnode: invalid PCI bus id %q", d.BusID)
	}
	dir, err := pciDeviceDir(n.Root, bus, d.Root)
	if err != nil {
		return err
	}
	class := d.Class
	if class == "" {
		class = "0x020000"
	}
	if err := writeFile(filepath.Join(dir, "class"), []byte(class+"\n"), 0o444); err != nil {
		return err
	}
	if d.NUMANode != "" {
		return writeFile(filepath.Join(dir, "numa_node"), []byte(d.NUMANode+"\n"), 0o444)
	}
	return nil
}
