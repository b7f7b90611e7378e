package simnode

import (
	"fmt"
	"strconv"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// MemorySnapshot is a node with 8 GPUs and 40 driver files of every
// capability (38 libraries, nvidia-smi and the firmware directory), built
// in memory: no file behind it. Tests and benchmarks of the request path
// use it.
func MemorySnapshot() *inventory.Snapshot {
	s := &inventory.Snapshot{
		DriverVersion: "580.126.09",
		Control: inventory.ControlNodes{
			Ctl:      &inventory.DeviceNode{Path: "/dev/nvidiactl", Major: 195, Minor: 255, Mode: 0o666},
			UVM:      &inventory.DeviceNode{Path: "/dev/nvidia-uvm", Major: 510, Minor: 0, Mode: 0o666},
			UVMTools: &inventory.DeviceNode{Path: "/dev/nvidia-uvm-tools", Major: 510, Minor: 1, Mode: 0o666},
			Modeset:  &inventory.DeviceNode{Path: "/dev/nvidia-modeset", Major: 195, Minor: 254, Mode: 0o666},
		},
	}
	for i := 0; i < 8; i++ {
		s.GPUs = append(s.GPUs, inventory.GPU{
			Index: i, Minor: i, UUID: fmt.Sprintf("GPU-%08x-558d-fb20-8eca-25de8b98f5a7", i),
			BusID: fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10),
			Node:  inventory.DeviceNode{Path: "/dev/nvidia" + strconv.Itoa(i), Major: 195, Minor: int64(i), Mode: 0o666},
		})
	}
	caps := []inventory.Capability{inventory.Utility, inventory.Compute, inventory.Video, inventory.Graphics, inventory.NGX}
	for i := 0; i < 38; i++ {
		c := caps[i%len(caps)]
		s.Files = append(s.Files, inventory.DriverFile{
			Kind: inventory.Library, Capability: c,
			HostPath: fmt.Sprintf("/usr/lib64/libnvidia-%d.so.580.126.09", i), Name: fmt.Sprintf("libnvidia-%d.so.1", i),
		})
	}
	s.Files = append(s.Files,
		inventory.DriverFile{Kind: inventory.Binary, Capability: inventory.Utility, HostPath: "/usr/bin/nvidia-smi", Name: "nvidia-smi"},
		inventory.DriverFile{Kind: inventory.FirmwareDir, HostPath: "/lib/firmware/nvidia/580.126.09", Name: "580.126.09"},
	)
	return s
}

// TableFor returns an empty allocation table for the GPUs (and MIG
// devices) of s.
func TableFor(s *inventory.Snapshot) *alloc.Table {
	var idx []int
	for _, g := range s.Units() {
		idx = append(idx, g.Index)
	}
	return alloc.New(idx)
}
