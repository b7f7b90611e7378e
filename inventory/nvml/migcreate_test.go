package nvml_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/inventory/nvml"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// publishedPlacements are nvidia-smi mig -lgipp's answers as NVIDIA's MIG
// user guide (docs.nvidia.com/datacenter/tesla/mig-user-guide, "Supported
// MIG Profiles" and the -lgipp example) gives them for the A100 40GB and
// the H100 80GB: per GPU instance profile id, the first memory slice of
// each placement and their size. The two GPUs share the shape (8 memory
// slices, 7 compute slices); their profile names differ.
const publishedPlacements = `
Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
Profile ID 20 Placements: {0,1,2,3,4,5,6}:1
Profile ID 15 Placements: {0,2,4,6}:2
Profile ID 14 Placements: {0,2,4}:2
Profile ID  9 Placements: {0,4}:4
Profile ID  5 Placement : {0}:4
Profile ID  0 Placement : {0}:8
`

// publishedNames are the profile names of those ids on each GPU (the
// guide's tables of profiles).
var publishedNames = map[string]map[int]string{
	simnode.DefaultModel: {19: "1g.10gb", 20: "1g.10gb+me", 15: "1g.20gb", 14: "2g.20gb", 9: "3g.40gb", 5: "4g.40gb", 0: "7g.80gb"},
	simnode.A100Model:    {19: "1g.5gb", 20: "1g.5gb+me", 15: "1g.10gb", 14: "2g.10gb", 9: "3g.20gb", 5: "4g.20gb", 0: "7g.40gb"},
}

// parsePlacements reads publishedPlacements.
func parsePlacements(t *testing.T) map[int][]nvml.Range {
	t.Helper()
	re := regexp.MustCompile(`Profile ID +(\d+) Placements? *: \{([\d,]+)\}:(\d+)`)
	out := map[int][]nvml.Range{}
	for _, m := range re.FindAllStringSubmatch(publishedPlacements, -1) {
		id, _ := strconv.Atoi(m[1])
		size, _ := strconv.Atoi(m[3])
		for _, s := range strings.Split(m[2], ",") {
			start, _ := strconv.Atoi(s)
			out[id] = append(out[id], nvml.Range{Start: start, Size: size})
		}
	}
	if len(out) != 7 {
		t.Fatalf("parsed %d profiles of the published table, want 7", len(out))
	}
	return out
}

