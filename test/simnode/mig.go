package simnode

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// The nvidia-caps minors as the kernel module numbers them: config 1,
// monitor 2, then per GPU (device minor) 15 GPU instances of 9 minors
// each: the GI's access, then its 8 compute instances'.
const (
	capsMIGConfigMinor  = 1
	capsMIGMonitorMinor = 2
	capsMaxGPUs         = 32
	capsGIsPerGPU       = 15
	capsCIsPerGI        = 8
)

// GIMinor returns the nvidia-caps minor of GPU instance gi of the GPU
// with device minor gpu, as /proc/driver/nvidia-caps/mig-minors lists it.
func GIMinor(gpu, gi int) int {
	return 3 + gpu*capsGIsPerGPU*(capsCIsPerGI+1) + gi*(capsCIsPerGI+1)
}

// CIMinor returns the nvidia-caps minor of compute instance ci of GPU
// instance gi.
func CIMinor(gpu, gi, ci int) int { return GIMinor(gpu, gi) + 1 + ci }

// migMinors renders /proc/driver/nvidia-caps/mig-minors: every GPU,
// GPU instance and compute instance the module can number, whether it
// exists or not (a real file is about 110 KiB).
func migMinors() string {
	var b strings.Builder
	fmt.Fprintf(&b, "config %d\nmonitor %d\n", capsMIGConfigMinor, capsMIGMonitorMinor)
	for g := 0; g < capsMaxGPUs; g++ {
		for gi := 0; gi < capsGIsPerGPU; gi++ {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, gi, GIMinor(g, gi))
			for ci := 0; ci < capsCIsPerGI; ci++ {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, CIMinor(g, gi, ci))
			}
		}
	}
	return b.String()
}

// capFile renders a /proc/driver/nvidia/capabilities/.../access file.
func capFile(minor int) string {
	return fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor)
}

// CapsMajor returns the nvidia-caps major of the node's /proc/devices.
func (n *Node) CapsMajor() (int, error) {
	f, err := os.Open(n.HostPath("/proc/devices"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var major int
		var name string
		if _, err := fmt.Sscanf(sc.Text(), "%d %s", &major, &name); err == nil && name == "nvidia-caps" {
			return major, nil
		}
	}
	return 0, errors.New("simnode: /proc/devices lists no nvidia-caps")
}

// SetMIG lays out a MIG configuration like the driver shows it after
// `nvidia-smi mig -cgi ... -C`: the simulated NVML's state (WriteNVMLState),
// /proc/driver/nvidia-caps/mig-minors, the capability files of the
// existing GPU and compute instances under
// /proc/driver/nvidia/capabilities (with mig/config and mig/monitor), and
// the /dev/nvidia-caps/nvidia-cap<minor> nodes of those (character
// devices of the nvidia-caps major where the node's /dev/nvidiactl is one,
// empty files otherwise). A GPU instance or compute instance removed since
// the last call loses its files, as with nvidia-smi mig -dci/-dgi.
func (n *Node) SetMIG(st NVMLState) error {
	if err := n.WriteNVMLState(st); err != nil {
		return err
	}
	if err := n.dropMIGModes(); err != nil {
		return err
	}
	if err := writeFile(n.HostPath("/proc/driver/nvidia-caps/mig-minors"), []byte(migMinors()), 0o444); err != nil {
		return err
	}
	caps := n.HostPath("/proc/driver/nvidia/capabilities")
	for _, g := range n.GPUs {
		if err := os.RemoveAll(filepath.Join(caps, fmt.Sprintf("gpu%d", g.Minor))); err != nil {
			return err
		}
	}
	devDir := n.HostPath("/dev/nvidia-caps")
	if err := os.RemoveAll(devDir); err != nil {
		return err
	}
	major, err := n.CapsMajor()
	if err != nil {
		return err
	}
	fi, err := os.Lstat(n.HostPath("/dev/nvidiactl"))
	mknod := err == nil && fi.Mode()&fs.ModeCharDevice != 0
	files := map[string]int{"mig/config": capsMIGConfigMinor, "mig/monitor": capsMIGMonitorMinor}
	for i, g := range n.GPUs {
		if i >= len(st.GPUs) || st.GPUs[i].MIGMode != 1 {
			continue
		}
		for _, m := range st.GPUs[i].MIG {
			files[fmt.Sprintf("gpu%d/mig/gi%d/access", g.Minor, m.GI)] = GIMinor(g.Minor, m.GI)
			files[fmt.Sprintf("gpu%d/mig/gi%d/ci%d/access", g.Minor, m.GI, m.CI)] = CIMinor(g.Minor, m.GI, m.CI)
		}
	}
	if err := os.MkdirAll(devDir, 0o755); err != nil {
		return err
	}
	for rel, minor := range files {
		if err := writeFile(filepath.Join(caps, filepath.FromSlash(rel)), []byte(capFile(minor)), 0o444); err != nil {
			return err
		}
		p := filepath.Join(devDir, fmt.Sprintf("nvidia-cap%d", minor))
		if mknod {
			if err := syscall.Mknod(p, syscall.S_IFCHR|0o444, int(Makedev(uint32(major), uint32(minor)))); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("simnode: mknod %s: %w", p, err)
			}
		} else if err := writeFile(p, nil, 0o444); err != nil {
			return err
		}
		if err := os.Chmod(p, 0o444); err != nil {
			return err
		}
	}
	return nil
}

