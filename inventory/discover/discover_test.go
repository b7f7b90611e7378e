package discover_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// generate lays out a node without device nodes (empty regular files at
// /dev/nvidia*): discovery finds the driver's version and files but no
// usable GPU, and the test needs no root.
func generate(t *testing.T, opts simnode.Options) *simnode.Node {
	t.Helper()
	n, err := simnode.Generate(t.TempDir(), opts)
	if err != nil {
		t.Fatalf("simnode.Generate: %v", err)
	}
	return n
}

// generateWithNodes lays out a node with real /dev/nvidia* character
// devices, for a test of the GPUs and control nodes discovery finds there;
// it skips where this process cannot mknod (not root). CI runs as root.
func generateWithNodes(t *testing.T, opts simnode.Options) *simnode.Node {
	t.Helper()
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: checks the GPUs found through /dev/nvidia* character devices, made with mknod: %v", err)
	}
	opts.DeviceNodes = true
	return generate(t, opts)
}

// nodeArches are the CPU architectures of the simulated nodes the
// discovery tests run on: x86-64, and arm64 as Grace nodes are (GH200,
// GB200: aarch64 libraries in /usr/lib/aarch64-linux-gnu or /usr/lib64,
// ld.so.cache entries tagged AArch64).
var nodeArches = []string{"amd64", "arm64"}

// needArch skips a test on a node of arch when this machine cannot build
// one (simnode.CanBuild: a cross gcc, an aarch64 ldconfig, qemu-user);
// .ci/run installs what an arm64 node needs.
func needArch(t *testing.T, arch string) {
	t.Helper()
	if err := simnode.CanBuild(arch); err != nil {
		t.Skipf("needs a toolchain for %s nodes: %v", arch, err)
	}
}

func discoverAt(t *testing.T, root string) *inventory.Snapshot {
	t.Helper()
	s, err := discover.Discover(discover.Options{HostRoot: root, DriverRoot: root})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	return s
}

func TestDiscoverSimulatedNode(t *testing.T) {
	for _, arch := range nodeArches {
		for _, layout := range []simnode.Layout{simnode.LayoutRHEL, simnode.LayoutDebian} {
			t.Run(arch+"/"+string(layout), func(t *testing.T) {
				needArch(t, arch)
				testDiscoverSimulatedNode(t, simnode.Options{NumGPUs: 4, SwapMinors: true, Layout: layout, Arch: arch, UVMMajor: 244})
			})
		}
	}
}

// testDiscoverSimulatedNode discovers a node with device nodes laid out
// by opts: the driver, the GPUs, the control nodes and the driver's files.
func testDiscoverSimulatedNode(t *testing.T, opts simnode.Options) {
	n := generateWithNodes(t, opts)
	s := discoverAt(t, n.Root)
	if len(s.Warnings) > 0 {
		t.Errorf("unexpected warnings: %q", s.Warnings)
	}
	if s.DriverVersion != n.DriverVersion {
		t.Errorf("driver version %q, want %q", s.DriverVersion, n.DriverVersion)
	}
	if s.KernelRelease != simnode.DefaultKernelRelease {
		t.Errorf("kernel release %q, want %q", s.KernelRelease, simnode.DefaultKernelRelease)
	}
	if len(s.GPUs) != len(n.GPUs) {
		t.Fatalf("found %d GPUs, want %d", len(s.GPUs), len(n.GPUs))
	}
	differ := false
	for i, g := range s.GPUs {
		w := n.GPUs[i]
		if g.Index != w.Index || g.Minor != w.Minor || g.UUID != w.UUID || g.BusID != w.BusID || g.Model != w.Model {
			t.Errorf("GPU %d = %+v, want %+v", i, g, w)
		}
		if g.Node.Major != 195 || g.Node.Minor != int64(w.Minor) || g.Node.Path != "/dev/nvidia"+itoa(w.Minor) || g.Node.Mode != 0o666 {
			t.Errorf("GPU %d node = %+v", i, g.Node)
		}
		differ = differ || g.Index != g.Minor
	}
	if !differ {
		t.Error("the simulated node should have index != minor for some GPU")
	}
	c := s.Control
	if c.Ctl == nil || c.Ctl.Minor != 255 || c.UVM == nil || c.UVM.Major != 244 || c.UVMTools == nil || c.UVMTools.Minor != 1 || c.Modeset == nil {
		t.Errorf("control nodes = %+v", c)
	}
	checkDriverFiles(t, n, s)
}

// TestDiscoverDriverFiles checks the driver's files on a node without
// device nodes (no root needed): the driver is found all the same, only
// the GPUs are not.
func TestDiscoverDriverFiles(t *testing.T) {
	for _, arch := range nodeArches {
		for _, layout := range []simnode.Layout{simnode.LayoutRHEL, simnode.LayoutDebian} {
			t.Run(arch+"/"+string(layout), func(t *testing.T) {
				needArch(t, arch)
				testDiscoverDriverFiles(t, simnode.Options{NumGPUs: 4, SwapMinors: true, Layout: layout, Arch: arch, UVMMajor: 244})
			})
		}
	}
}

