package simnode

import (
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// NVMLStatePath is where, inside the node tree, the simulated
// libnvidia-ml.so.1 reads the node's state (GPUs, MIG devices, XID
// events). The library finds it by walking up from its own directory, so
// the same compiled object serves every tree; NVMLStateEnv overrides it.
// Without the file the library answers as before: nvmlInit_v2 succeeds and
// GPUs are counted from /dev.
const NVMLStatePath = "/run/nri-gpu-sim/nvml-state"

// NVMLStateEnv names the environment variable that points the simulated
// NVML at another state file.
const NVMLStateEnv = "NRI_GPU_SIM_NVML_STATE"

// nvmlC is the simulated NVML (nvml.c): the functions nri-gpu calls, with
// the names, signatures and struct layouts of NVIDIA's nvml.h.
//
//go:embed nvml.c
var nvmlC string

// ComputeModeFile is the file, beside the NVML state file, where the
// simulated NVML keeps each GPU's compute mode ("<uuid> <mode>" lines;
// nvmlDeviceSetComputeMode writes it, as root only).
const ComputeModeFile = "compute-mode"

// nvmlMIGCreateC is the simulated NVML's MIG made on demand
// (nvml_migcreate.c): GPU and compute instances created and destroyed
// with the driver's placement rules, appended to nvml.c.
//
//go:embed nvml_migcreate.c
var nvmlMIGCreateC string

// MIGInstancesFile is the file, beside the NVML state file, where the
// simulated NVML keeps the GPU and compute instances made through it
// ("dgi" and "dci" lines, nvml_migcreate.c), as the driver keeps them
// until the GPU is reset.
const MIGInstancesFile = "mig-instances"

// nvmlSymbolsTxt lists every function of NVML that NVIDIA's go-nvml binds
// (nvml_symbols.txt).
//
//go:embed nvml_symbols.txt
var nvmlSymbolsTxt string

// nvmlSource is nvml.c with the state file's variable and path it reads,
// and the functions it does not implement as NOT_SUPPORTED stubs.
var nvmlSource = "#define NRI_GPU_SIM_NVML_STATE_ENV \"" + NVMLStateEnv + "\"\n" +
	"#define NRI_GPU_SIM_NVML_STATE_PATH \"" + NVMLStatePath + "\"\n" +
	"#define NRI_GPU_SIM_COMPUTE_MODE_FILE \"" + ComputeModeFile + "\"\n" +
	"#define NRI_GPU_SIM_MIG_INSTANCES_FILE \"" + MIGInstancesFile + "\"\n" +
	"#define NVML_SIM_STUBS " + nvmlStubs() + "\n" + nvmlC + nvmlMIGCreateC

// NVMLSymbols returns the functions of NVML the simulated library exports:
// every one NVIDIA's go-nvml binds (v0.13.3-1, what NVIDIA's DRA driver
// v0.5.0 builds with). Those nvml.c does not implement answer
// NVML_ERROR_NOT_SUPPORTED.
func NVMLSymbols() []string {
	var out []string
	for _, line := range strings.Split(nvmlSymbolsTxt, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	return out
}

// nvmlDefined matches a function nvml.c defines.
var nvmlDefined = regexp.MustCompile(`(?m)^(?:int |const char \*)(nvml\w+)\(`)

// NVMLImplemented returns the functions nvml.c implements (the others of
// NVMLSymbols are stubs). With Options.NVMLWithoutProps some of them are
// left out, and their stubs with them.
func NVMLImplemented() []string {
	var out []string
	for _, m := range nvmlDefined.FindAllStringSubmatch(nvmlC+nvmlMIGCreateC, -1) {
		out = append(out, m[1])
	}
	return out
}

// nvmlStubs renders SIM_STUB(name) for each of NVMLSymbols nvml.c does not
// define.
func nvmlStubs() string {
	defined := map[string]bool{}
	for _, f := range NVMLImplemented() {
		defined[f] = true
	}
	var b strings.Builder
	for _, f := range NVMLSymbols() {
		if !defined[f] {
			b.WriteString(" SIM_STUB(" + f + ")")
		}
	}
	return b.String()
}

// MIG is one simulated MIG device: a compute instance CI of GPU instance
// GI of its GPU.
type MIG struct {
	GI, CI int
	// GISlices and CISlices are the GPU and compute instance's slices
	// (1 and 1 for a 1g.10gb).
	GISlices, CISlices int
	// MemoryMiB is the instance's memory (9984 for an H100's 1g.10gb).
	MemoryMiB uint64
	// UUID is "MIG-<uuid>"; empty gets a deterministic one.
	UUID string
	// Profile is the GPU instance's profile as nvidia-smi mig -lgip names
	// it ("1g.10gb", "1g.10gb+me", "1g.20gb"); empty: the profile of
	// GISlices slices without media extensions. It must be one of the
	// GPU's (MIGProfiles); on a GPU without profiles NVML reports no GPU
	// instance. Its placement follows from GI (see MIGPlacementStart).
	Profile string
}

// NVMLGPU is the NVML side of one simulated GPU.
type NVMLGPU struct {
	// MIGMode is 1 when MIG is enabled, 0 when not, -1 when the GPU does
	// not support MIG.
	MIGMode int
	MIG     []MIG
	// Lost makes NVML report the GPU lost (NVML_ERROR_GPU_IS_LOST).
	Lost bool
	// Error makes every query of the GPU fail with this NVML return code
	// (999: NVML_ERROR_UNKNOWN), as when the driver cannot answer for
	// it; Lost wins over it.
	Error int
	// MemoryMiB is the GPU's memory; 0 gives 81559 (an H100 80GB).
	MemoryMiB uint64
	// AddressingMode is what nvmlDeviceGetAddressingMode reports ("HMM",
	// "ATS", "None"); empty: NOT_SUPPORTED, as on an x86 node.
	AddressingMode string
	// GIError makes nvmlDeviceGetGpuInstanceById fail with this NVML
	// return code (4, NVMLErrorNoPermission: a process NVML refuses GPU
	// instances to).
	GIError int
}

// XID is a simulated XID event.
type XID struct {
	GPU int // index
	XID uint64
	// GI and CI attribute the event to a MIG instance; -1 for none.
	GI, CI int
}

// NVMLState is what the simulated NVML reports: per GPU (by index), and
// the XID events so far; and how it fails.
type NVMLState struct {
	GPUs   []NVMLGPU
	Events []XID
	// CountError makes nvmlDeviceGetCount_v2 fail with this NVML return
	// code: an enumeration that fails as a whole.
	CountError int
	// InitDelay is how long nvmlInit_v2 takes (a driver that is slow to
	// initialize, or hangs for a while).
	InitDelay time.Duration
}

// nvmlErrorGPUIsLost is NVML_ERROR_GPU_IS_LOST.
const nvmlErrorGPUIsLost = 15

// NVMLErrorUnknown is NVML_ERROR_UNKNOWN, for NVMLGPU.Error and
// NVMLState.CountError.
const NVMLErrorUnknown = 999

// NVMLErrorNoPermission is NVML_ERROR_NO_PERMISSION, for NVMLGPU.GIError.
const NVMLErrorNoPermission = 4

// NVMLViolations returns what the simulated NVML recorded as misuse by its
// callers, one line each: an nvmlShutdown while an event wait runs, an
// event set waited on or freed after the shutdown. The real library does
// not survive these (it frees what the wait uses).
func (n *Node) NVMLViolations() ([]string, error) {
	data, err := os.ReadFile(n.HostPath(NVMLStatePath) + ".violations")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil || len(data) == 0 {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n"), nil
}

// MIGUUIDFor returns the deterministic UUID of a MIG device.
func MIGUUIDFor(gpuUUID string, gi, ci int) string {
	u := UUIDFor(fmt.Sprintf("%s/gi%d/ci%d", gpuUUID, gi, ci))
	return "MIG-" + u[len("GPU-"):]
}

// WriteNVMLState writes the simulated NVML's state for the node's GPUs
// (n.GPUs[i] gets st.GPUs[i]; missing entries have MIG disabled). It is
// replaced atomically, so a library reading it sees the old or the new
// state.
func (n *Node) WriteNVMLState(st NVMLState) error {
	var b strings.Builder
	b.WriteString("# simulated NVML state, written by github.com/nri-gpu/nri-gpu/test/simnode\n")
	for i, g := range n.GPUs {
		var ng NVMLGPU
		if i < len(st.GPUs) {
			ng = st.GPUs[i]
		}
		mem := ng.MemoryMiB
		if mem == 0 {
			mem = 81559
		}
		code := ng.Error
		if ng.Lost {
			code = nvmlErrorGPUIsLost
		}
		fmt.Fprintf(&b, "gpu %d %s 0000%s %d %d %d %s\n", g.Index, g.UUID, strings.ToUpper(g.BusID), mem, ng.MIGMode, code, g.Model)
		fmt.Fprintf(&b, "minor %d %d\n", g.Index, g.Minor)
		b.WriteString(propsLines(g, ng))
		for k, m := range ng.MIG {
			uuid := m.UUID
			if uuid == "" {
				uuid = MIGUUIDFor(g.UUID, m.GI, m.CI)
			}
			fmt.Fprintf(&b, "mig %d %d %d %d %d %d %s\n", g.Index, m.GI, m.CI, m.GISlices, m.CISlices, m.MemoryMiB, uuid)
			b.WriteString(migPlacementLine(g, k, m))
		}
	}
	if st.CountError != 0 {
		fmt.Fprintf(&b, "fail count %d\n", st.CountError)
	}
	if st.InitDelay > 0 {
		fmt.Fprintf(&b, "init delay %d\n", st.InitDelay.Milliseconds())
	}
	for i, e := range st.Events {
		gi, ci := uint32(e.GI), uint32(e.CI)
		fmt.Fprintf(&b, "xid %d %d %d %d %d\n", i+1, e.GPU, e.XID, gi, ci)
	}
	p := n.HostPath(NVMLStatePath)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// Compute modes as NVML numbers them (nvmlComputeMode_t).
const (
	ComputeModeDefault          = 0
	ComputeModeProhibited       = 2
	ComputeModeExclusiveProcess = 3
)

// ComputeModes returns the compute mode of each GPU of the node that a
// set made other than DEFAULT, by UUID, as the simulated NVML recorded
// it.
func (n *Node) ComputeModes() (map[string]int, error) {
	data, err := os.ReadFile(filepath.Join(filepath.Dir(n.HostPath(NVMLStatePath)), ComputeModeFile))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]int{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		var uuid string
		var mode int
		if _, err := fmt.Sscanf(line, "%s %d", &uuid, &mode); err == nil && mode != ComputeModeDefault {
			out[uuid] = mode
		}
	}
	return out, nil
}