// dynamicNode is a simulated node of one GPU of model in MIG mode with no
// MIG device, its NVML opened as a MIGMaker.
func dynamicNode(t *testing.T, model string) (*simnode.Node, nvml.Lib, nvml.MIGMaker) {
	t.Helper()
	n, err := simnode.Generate(t.TempDir(), simnode.Options{GPUs: []simnode.GPU{{BusID: "0000:1b:00.0", Model: model}}})
	if err != nil {
		t.Fatal(err)
	}
	mem := uint64(81559)
	if model == simnode.A100Model {
		mem = 40960
	}
	if err := n.WriteNVMLState(simnode.NVMLState{GPUs: []simnode.NVMLGPU{{MIGMode: 1, MemoryMiB: mem}}}); err != nil {
		t.Fatal(err)
	}
	lib, err := nvml.Open(filepath.Join(n.Root, n.LibDir, "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Close() })
	mk, ok := lib.(nvml.MIGMaker)
	if !ok {
		t.Fatal("the Lib of Open is no MIGMaker")
	}
	return n, lib, mk
}

// TestPlacementsArePublished compares the GPU instance profiles and
// placements the simulated NVML reports through the binding with NVIDIA's
// published tables, for the H100 80GB and the A100 40GB.
func TestPlacementsArePublished(t *testing.T) {
	want := parsePlacements(t)
	for _, model := range []string{simnode.DefaultModel, simnode.A100Model} {
		t.Run(model, func(t *testing.T) {
			n, _, mk := dynamicNode(t, model)
			profiles, err := mk.Profiles(n.GPUs[0].UUID)
			if err != nil {
				t.Fatal(err)
			}
			got := map[int][]nvml.Range{}
			names := map[int]string{}
			for _, p := range profiles {
				got[p.ID] = p.Placements
				names[p.ID] = p.Name
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("placements differ from NVIDIA's table (-published +simulated):\n%s", d)
			}
			if d := cmp.Diff(publishedNames[model], names); d != "" {
				t.Errorf("profile names differ (-published +simulated):\n%s", d)
			}
		})
	}
}

// TestCreateAndDestroyMIG makes MIG devices on demand through the binding
// and checks the driver's rules: a placement overlapping one taken fails,
// a placement no profile has fails, the compute slices run out at 7; a
// created device is a MIG device NVML enumerates with its profile and
// placement, with the capability files nvidia-modprobe reads; destroying
// it leaves nothing.
func TestCreateAndDestroyMIG(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: NVML creates GPU instances for root only, as the real library")
	}
	n, lib, mk := dynamicNode(t, simnode.DefaultModel)
	gpu := n.GPUs[0]
	a, err := mk.CreateMIG(gpu.UUID, 9, nvml.Range{Start: 4, Size: 4}) // 3g.40gb on slices 4-7
	if err != nil {
		t.Fatal(err)
	}
	b, err := mk.CreateMIG(gpu.UUID, 19, nvml.Range{Start: 0, Size: 1}) // 1g.10gb on slice 0
	if err != nil {
		t.Fatal(err)
	}
	if a.GI != 2 || a.CI != 0 || b.GI != 7 || b.CI != 0 || !strings.HasPrefix(a.UUID, "MIG-") || a.UUID == b.UUID {
		t.Errorf("created %+v and %+v", a, b)
	}
	for _, c := range []struct {
		what  string
		id    int
		place nvml.Range
		code  nvml.Return
	}{
		{"4g.40gb over the 1g.10gb", 5, nvml.Range{Start: 0, Size: 4}, nvml.ErrInsufficientResources},
		{"2g.20gb over the 3g.40gb", 14, nvml.Range{Start: 4, Size: 2}, nvml.ErrInsufficientResources},
		{"1g.10gb on slice 7, no placement", 19, nvml.Range{Start: 7, Size: 1}, nvml.ErrInvalidArg},
		{"1g.10gb of the wrong size", 19, nvml.Range{Start: 1, Size: 2}, nvml.ErrInvalidArg},
		{"an unknown profile", 99, nvml.Range{Start: 1, Size: 1}, nvml.ErrInvalidArg},
	} {
		if _, err := mk.CreateMIG(gpu.UUID, c.id, c.place); !nvml.IsCode(err, c.code) {
			t.Errorf("%s: %v, want NVML error %d", c.what, err, c.code)
		}
	}
	// 1g.10gb+me is one per GPU (its instance count), wherever placed.
	if _, err := mk.CreateMIG(gpu.UUID, 20, nvml.Range{Start: 1, Size: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := mk.CreateMIG(gpu.UUID, 20, nvml.Range{Start: 2, Size: 1}); !nvml.IsCode(err, nvml.ErrInsufficientResources) {
		t.Errorf("a second 1g.10gb+me: %v", err)
	}
	if _, err := mk.CreateMIG(gpu.UUID, 19, nvml.Range{Start: 2, Size: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := mk.CreateMIG(gpu.UUID, 15, nvml.Range{Start: 2, Size: 2}); !nvml.IsCode(err, nvml.ErrInsufficientResources) {
		t.Errorf("1g.20gb over slice 2: %v", err)
	}
	last, err := mk.CreateMIG(gpu.UUID, 19, nvml.Range{Start: 3, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range gpus[0].MIG {
		got = append(got, fmt.Sprintf("%s gi%d ci%d %+v %s", m.Profile, m.GI, m.CI, *m.Placement, m.UUID))
	}
	want := []string{
		fmt.Sprintf("3g.40gb gi2 ci0 {ProfileID:9 Start:4 Size:4} %s", a.UUID),
		fmt.Sprintf("1g.10gb gi7 ci0 {ProfileID:19 Start:0 Size:1} %s", b.UUID),
	}
	if len(got) != 5 || !cmp.Equal(got[:2], want) {
		t.Errorf("NVML enumerates:\n%s\nwant first:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	caps := filepath.Join(n.Root, "proc/driver/nvidia/capabilities", fmt.Sprintf("gpu%d", gpu.Minor), "mig")
	access, err := os.ReadFile(filepath.Join(caps, "gi2", "ci0", "access"))
	if err != nil || !strings.Contains(string(access), fmt.Sprintf("DeviceFileMinor: %d\n", simnode.CIMinor(gpu.Minor, 2, 0))) {
		t.Errorf("the compute instance's capability file: %q, %v", access, err)
	}
	insts, err := mk.Instances(gpu.UUID)
	if err != nil || len(insts) != 5 {
		t.Fatalf("Instances: %v, %v", insts, err)
	}
	for _, in := range []nvml.Instance{a, b, last} {
		if err := mk.DestroyMIG(gpu.UUID, in.GI, in.CI); err != nil {
			t.Fatal(err)
		}
	}
	if err := mk.DestroyMIG(gpu.UUID, a.GI, a.CI); err != nil {
		t.Errorf("destroying what is gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(caps, "gi2")); !os.IsNotExist(err) {
		t.Errorf("gi2's capability files are left: %v", err)
	}
	if insts, err = mk.Instances(gpu.UUID); err != nil || len(insts) != 2 {
		t.Errorf("after destroying three of five: %v, %v", insts, err)
	}
	// Now 4g.40gb fits on slices 0-3? No: slices 1 and 2 are taken.
	if _, err := mk.CreateMIG(gpu.UUID, 5, nvml.Range{Start: 0, Size: 4}); !nvml.IsCode(err, nvml.ErrInsufficientResources) {
		t.Errorf("4g.40gb over slices 1 and 2: %v", err)
	}
}

// TestGPUInstanceAloneIsListed: a GPU instance without its compute
// instance (a process that died between the two creations) is listed,
// so that it can be found and destroyed.
func TestGPUInstanceAloneIsListed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: NVML creates GPU instances for root only, as the real library")
	}
	n, _, mk := dynamicNode(t, simnode.A100Model)
	gpu := n.GPUs[0]
	// What the simulated driver keeps after such a crash: the GPU
	// instance's line alone (nvml_migcreate.c's format).
	line := fmt.Sprintf("dgi %s 1 2 0\n", gpu.UUID) // 3g.20gb, placement 0
	if err := os.WriteFile(filepath.Join(filepath.Dir(n.HostPath(simnode.NVMLStatePath)), simnode.MIGInstancesFile), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	insts, err := mk.Instances(gpu.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]nvml.Instance{{GI: 1, CI: -1, ProfileID: 9, Placement: nvml.Range{Start: 0, Size: 4}}}, insts); d != "" {
		t.Fatalf("Instances (-want +got):\n%s", d)
	}
	if _, err := mk.CreateMIG(gpu.UUID, 14, nvml.Range{Start: 2, Size: 2}); !nvml.IsCode(err, nvml.ErrInsufficientResources) {
		t.Errorf("2g.10gb over the lone GPU instance: %v", err)
	}
	if err := mk.DestroyMIG(gpu.UUID, 1, -1); err != nil {
		t.Fatal(err)
	}
	if insts, err := mk.Instances(gpu.UUID); err != nil || len(insts) != 0 {
		t.Errorf("after destroying: %v, %v", insts, err)
	}
}

// TestCreateMIGNeedsSysAdmin: as NVIDIA's driver (os_is_administrator:
// capable(CAP_SYS_ADMIN)), a caller without CAP_SYS_ADMIN in its
// effective set gets NVML_ERROR_NO_PERMISSION, whatever its uid; with
// it, the same call succeeds. What the DaemonSet's dra.dynamicMIG switch
// grants rests on this.
func TestCreateMIGNeedsSysAdmin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: NVML creates GPU instances for root only, as the real library")
	}
	n, _, mk := dynamicNode(t, simnode.DefaultModel)
	gpu := n.GPUs[0]
	// Capabilities are a thread's: drop CAP_SYS_ADMIN from this
	// thread's effective set only, and raise it again after.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		t.Fatal(err)
	}
	saved := caps
	caps[0].Effective &^= 1 << unix.CAP_SYS_ADMIN
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		t.Fatal(err)
	}
	_, err := mk.CreateMIG(gpu.UUID, 19, nvml.Range{Start: 0, Size: 1})
	if err := unix.Capset(&hdr, &saved[0]); err != nil {
		t.Fatal(err)
	}
	if !nvml.IsCode(err, nvml.ErrNoPermission) {
		t.Fatalf("CreateMIG as uid 0 without CAP_SYS_ADMIN: %v, want NVML's NO_PERMISSION", err)
	}
	in, err := mk.CreateMIG(gpu.UUID, 19, nvml.Range{Start: 0, Size: 1})
	if err != nil {
		t.Fatalf("CreateMIG with CAP_SYS_ADMIN: %v", err)
	}
	if err := mk.DestroyMIG(gpu.UUID, in.GI, in.CI); err != nil {
		t.Fatal(err)
	}
}

// TestSetMIGMode: MIG mode follows nvmlDeviceSetMigMode's rules through
// the binding: off is refused while a MIG device exists (IN_USE), taken
// once it is gone (a GPU out of MIG mode lists no instance and makes no
// MIG device: NOT_SUPPORTED), on again lets one be made; every process
// sees the mode (a second library handle, as nri-gpu's discovery). On an
// A100 the change waits for a GPU reset: an error, the mode as it was.
func TestSetMIGMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: NVML switches MIG mode for root only, as the real library")
	}
	n, _, mk := dynamicNode(t, simnode.DefaultModel)
	gpu := n.GPUs[0].UUID
	in, err := mk.CreateMIG(gpu, 19, nvml.Range{Start: 0, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := mk.SetMIGMode(gpu, false); !nvml.IsCode(err, nvml.ErrInUse) {
		t.Fatalf("MIG mode off with a MIG device: %v, want IN_USE", err)
	}
	if err := mk.DestroyMIG(gpu, in.GI, in.CI); err != nil {
		t.Fatal(err)
	}
	if err := mk.SetMIGMode(gpu, false); err != nil {
		t.Fatalf("MIG mode off without MIG devices: %v", err)
	}
	other, err := nvml.Open(filepath.Join(n.Root, n.LibDir, "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close() }()
	gpus, err := other.Devices()
	if err != nil || len(gpus) != 1 || gpus[0].MIGEnabled {
		t.Fatalf("another handle sees %+v, %v; want the GPU out of MIG mode", gpus, err)
	}
	if insts, err := mk.Instances(gpu); err != nil || len(insts) != 0 {
		t.Errorf("instances out of MIG mode: %v, %v; want none", insts, err)
	}
	if _, err := mk.CreateMIG(gpu, 19, nvml.Range{Start: 0, Size: 1}); !nvml.IsCode(err, nvml.ErrNotSupported) {
		t.Errorf("a MIG device out of MIG mode: %v, want NOT_SUPPORTED", err)
	}
	if err := mk.SetMIGMode(gpu, false); err != nil {
		t.Errorf("off again: %v, want nothing to do", err)
	}
	if err := mk.SetMIGMode(gpu, true); err != nil {
		t.Fatalf("MIG mode on: %v", err)
	}
	in, err = mk.CreateMIG(gpu, 19, nvml.Range{Start: 0, Size: 1})
	if err != nil {
		t.Fatalf("a MIG device once MIG mode is on again: %v", err)
	}
	if err := mk.DestroyMIG(gpu, in.GI, in.CI); err != nil {
		t.Fatal(err)
	}
	// An operator's layout (simnode's SetMIG) sets the mode over NVML's.
	if err := mk.SetMIGMode(gpu, false); err != nil {
		t.Fatal(err)
	}
	if err := n.SetMIG(simnode.NVMLState{GPUs: []simnode.NVMLGPU{{MIGMode: 1, MemoryMiB: 81559}}}); err != nil {
		t.Fatal(err)
	}
	if gpus, err := other.Devices(); err != nil || len(gpus) != 1 || !gpus[0].MIGEnabled {
		t.Errorf("after an operator's layout in MIG mode: %+v, %v", gpus, err)
	}

	a, alib, amk := dynamicNode(t, simnode.A100Model)
	if err := amk.SetMIGMode(a.GPUs[0].UUID, false); !nvml.IsCode(err, nvml.ErrResetRequired) {
		t.Errorf("an A100's MIG mode off: %v, want RESET_REQUIRED", err)
	}
	if gpus, err := alib.Devices(); err != nil || len(gpus) != 1 || !gpus[0].MIGEnabled {
		t.Errorf("the A100 after: %+v, %v; want it in MIG mode still", gpus, err)
	}
}