// testDiscoverDriverFiles discovers a node without device nodes laid out
// by opts.
func testDiscoverDriverFiles(t *testing.T, opts simnode.Options) {
	n := generate(t, opts)
	s := discoverAt(t, n.Root)
	if s.DriverVersion != n.DriverVersion {
		t.Errorf("driver version %q, want %q", s.DriverVersion, n.DriverVersion)
	}
	// The only warnings are about the device nodes that are not.
	if len(s.Warnings) == 0 || slices.ContainsFunc(s.Warnings, func(w string) bool { return !strings.Contains(w, "/dev/nvidiactl") }) {
		t.Errorf("warnings %q, want only that /dev/nvidiactl is no device", s.Warnings)
	}
	if len(s.GPUs) != 0 {
		t.Errorf("GPUs %+v without device nodes", s.GPUs)
	}
	checkDriverFiles(t, n, s)
}

// checkDriverFiles checks that every file the generator laid out is found,
// with its SONAME and capability, at its path under the driver root, and
// the firmware directory.
func checkDriverFiles(t *testing.T, n *simnode.Node, s *inventory.Snapshot) {
	t.Helper()
	type file struct{ Path, Name, Cap string }
	var want, got []file
	for _, f := range n.Files {
		name := f.SONAME
		if name == "" {
			name = filepath.Base(f.Path)
		}
		if f.Capability == "firmware" {
			continue
		}
		if f.Container != nil {
			for _, c := range f.Container {
				want = append(want, file{filepath.Join(n.Root, f.Path), c, f.Capability})
			}
			continue
		}
		want = append(want, file{filepath.Join(n.Root, f.Path), name, f.Capability})
	}
	var firmware []string
	for _, f := range s.Files {
		if f.Kind == inventory.FirmwareDir {
			firmware = append(firmware, f.HostPath)
			continue
		}
		got = append(got, file{f.HostPath, f.Name, f.Capability.String()})
	}
	less := func(a, b file) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	}
	slices.SortFunc(want, less)
	slices.SortFunc(got, less)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("driver files (-want +got):\n%s", diff)
	}
	if len(firmware) != 1 || !strings.HasSuffix(firmware[0], "/firmware/nvidia/"+n.DriverVersion) {
		t.Errorf("firmware dirs = %q", firmware)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestDiscoverKernelRelease checks that an unreadable kernel release is
// said, not guessed: the snapshot leaves it empty with a warning.
func TestDiscoverKernelRelease(t *testing.T) {
	n := generateWithNodes(t, simnode.Options{NumGPUs: 1, KernelRelease: "-"})
	s := discoverAt(t, n.Root)
	if s.KernelRelease != "" {
		t.Errorf("kernel release %q, want none", s.KernelRelease)
	}
	if len(s.Warnings) != 1 || !strings.Contains(s.Warnings[0], "reading the kernel release") {
		t.Errorf("warnings %q, want one about the kernel release", s.Warnings)
	}
	if len(s.GPUs) != 1 || !s.HasFirmware() {
		t.Errorf("the rest of discovery must not depend on it: %d GPUs, firmware %v", len(s.GPUs), s.HasFirmware())
	}
}

// TestDiscoverDriverRootMount checks that files are read where this process
// sees the driver root but reported as the runtime sees them.
func TestDiscoverDriverRootMount(t *testing.T) {
	n := generate(t, simnode.Options{NumGPUs: 1})
	s, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: "/run/nvidia/driver", DriverRootMount: n.Root})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Files) == 0 {
		t.Fatal("no files found")
	}
	for _, f := range s.Files {
		if !strings.HasPrefix(f.HostPath, "/run/nvidia/driver/") {
			t.Errorf("%s is not under the runtime's driver root", f.HostPath)
		}
	}
}