// H100MIG returns a MIG device of an H100 80GB whose GPU and compute
// instance span slices slices (1, 2, 3, 4 or 7: 1g.10gb, 2g.20gb,
// 3g.40gb, 4g.40gb, 7g.80gb), with the memory NVML reports for that
// profile.
func H100MIG(gi, ci, slices int) MIG {
	m := MIG{GI: gi, CI: ci, GISlices: slices, CISlices: slices}
	if p, ok := ProfileOf(h100Profiles, m); ok {
		m.MemoryMiB = p.MemoryMiB
	}
	return m
}

// ProfileMIG returns the MIG device of GPU instance gi, with a compute
// instance of all its slices, of profile (as nvidia-smi mig -lgip names
// it) on a GPU of model, with the memory NVML reports for that profile;
// ok is false when model has no such profile.
func ProfileMIG(model, profile string, gi int) (m MIG, ok bool) {
	p, ok := ProfileOf(MIGProfiles(model), MIG{Profile: profile})
	if !ok {
		return MIG{}, false
	}
	return MIG{GI: gi, GISlices: p.Slices, CISlices: p.Slices, MemoryMiB: p.MemoryMiB, Profile: p.Name}, true
}

// A100HalfBalanced is the MIG layout NVIDIA's DRA driver's quickstart puts
// on an A100 40GB with nvidia-mig-parted's "half-balanced" configuration:
// two 1g.5gb, one 2g.10gb and one 3g.20gb, placed as nvidia-smi places
// them (3g.20gb on memory slices 4 to 7: GPU instance 2; 2g.10gb on 0 and
// 1: 3; the 1g.5gb on 2 and 3: 9 and 10, by MIGPlacementStart's rule).
func A100HalfBalanced() []MIG {
	var out []MIG
	for _, p := range []struct {
		name string
		gi   int
	}{{"3g.20gb", 2}, {"2g.10gb", 3}, {"1g.5gb", 9}, {"1g.5gb", 10}} {
		m, _ := ProfileMIG(A100Model, p.name, p.gi)
		out = append(out, m)
	}
	return out
}

// MixedMIG is the MIG layout of the tests: GPU 0 in seven 1g.10gb
// devices (GPU instances 7 to 13, as nvidia-smi places them), GPU 1 in
// three 2g.20gb (GPU instances 3 to 5) and one 1g.10gb (13), the other
// GPUs without MIG.
func MixedMIG() NVMLState {
	var seven []MIG
	for gi := 7; gi <= 13; gi++ {
		seven = append(seven, H100MIG(gi, 0, 1))
	}
	return NVMLState{GPUs: []NVMLGPU{
		{MIGMode: 1, MIG: seven},
		{MIGMode: 1, MIG: []MIG{H100MIG(3, 0, 2), H100MIG(4, 0, 2), H100MIG(5, 0, 2), H100MIG(13, 0, 1)}},
	}}
}

// MemoryCapsMajor is the nvidia-caps major of MemoryMIGSnapshot.
const MemoryCapsMajor = 500

// MemoryMIGSnapshot is MemorySnapshot with MixedMIG's layout: GPU 0 in
// seven 1g.10gb MIG devices, GPU 1 in three 2g.20gb and one 1g.10gb, the
// six others whole; with the nvidia-caps nodes the driver numbers them
// with and the MIG management capabilities.
func MemoryMIGSnapshot() *inventory.Snapshot {
	s := MemorySnapshot()
	node := func(minor int) inventory.DeviceNode {
		return inventory.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), Major: MemoryCapsMajor, Minor: int64(minor), Mode: 0o444}
	}
	cfg, mon := node(capsMIGConfigMinor), node(capsMIGMonitorMinor)
	s.MIGControl = inventory.MIGControl{Config: &cfg, Monitor: &mon}
	s.NVML = "ok"
	for i, ng := range MixedMIG().GPUs {
		g := &s.GPUs[i]
		g.MIGEnabled = true
		for j, m := range ng.MIG {
			s.MIG = append(s.MIG, inventory.MIGDevice{
				UUID: MIGUUIDFor(g.UUID, m.GI, m.CI), Index: j, Parent: g.Index, ParentUUID: g.UUID,
				Profile: fmt.Sprintf("%dg.%dgb", m.GISlices, m.GISlices*10), MemoryMiB: m.MemoryMiB, GI: m.GI, CI: m.CI,
				GINode: node(GIMinor(g.Minor, m.GI)), CINode: node(CIMinor(g.Minor, m.GI, m.CI)),
			})
		}
	}
	return s
}

// dropMIGModes removes the MIG modes nvmlDeviceSetMigMode set (the
// "dmode" lines of MIGInstancesFile): the modes SetMIG writes are the
// GPUs' now, as after an operator's nvidia-smi -mig.
func (n *Node) dropMIGModes() error {
	p := filepath.Join(filepath.Dir(n.HostPath(NVMLStatePath)), MIGInstancesFile)
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var keep []string
	for _, l := range strings.SplitAfter(string(data), "\n") {
		if l != "" && !strings.HasPrefix(l, "dmode ") {
			keep = append(keep, l)
		}
	}
	return os.WriteFile(p, []byte(strings.Join(keep, "")), 0o644)
}
