package discover

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// NVMLGPU is what NVML says of one GPU, the input of AddMIG (package node
// converts package nvml's answer; discovery does not call NVML itself).
type NVMLGPU struct {
	UUID       string
	MIGEnabled bool
	MIG        []NVMLMIG
	// MemoryMiB is the GPU's total memory; 0 when NVML did not say.
	MemoryMiB uint64
	// Props are the GPU's properties NVML reported; nil for none.
	Props *inventory.GPUProps
}

// NVMLMIG is one MIG device as NVML reports it.
type NVMLMIG struct {
	UUID      string
	Index     int
	GI, CI    int
	Profile   string
	MemoryMiB uint64
	// Placement and Engines are as inventory.MIGDevice's.
	Placement *inventory.MIGPlacement
	Engines   inventory.MIGEngines
}

// MIGMinors is /proc/driver/nvidia-caps/mig-minors: the nvidia-caps minor
// of each MIG capability; -1 where the file names none.
type MIGMinors struct {
	Config, Monitor int64
	// GI maps {gpu minor, gi} to the GI's access minor; CI maps
	// {gpu minor, gi, ci} to the CI's.
	GI map[[2]int]int64
	CI map[[3]int]int64
}

// Bounds of mig-minors: a real file is about 110 KiB (32 GPUs x 15 GPU
// instances x 9 lines).
const (
	maxMIGMinorsFile = 1 << 20
	maxMIGGPU        = 255
	maxMIGInstance   = 63
	maxCapsMinor     = 1 << 20
)

// ParseMIGMinors parses mig-minors: lines "config <minor>", "monitor
// <minor>", "gpu<G>/gi<I>/access <minor>" and "gpu<G>/gi<I>/ci<C>/access
// <minor>", G being the GPU's device minor. Other lines are ignored (later
// drivers may add capabilities); a malformed known line is an error.
func ParseMIGMinors(data []byte) (MIGMinors, error) {
	m := MIGMinors{Config: -1, Monitor: -1, GI: map[[2]int]int64{}, CI: map[[3]int]int64{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 256), maxProcLine)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		name, num, ok := strings.Cut(line, " ")
		if !ok {
			return m, fmt.Errorf("mig-minors: malformed line %q", truncate(line, 64))
		}
		minor, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
		if err != nil || minor < 0 || minor > maxCapsMinor {
			return m, fmt.Errorf("mig-minors: bad minor in line %q (valid: 0 to %d)", truncate(line, 64), maxCapsMinor)
		}
		switch {
		case name == "config":
			m.Config = minor
		case name == "monitor":
			m.Monitor = minor
		case strings.HasPrefix(name, "gpu"):
			parts := strings.Split(name, "/")
			if parts[len(parts)-1] != "access" || len(parts) < 3 || len(parts) > 4 {
				continue
			}
			g, ok1 := numAfter(parts[0], "gpu", maxMIGGPU)
			gi, ok2 := numAfter(parts[1], "gi", maxMIGInstance)
			if !ok1 || !ok2 {
				return m, fmt.Errorf("mig-minors: malformed line %q", truncate(line, 64))
			}
			if len(parts) == 3 {
				m.GI[[2]int{g, gi}] = minor
				continue
			}
			ci, ok := numAfter(parts[2], "ci", maxMIGInstance)
			if !ok {
				return m, fmt.Errorf("mig-minors: malformed line %q", truncate(line, 64))
			}
			m.CI[[3]int{g, gi, ci}] = minor
		}
	}
	if err := sc.Err(); err != nil {
		return m, fmt.Errorf("mig-minors: %w", err)
	}
	return m, nil
}

// numAfter parses s as prefix followed by a decimal number up to limit.
func numAfter(s, prefix string, limit int) (int, bool) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || rest == "" || len(rest) > 3 || (len(rest) > 1 && rest[0] == '0') {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n > limit {
		return 0, false
	}
	return n, true
}