func TestDiscoverEmptyNodes(t *testing.T) {
	t.Run("no driver at all", func(t *testing.T) {
		s := discoverAt(t, t.TempDir())
		if !s.Empty() || s.DriverVersion != "" || len(s.Files) != 0 {
			t.Errorf("want an empty snapshot, got %+v", s)
		}
		if len(s.Warnings) == 0 || !strings.Contains(s.Warnings[0], "no NVIDIA kernel driver loaded") {
			t.Errorf("warnings = %q", s.Warnings)
		}
	})
	t.Run("kernel driver without user-space files", func(t *testing.T) {
		n := generateWithNodes(t, simnode.Options{NumGPUs: 2, NoDriver: true})
		s := discoverAt(t, n.Root)
		if len(s.GPUs) != 2 || len(s.Files) != 0 {
			t.Errorf("got %d GPUs and %d files, want 2 and 0", len(s.GPUs), len(s.Files))
		}
		if !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, "no driver library found") }) {
			t.Errorf("warnings = %q", s.Warnings)
		}
	})
	t.Run("no GPU", func(t *testing.T) {
		n := generateWithNodes(t, simnode.Options{NumGPUs: 1})
		if err := os.RemoveAll(filepath.Join(n.Root, "proc/driver/nvidia/gpus", n.GPUs[0].BusID)); err != nil {
			t.Fatal(err)
		}
		s := discoverAt(t, n.Root)
		if !s.Empty() || !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, "lists no GPU") }) {
			t.Errorf("GPUs %v, warnings %q", s.GPUs, s.Warnings)
		}
	})
}

// TestDiscoverBrokenGPUs checks that a broken, excluded or node-less GPU
// is left out with a warning, and the others keep their indexes.
func TestDiscoverBrokenGPUs(t *testing.T) {
	n := generateWithNodes(t, simnode.Options{NumGPUs: 4})
	info := func(i int) string {
		return filepath.Join(n.Root, "proc/driver/nvidia/gpus", n.GPUs[i].BusID, "information")
	}
	// GPU 0: excluded by the driver (NVML does not count it: indexes shift).
	data, err := os.ReadFile(info(0))
	if err != nil {
		t.Fatal(err)
	}
	excluded := strings.Replace(string(data), "GPU Excluded:\t No", "GPU Excluded:\t Yes", 1)
	if excluded == string(data) {
		excluded = replaceField(string(data), "GPU Excluded", "Yes")
	}
	mustWrite(t, info(0), excluded)
	// GPU 1: unreadable information file.
	mustWrite(t, info(1), "Model: garbage\n")
	// GPU 2: device node missing.
	if err := os.Remove(filepath.Join(n.Root, "dev", "nvidia"+itoa(n.GPUs[2].Minor))); err != nil {
		t.Fatal(err)
	}

	s := discoverAt(t, n.Root)
	if len(s.GPUs) != 1 {
		t.Fatalf("got GPUs %+v, want only the last one", s.GPUs)
	}
	if g := s.GPUs[0]; g.UUID != n.GPUs[3].UUID || g.Index != 2 {
		t.Errorf("remaining GPU = index %d %s, want index 2 (after the excluded one) %s", g.Index, g.UUID, n.GPUs[3].UUID)
	}
	for _, want := range []string{"is excluded by the driver", "(index 0): unusable: no Device Minor", "(index 1): device node /dev/nvidia"} {
		if !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, want) }) {
			t.Errorf("no warning containing %q in %q", want, s.Warnings)
		}
	}
}

func replaceField(info, key, val string) string {
	var out []string
	for _, l := range strings.Split(info, "\n") {
		if k, _, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == key {
			l = key + ":\t " + val
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

func mustWrite(t *testing.T, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDiscoverHostileDriverRoot checks that symbolic links leaving the
// driver root, or pointing at files that are not the driver's libraries,
// yield no file and a warning.
func TestDiscoverHostileDriverRoot(t *testing.T) {
	n := generate(t, simnode.Options{NumGPUs: 1})
	lib := filepath.Join(n.Root, n.LibDir)
	secret := filepath.Join(t.TempDir(), "shadow")
	mustWrite(t, secret, "root:secret\n")

	// libcuda.so.1 and the real file point outside the root.
	for _, name := range []string{"libcuda.so.1", "libcuda.so", "libcuda.so." + n.DriverVersion} {
		os.Remove(filepath.Join(lib, name))
	}
	rel, _ := filepath.Rel(lib, secret)
	must(t, os.Symlink(rel, filepath.Join(lib, "libcuda.so.1")))
	// libnvidia-ml points at an absolute path: resolved inside the root,
	// where it is a file that is not a shared object.
	for _, name := range []string{"libnvidia-ml.so.1", "libnvidia-ml.so", "libnvidia-ml.so." + n.DriverVersion} {
		os.Remove(filepath.Join(lib, name))
	}
	mustWrite(t, filepath.Join(n.Root, "etc/shadow"), "root:secret\n")
	must(t, os.Symlink("/etc/shadow", filepath.Join(lib, "libnvidia-ml.so.1")))
	// A directory of binaries that links outside the root.
	must(t, os.Remove(filepath.Join(n.Root, "usr/bin/nvidia-smi")))
	must(t, os.Symlink("../../../../../../../../../../../../bin/true", filepath.Join(n.Root, "usr/bin/nvidia-smi")))

	s := discoverAt(t, n.Root)
	for _, f := range s.Files {
		if !strings.HasPrefix(f.HostPath, n.Root+"/") {
			t.Errorf("file outside the driver root: %+v", f)
		}
		if strings.HasPrefix(f.Name, "libcuda.so") || strings.HasPrefix(f.Name, "libnvidia-ml.so") || f.Name == "nvidia-smi" {
			t.Errorf("file that should have been refused: %+v", f)
		}
	}
	for _, want := range []string{"path escapes the root", "etc/shadow"} {
		if !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, want) }) {
			t.Errorf("no warning containing %q in %q", want, s.Warnings)
		}
	}
	// Other libraries are still there.
	if !slices.ContainsFunc(s.Files, func(f inventory.DriverFile) bool { return f.Name == "libnvidia-cfg.so.1" }) {
		t.Error("libnvidia-cfg.so.1 missing")
	}
}

// TestDiscoverWithoutLDCache checks the fallback to the usual directories.
func TestDiscoverWithoutLDCache(t *testing.T) {
	n := generate(t, simnode.Options{NumGPUs: 1, Layout: simnode.LayoutDebian})
	mustWrite(t, filepath.Join(n.Root, "etc/ld.so.cache"), "garbage")
	s := discoverAt(t, n.Root)
	if !slices.ContainsFunc(s.Files, func(f inventory.DriverFile) bool { return f.Name == "libcuda.so.1" }) {
		t.Errorf("libcuda.so.1 not found by directory search: %+v", s.Files)
	}
	if !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, "ld.so.cache") }) {
		t.Errorf("no warning about ld.so.cache in %q", s.Warnings)
	}
	// The node has no device nodes: that warning is the devices', the
	// ld.so.cache one is not (nri-gpu doctor sorts them by layer so).
	if !slices.ContainsFunc(s.DeviceWarnings, func(w string) bool { return strings.Contains(w, "/dev/nvidiactl is missing") }) ||
		slices.ContainsFunc(s.DeviceWarnings, func(w string) bool { return strings.Contains(w, "ld.so.cache") }) {
		t.Errorf("device warnings %q of warnings %q", s.DeviceWarnings, s.Warnings)
	}
}

// TestDiscoverVersionMismatch checks the warning for libraries that do not
// carry the kernel module's version.
func TestDiscoverVersionMismatch(t *testing.T) {
	n := generate(t, simnode.Options{NumGPUs: 1})
	mustWrite(t, filepath.Join(n.Root, "proc/driver/nvidia/version"),
		"NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.10.01  Release Build  (dvs-builder@U16)  Thu Nov 20 2025\n")
	s := discoverAt(t, n.Root)
	if s.DriverVersion != "590.10.01" {
		t.Fatalf("driver version %q", s.DriverVersion)
	}
	if !slices.ContainsFunc(s.Warnings, func(w string) bool {
		return strings.Contains(w, "does not carry the kernel module's version 590.10.01")
	}) {
		t.Errorf("no version warning in %q", s.Warnings)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestDiscoverNUMANode checks that each GPU's NUMA node is read from
// /sys/bus/pci/devices/<bus id>/numa_node, and is unknown (-1) where the
// file is missing, says -1 or is not a NUMA node (with a warning).
func TestDiscoverNUMANode(t *testing.T) {
	n := generateWithNodes(t, simnode.Options{GPUs: []simnode.GPU{
		{BusID: "0000:18:00.0", NUMANode: "0"},
		{BusID: "0000:38:00.0", NUMANode: "1"},
		{BusID: "0000:58:00.0", NUMANode: "-1"},
		{BusID: "0000:78:00.0"},
		{BusID: "0000:98:00.0", NUMANode: "lots"},
	}})
	s := discoverAt(t, n.Root)
	var got []int
	for _, g := range s.GPUs {
		got = append(got, g.NUMANode)
	}
	if want := []int{0, 1, -1, -1, -1}; !slices.Equal(got, want) {
		t.Errorf("NUMA nodes %v, want %v", got, want)
	}
	if !slices.ContainsFunc(s.Warnings, func(w string) bool {
		return strings.Contains(w, "0000:98:00.0") && strings.Contains(w, `"lots" is not a NUMA node`)
	}) {
		t.Errorf("warnings %q, want one naming GPU 0000:98:00.0 and its bad numa_node", s.Warnings)
	}
}

// TestParseNUMANode checks the sysfs numa_node grammar.
func TestParseNUMANode(t *testing.T) {
	for in, want := range map[string]int{"0\n": 0, "1": 1, "-1\n": -1, "1023\n": 1023} {
		if got, err := discover.ParseNUMANode([]byte(in)); err != nil || got != want {
			t.Errorf("ParseNUMANode(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-2", "1024", "x", "0x1", "1 2", strings.Repeat("9", 100)} {
		if got, err := discover.ParseNUMANode([]byte(in)); err == nil || got != -1 {
			t.Errorf("ParseNUMANode(%q) = %d, %v; want -1 and an error", in, got, err)
		}
	}
}