// AddMIG returns a copy of snap with what NVML says of MIG: the
// MIG-enabled GPUs marked, their MIG devices with the capability nodes of
// their GPU and compute instance (from mig-minors and the nvidia-caps
// major under opts.HostRoot), and the MIG management capabilities. A MIG
// device whose capabilities cannot be numbered is left out with a
// warning; its GPU stays MIG-enabled (not handed out whole). snap itself
// is not modified.
func AddMIG(opts Options, snap *inventory.Snapshot, gpus []NVMLGPU) *inventory.Snapshot {
	out := *snap
	out.GPUs = slices.Clone(snap.GPUs)
	out.Warnings = slices.Clone(snap.Warnings)
	out.DeviceWarnings = slices.Clone(snap.DeviceWarnings)
	out.MIG = nil
	out.MIGControl = inventory.MIGControl{}
	d := &discovery{snap: &out}

	byUUID := map[string]NVMLGPU{}
	anyMIG := false
	for _, g := range gpus {
		byUUID[strings.ToUpper(g.UUID)] = g
		anyMIG = anyMIG || g.MIGEnabled
	}
	unanswered := shownGPUInstances(opts, out.GPUs, byUUID)
	for i := range out.GPUs {
		g, ok := byUUID[strings.ToUpper(out.GPUs[i].UUID)]
		out.GPUs[i].MIGEnabled = ok && g.MIGEnabled
		if gi, shown := unanswered[out.GPUs[i].UUID]; shown {
			// NVML has not answered for it (never yet: no last answer
			// to keep), but its driver shows GPU instances: MIG is on.
			// Not whole, and no MIG device: their UUIDs need NVML.
			out.GPUs[i].MIGEnabled = true
			anyMIG = true
			d.deviceWarnf("GPU %d (%s): NVML has not answered for it and the driver shows GPU instances (%s): MIG enabled, nothing of it is offered until NVML answers", out.GPUs[i].Index, out.GPUs[i].UUID, gi)
		}
		if ok {
			out.GPUs[i].MemoryMiB, out.GPUs[i].Props = g.MemoryMiB, g.Props
		}
	}
	if !anyMIG {
		return &out
	}

	if opts.HostRoot == "" {
		opts.HostRoot = "/"
	}
	host, err := os.OpenRoot(opts.HostRoot)
	if err != nil {
		d.deviceWarnf("MIG: opening hostRoot: %v: no MIG device is offered", err)
		return &out
	}
	defer host.Close()
	capsMajor, minors, err := readMIGNumbers(host)
	if err != nil {
		d.deviceWarnf("MIG: %v: no MIG device is offered", err)
		return &out
	}
	if minors.Config >= 0 {
		n := capNode(capsMajor, minors.Config)
		out.MIGControl.Config = &n
	}
	if minors.Monitor >= 0 {
		n := capNode(capsMajor, minors.Monitor)
		out.MIGControl.Monitor = &n
	}
	d.addMIGDevices(byUUID, minors, capsMajor)
	slices.SortFunc(out.MIG, func(a, b inventory.MIGDevice) int {
		return cmp.Or(cmp.Compare(a.Parent, b.Parent), cmp.Compare(a.Index, b.Index))
	})
	return &out
}

// maxGPUInstanceEntries bounds how many entries of a GPU's
// /proc/driver/nvidia/capabilities/gpu<minor>/mig directory are read.
const maxGPUInstanceEntries = 256

// shownGPUInstances returns, by UUID, those of gpus that NVML gave no
// answer for (not in byUUID) whose driver shows a GPU instance: a
// /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<N> directory (the
// driver makes one for each GPU instance that exists, and removes it with
// the instance), with the first such path.
func shownGPUInstances(opts Options, gpus []inventory.GPU, byUUID map[string]NVMLGPU) map[string]string {
	var out map[string]string
	var host *os.Root
	for _, g := range gpus {
		if _, ok := byUUID[strings.ToUpper(g.UUID)]; ok || g.Minor < 0 {
			continue
		}
		if host == nil {
			root := opts.HostRoot
			if root == "" {
				root = "/"
			}
			r, err := os.OpenRoot(root)
			if err != nil {
				return nil
			}
			defer r.Close()
			host = r
		}
		dir := fmt.Sprintf("proc/driver/nvidia/capabilities/gpu%d/mig", g.Minor)
		f, err := host.Open(dir)
		if err != nil {
			continue
		}
		names, _ := f.Readdirnames(maxGPUInstanceEntries)
		f.Close()
		slices.Sort(names)
		for _, n := range names {
			if _, ok := numAfter(n, "gi", maxMIGInstance); ok {
				if out == nil {
					out = map[string]string{}
				}
				out[g.UUID] = "/" + dir + "/" + n
				break
			}
		}
	}
	return out
}

// readMIGNumbers reads the nvidia-caps major from /proc/devices and the
// capability minors from /proc/driver/nvidia-caps/mig-minors.
func readMIGNumbers(host *os.Root) (int64, MIGMinors, error) {
	data, err := readSmall(host, "proc/devices")
	var majors map[string]int64
	if err == nil {
		majors, err = ParseProcDevices(data)
	}
	capsMajor, ok := majors["nvidia-caps"]
	if err == nil && !ok {
		err = fmt.Errorf("/proc/devices lists no nvidia-caps major")
	}
	if err != nil {
		return 0, MIGMinors{}, err
	}
	data, err = readLimited(host, "proc/driver/nvidia-caps/mig-minors", maxMIGMinorsFile)
	var minors MIGMinors
	if err == nil {
		minors, err = ParseMIGMinors(data)
	}
	if err != nil {
		return 0, MIGMinors{}, fmt.Errorf("reading /proc/driver/nvidia-caps/mig-minors: %v", err)
	}
	return capsMajor, minors, nil
}

// capNode is the nvidia-caps capability node of the given numbers.
func capNode(major, minor int64) inventory.DeviceNode {
	return inventory.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), Major: major, Minor: minor, Mode: 0o444}
}

// addMIGDevices adds to the snapshot the MIG devices that NVML reports
// (byUUID, by upper-case GPU UUID) of its MIG-enabled GPUs, numbered by
// minors; a device with a bad or repeated UUID, or that mig-minors does
// not number, is left out with a warning.
func (d *discovery) addMIGDevices(byUUID map[string]NVMLGPU, minors MIGMinors, capsMajor int64) {
	seen := map[string]bool{}
	for _, g := range d.snap.GPUs {
		ng := byUUID[strings.ToUpper(g.UUID)]
		if !g.MIGEnabled {
			continue
		}
		if len(ng.MIG) == 0 {
			d.warnf("GPU %d (%s) has MIG enabled but no MIG device: nothing of it is offered", g.Index, g.UUID)
		}
		for _, m := range ng.MIG {
			uuid := strings.TrimSpace(m.UUID)
			if !strings.HasPrefix(uuid, "MIG-") || len(uuid) > 64 || seen[strings.ToUpper(uuid)] {
				d.warnf("GPU %d: MIG device %d has a bad or repeated UUID %q: not offered", g.Index, m.Index, truncate(uuid, 64))
				continue
			}
			gi, ok1 := minors.GI[[2]int{g.Minor, m.GI}]
			ci, ok2 := minors.CI[[3]int{g.Minor, m.GI, m.CI}]
			if !ok1 || !ok2 {
				d.deviceWarnf("GPU %d: MIG device %s (GI %d, CI %d): mig-minors has no gpu%d/gi%d/ci%d: not offered", g.Index, uuid, m.GI, m.CI, g.Minor, m.GI, m.CI)
				continue
			}
			seen[strings.ToUpper(uuid)] = true
			d.snap.MIG = append(d.snap.MIG, inventory.MIGDevice{
				UUID: uuid, Index: m.Index, Parent: g.Index, ParentUUID: g.UUID, Profile: m.Profile,
				MemoryMiB: m.MemoryMiB, GI: m.GI, CI: m.CI, GINode: capNode(capsMajor, gi), CINode: capNode(capsMajor, ci),
				Placement: m.Placement, Engines: m.Engines,
			})
		}
	}
}
