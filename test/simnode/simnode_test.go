package simnode

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

const upgradeVersion = "590.48.01"

// exportedSymbols lists, per library, the symbols it must define besides
// nri_gpu_sim_driver_version.
var exportedSymbols = map[string][]string{
	"libcuda":      {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount"},
	"libnvidia-ml": {"nvmlInit_v2", "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount_v2"},
}

func TestGenerateLayouts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		layout Layout
		arch   string
		libDir string
		conf   []string
	}{
		{"", "amd64", "/usr/lib64", []string{"/usr/lib64"}},
		{LayoutRHEL, "amd64", "/usr/lib64", []string{"/usr/lib64"}},
		{LayoutDebian, "amd64", "/usr/lib/x86_64-linux-gnu", []string{"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"}},
		// A Grace node (GH200, GB200) as Ubuntu and RHEL lay it out.
		{LayoutRHEL, "arm64", "/usr/lib64", []string{"/usr/lib64"}},
		{LayoutDebian, "arm64", "/usr/lib/aarch64-linux-gnu", []string{"/usr/lib/aarch64-linux-gnu", "/lib/aarch64-linux-gnu"}},
	}
	for _, tt := range tests {
		t.Run("layout="+string(tt.layout)+",arch="+tt.arch, func(t *testing.T) {
			t.Parallel()
			needArch(t, tt.arch)
			n, err := Generate(t.TempDir(), Options{Layout: tt.layout, Arch: tt.arch})
			if err != nil {
				t.Fatal(err)
			}
			if n.LibDir != tt.libDir || n.Arch != tt.arch || n.DriverVersion != DefaultDriverVersion || n.UVMMajor != DefaultUVMMajor || len(n.GPUs) != DefaultNumGPUs {
				t.Fatalf("node = LibDir %q arch %q version %q uvm %d gpus %d", n.LibDir, n.Arch, n.DriverVersion, n.UVMMajor, len(n.GPUs))
			}
			checkDriverFiles(t, n)
			checkLibraries(t, n)
			checkLDCache(t, n)
			checkGPUInfo(t, n)
			checkKernelFiles(t, n)
			checkTools(t, n)
			if got := strings.Fields(readFile(t, n.HostPath("/etc/ld.so.conf"))); !equal(got[len(got)-len(tt.conf):], tt.conf) {
				t.Errorf("ld.so.conf lists %q, want %q at the end", got, tt.conf)
			}
		})
	}
}

// needArch skips a test of a node of another architecture than the
// test's when this machine cannot build one, saying why (CanBuild); CI
// installs what it needs.
func needArch(t *testing.T, arch string) {
	t.Helper()
	if err := CanBuild(arch); err != nil {
		a, _ := archOf("")
		if arch == a.name {
			t.Fatal(err)
		}
		t.Skipf("needs a toolchain for %s nodes: %v", arch, err)
	}
}

// toolchainOf is the toolchain of n's architecture.
func toolchainOf(t *testing.T, n *Node) *toolchain {
	t.Helper()
	a, err := archOf(n.Arch)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := toolchainFor(a)
	if err != nil {
		t.Fatal(err)
	}
	return tc
}

// testToolchain is the toolchain of the architecture the test runs on.
func testToolchain(t *testing.T) *toolchain {
	t.Helper()
	return toolchainOf(t, &Node{})
}

func TestGPUOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts Options
		want []GPU // Index, Minor, BusID, Excluded compared; UUID and Model when set
	}{
		{
			name: "default",
			opts: Options{},
			want: []GPU{
				{Index: 0, Minor: 0, BusID: "0000:1b:00.0"},
				{Index: 1, Minor: 1, BusID: "0000:38:00.0"},
				{Index: 2, Minor: 2, BusID: "0000:5c:00.0"},
				{Index: 3, Minor: 3, BusID: "0000:6b:00.0"},
			},
		},
		{
			name: "swap minors",
			opts: Options{NumGPUs: 3, SwapMinors: true},
			want: []GPU{
				{Index: 0, Minor: 2, BusID: "0000:1b:00.0"},
				{Index: 1, Minor: 1, BusID: "0000:38:00.0"},
				{Index: 2, Minor: 0, BusID: "0000:5c:00.0"},
			},
		},
		{
			name: "single",
			opts: Options{NumGPUs: 1},
			want: []GPU{{Index: 0, Minor: 0, BusID: "0000:1b:00.0"}},
		},
		{
			name: "explicit list is sorted by bus id",
			opts: Options{GPUs: []GPU{
				{BusID: "00000000:C3:00.0", Minor: 0, Model: "NVIDIA A100-SXM4-80GB"},
				{BusID: "0000:07:00.0", Minor: 5, UUID: "GPU-3E953D37-558D-FB20-8ECA-25DE8B98F5A7", Excluded: true},
			}},
			want: []GPU{
				{Index: 0, Minor: 5, BusID: "0000:07:00.0", UUID: "GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7", Model: DefaultModel, Excluded: true},
				{Index: 1, Minor: 0, BusID: "0000:c3:00.0", UUID: UUIDFor("0000:c3:00.0"), Model: "NVIDIA A100-SXM4-80GB"},
			},
		},
		{
			name: "explicit list without minors gets bus-order minors",
			opts: Options{GPUs: []GPU{{BusID: "0000:9d:00.0"}, {BusID: "0000:1b:00.0"}}, SwapMinors: true},
			want: []GPU{
				{Index: 0, Minor: 1, BusID: "0000:1b:00.0"},
				{Index: 1, Minor: 0, BusID: "0000:9d:00.0"},
			},
		},
		{
			name: "empty explicit list",
			opts: Options{GPUs: []GPU{}},
			want: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opts := tt.opts
			opts.NoDriver = true
			n, err := Generate(t.TempDir(), opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(n.GPUs) != len(tt.want) {
				t.Fatalf("got %d GPUs, want %d", len(n.GPUs), len(tt.want))
			}
			for i, w := range tt.want {
				g := n.GPUs[i]
				if w.UUID == "" {
					w.UUID = UUIDFor(w.BusID)
				}
				if w.Model == "" {
					w.Model = DefaultModel
				}
				if g != w {
					t.Errorf("GPU %d = %+v, want %+v", i, g, w)
				}
			}
			if len(n.Files) != 0 {
				t.Errorf("NoDriver laid out %d driver files", len(n.Files))
			}
			for _, p := range []string{"/etc/ld.so.cache", "/usr/bin/nvidia-smi", n.LibDir + "/libcuda.so.1", "/lib/firmware/nvidia"} {
				if _, err := os.Lstat(n.HostPath(p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("NoDriver: %s exists (err %v)", p, err)
				}
			}
			checkGPUInfo(t, n)
			checkKernelFiles(t, n)
		})
	}
}

func TestSwapMinorsDiffers(t *testing.T) {
	t.Parallel()
	for _, num := range []int{2, 4, 8, 9} {
		n, err := Generate(t.TempDir(), Options{NumGPUs: num, SwapMinors: true, NoDriver: true})
		if err != nil {
			t.Fatal(err)
		}
		differs := false
		for _, g := range n.GPUs {
			differs = differs || g.Index != g.Minor
		}
		if !differs {
			t.Errorf("NumGPUs %d: SwapMinors left every index equal to its minor", num)
		}
	}
}

func TestInvalidOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts Options
	}{
		{"bad version", Options{DriverVersion: `580"; system("x`}},
		{"bad layout", Options{Layout: "arch"}},
		{"bad bus id", Options{GPUs: []GPU{{BusID: "38:00.0"}}}},
		{"duplicate bus id", Options{GPUs: []GPU{{BusID: "0000:38:00.0"}, {BusID: "00000000:38:00.0"}}}},
		{"duplicate minor", Options{GPUs: []GPU{{BusID: "0000:38:00.0", Minor: 1}, {BusID: "0000:39:00.0", Minor: 1}}}},
		{"bad uuid", Options{GPUs: []GPU{{BusID: "0000:38:00.0", UUID: "MIG-1234"}}}},
		{"negative gpus", Options{NumGPUs: -1}},
		{"uvm major taken", Options{UVMMajor: 195}},
		{"uvm major of mem", Options{UVMMajor: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.opts.NoDriver = true
			if _, err := Generate(t.TempDir(), tt.opts); err == nil {
				t.Errorf("Generate(%+v) succeeded, want an error", tt.opts)
			}
		})
	}
}

func TestDeterministic(t *testing.T) {
	t.Parallel()
	a, err := Generate(t.TempDir(), Options{NumGPUs: 8, NoDriver: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Generate(t.TempDir(), Options{NumGPUs: 8, NoDriver: true})
	if err != nil {
		t.Fatal(err)
	}
	uuidRE := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for i := range a.GPUs {
		if a.GPUs[i] != b.GPUs[i] {
			t.Errorf("GPU %d differs between runs: %+v vs %+v", i, a.GPUs[i], b.GPUs[i])
		}
		u := a.GPUs[i].UUID
		if !uuidRE.MatchString(u) || seen[u] {
			t.Errorf("GPU %d: bad or duplicate UUID %q", i, u)
		}
		seen[u] = true
	}
	for _, f := range []string{"/proc/devices", "/proc/driver/nvidia/version", "/proc/driver/nvidia/gpus/0000:db:00.0/information"} {
		if readFile(t, a.HostPath(f)) != readFile(t, b.HostPath(f)) {
			t.Errorf("%s differs between runs", f)
		}
	}
}

func TestMakedev(t *testing.T) {
	t.Parallel()
	tests := []struct {
		major, minor uint32
		want         uint64
	}{
		{0, 0, 0},
		{1, 3, 0x103},
		{195, 0, 0xc300},
		{195, 255, 0xc3ff},
		{510, 1, 0x1fe01},
		{0xfff, 0xff, 0xfffff},
		{0x1000, 0, 0x100000000000},
		{0, 0x100, 0x100000},
		{0xffffffff, 0xffffffff, 0xffffffffffffffff},
		{0x12345, 0x6789a, 0x120006783459a}, // values checked against glibc makedev(3)
	}
	for _, tt := range tests {
		got := Makedev(tt.major, tt.minor)
		if got != tt.want {
			t.Errorf("Makedev(%#x, %#x) = %#x, want %#x", tt.major, tt.minor, got, tt.want)
		}
		if Major(got) != tt.major || Minor(got) != tt.minor {
			t.Errorf("Major/Minor(%#x) = %#x, %#x, want %#x, %#x", got, Major(got), Minor(got), tt.major, tt.minor)
		}
	}
}

func TestDeviceNodes(t *testing.T) {
	t.Parallel()
	if err := CanMknod(); err != nil {
		t.Skipf("needs root: DeviceNodes makes character devices with mknod: %v", err)
	}
	opts := Options{NumGPUs: 3, SwapMinors: true, UVMMajor: 244, DeviceNodes: true, NoDriver: true}
	n, err := Generate(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]uint32{
		"nvidiactl":        {195, 255},
		"nvidia-modeset":   {195, 254},
		"nvidia-uvm":       {244, 0},
		"nvidia-uvm-tools": {244, 1},
	}
	for _, g := range n.GPUs {
		want["nvidia"+strconv.Itoa(g.Minor)] = [2]uint32{195, uint32(g.Minor)}
	}
	for name, mm := range want {
		p := filepath.Join(n.Root, "dev", name)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&fs.ModeCharDevice == 0 || fi.Mode()&fs.ModeDevice == 0 {
			t.Errorf("%s: mode %v, want a character device", name, fi.Mode())
		}
		if fi.Mode().Perm() != 0o666 {
			t.Errorf("%s: permissions %v, want 0666", name, fi.Mode().Perm())
		}
		rdev := uint64(fi.Sys().(*syscall.Stat_t).Rdev)
		if Major(rdev) != mm[0] || Minor(rdev) != mm[1] {
			t.Errorf("%s: device %d:%d, want %d:%d", name, Major(rdev), Minor(rdev), mm[0], mm[1])
		}
	}
	if !strings.Contains(readFile(t, n.HostPath("/proc/devices")), "244 nvidia-uvm\n") {
		t.Error("/proc/devices does not list nvidia-uvm at 244")
	}
	// Generating again over existing nodes works.
	if _, err := Generate(n.Root, opts); err != nil {
		t.Fatalf("second Generate: %v", err)
	}
}

// TestNoDeviceNodes checks the node made without mknod: empty regular
// files, mode 0666, where the device nodes would be.
func TestNoDeviceNodes(t *testing.T) {
	t.Parallel()
	n, err := Generate(t.TempDir(), Options{NumGPUs: 2, NoDriver: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nvidia0", "nvidia1", "nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"} {
		fi, err := os.Lstat(filepath.Join(n.Root, "dev", name))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.Mode().IsRegular() || fi.Size() != 0 || fi.Mode().Perm() != 0o666 {
			t.Errorf("%s: %v, %d bytes; want an empty regular file, mode 0666", name, fi.Mode(), fi.Size())
		}
	}
}

// TestVendor checks both vendor nodes: with their own device nodes (root)
// and naming the host's; each records the nodes the spec names as they are.
func TestVendor(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, v *VendorNode, own bool) {
		t.Helper()
		spec := readFile(t, v.SpecPath)
		nodes := append([]VendorDevice{v.KFD}, v.Render...)
		if len(v.Render) != 2 || len(v.Devices) != 2 || v.KFD.Path != "/dev/kfd" {
			t.Fatalf("vendor node %+v", v)
		}
		for i, d := range nodes {
			if i > 0 && d.Path != "/dev/dri/renderD"+strconv.Itoa(RenderMinor+i-1) {
				t.Errorf("render node %d at %s", i-1, d.Path)
			}
			if own && (d.HostPath != filepath.Join(v.Root, d.Path) || (i == 0) != (d.Major == KFDMajor) || (i > 0 && d.Minor != int64(RenderMinor+i-1))) {
				t.Errorf("own node %+v", d)
			}
			if !own && !strings.HasPrefix(d.HostPath, "/dev/") {
				t.Errorf("host node %+v", d)
			}
			fi, err := os.Lstat(d.HostPath)
			if err != nil {
				t.Fatal(err)
			}
			rdev := uint64(fi.Sys().(*syscall.Stat_t).Rdev)
			if fi.Mode()&fs.ModeCharDevice == 0 || int64(Major(rdev)) != d.Major || int64(Minor(rdev)) != d.Minor || fi.Mode().Perm() != 0o666 {
				t.Errorf("%s: %v %d:%d, want a character device %d:%d, mode 0666", d.HostPath, fi.Mode(), Major(rdev), Minor(rdev), d.Major, d.Minor)
			}
			if !strings.Contains(spec, "hostPath: "+d.HostPath+"\n") {
				t.Errorf("the spec does not name %s:\n%s", d.HostPath, spec)
			}
		}
	}
	t.Run("host nodes", func(t *testing.T) {
		v, err := GenerateVendorHostNodes(t.TempDir(), 2)
		if err != nil {
			t.Fatal(err)
		}
		check(t, v, false)
		if _, err := GenerateVendorHostNodes(t.TempDir(), 5); err == nil {
			t.Error("5 GPUs on 4 host nodes")
		}
	})
	t.Run("own nodes", func(t *testing.T) {
		if err := CanMknod(); err != nil {
			t.Skipf("needs root: GenerateVendor makes character devices with mknod: %v", err)
		}
		v, err := GenerateVendor(t.TempDir(), 2)
		if err != nil {
			t.Fatal(err)
		}
		check(t, v, true)
	})
}

func TestUpgrade(t *testing.T) {
	t.Parallel()
	for _, layout := range []Layout{LayoutRHEL, LayoutDebian} {
		t.Run(string(layout), func(t *testing.T) {
			t.Parallel()
			old, err := Generate(t.TempDir(), Options{Layout: layout, NumGPUs: 2, SwapMinors: true})
			if err != nil {
				t.Fatal(err)
			}
			oldFiles := append([]File(nil), old.Files...)
			n, err := Upgrade(old, upgradeVersion, Options{CUDAVersion: 13010})
			if err != nil {
				t.Fatal(err)
			}
			if old.DriverVersion != DefaultDriverVersion || !equalFiles(old.Files, oldFiles) {
				t.Error("Upgrade modified the old Node")
			}
			if n.DriverVersion != upgradeVersion || n.Root != old.Root || n.LibDir != old.LibDir || len(n.Files) != len(old.Files) {
				t.Fatalf("upgraded node: %+v", n)
			}
			for i := range n.GPUs {
				if n.GPUs[i] != old.GPUs[i] {
					t.Errorf("GPU %d changed: %+v -> %+v", i, old.GPUs[i], n.GPUs[i])
				}
			}
			// No trace of the old version is left in any file name.
			err = filepath.WalkDir(n.Root, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if strings.Contains(d.Name(), DefaultDriverVersion) {
					t.Errorf("old version left behind: %s", p)
				}
				if d.Type()&fs.ModeSymlink != 0 {
					if _, err := os.Stat(p); err != nil {
						t.Errorf("dangling symlink %s: %v", p, err)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"/proc/driver/nvidia/version", "/sys/module/nvidia/version"} {
				if s := readFile(t, n.HostPath(f)); !strings.Contains(s, upgradeVersion) || strings.Contains(s, DefaultDriverVersion) {
					t.Errorf("%s = %q, want version %s only", f, s, upgradeVersion)
				}
			}
			checkDriverFiles(t, n)
			checkLibraries(t, n)
			checkLDCache(t, n)
			checkGPUInfo(t, n)
			checkKernelFiles(t, n)
			checkTools(t, n)
			if got := cudaProbe(t, n); !strings.Contains(got, "version 13010 ") {
				t.Errorf("libcuda after upgrade reports %q, want version 13010", got)
			}
		})
	}
}

func TestUpgradeErrors(t *testing.T) {
	t.Parallel()
	n, err := Generate(t.TempDir(), Options{NoDriver: true, NumGPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Upgrade(n, "not-a-version", Options{}); err == nil {
		t.Error("Upgrade to a bad version succeeded")
	}
	if _, err := Upgrade(n, upgradeVersion, Options{Layout: LayoutDebian}); err == nil {
		t.Error("Upgrade of an RHEL node with the Debian layout succeeded")
	}
	if _, err := Upgrade(nil, upgradeVersion, Options{}); err == nil {
		t.Error("Upgrade(nil) succeeded")
	}
	// A kernel-only upgrade only changes the version files.
	up, err := Upgrade(n, upgradeVersion, Options{NoDriver: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(up.Files) != 0 || !strings.Contains(readFile(t, up.HostPath("/sys/module/nvidia/version")), upgradeVersion) {
		t.Errorf("kernel-only upgrade: %+v", up)
	}
}

func TestLibcudaCountsDevices(t *testing.T) {
	t.Parallel()
	n, err := Generate(t.TempDir(), Options{NumGPUs: 3, CUDAVersion: 12080})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cudaProbe(t, n), "version 12080 count 3"; !strings.Contains(got, want) {
		t.Errorf("libcuda probe printed %q, want %q", got, want)
	}
}

func TestBuildCacheConcurrent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tc := testToolchain(t)
	job := elfJob{
		name:   "libcachetest.so.1",
		source: "int cache_test(void) { return 42; }\n",
		args:   []string{"-shared", "-fPIC", "-Wl,-soname,libcachetest.so.1"},
	}
	var wg sync.WaitGroup
	paths := make([]string, 8)
	errs := make([]error, 8)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i], errs[i] = buildELF(dir, tc, job)
		}()
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if paths[i] != paths[0] {
			t.Fatalf("concurrent builds returned %q and %q", paths[0], paths[i])
		}
	}
	fi, err := os.Stat(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	if got := soname(t, paths[0]); got != "libcachetest.so.1" {
		t.Errorf("cached object has SONAME %q", got)
	}
	again, err := buildELF(dir, tc, job)
	if err != nil {
		t.Fatal(err)
	}
	fi2, err := os.Stat(again)
	if err != nil {
		t.Fatal(err)
	}
	if again != paths[0] || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Error("second build did not come from the cache")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("cache holds %q, want only the object", names)
	}
	// A different soname is a different cache entry.
	other := job
	other.args = []string{"-shared", "-fPIC", "-Wl,-soname,libcachetest.so.2"}
	p2, err := buildELF(dir, tc, other)
	if err != nil {
		t.Fatal(err)
	}
	if p2 == paths[0] || soname(t, p2) != "libcachetest.so.2" {
		t.Errorf("changed flags reused %s", p2)
	}
}

// checkDriverFiles checks that n.Files lists exactly the expected driver
// files, that they exist as regular files, and that each carries the
// node's version.
func checkDriverFiles(t *testing.T, n *Node) {
	t.Helper()
	want := len(libraries) + len(binaries) + len(firmware) + len(vendorFiles(&config{}))
	if len(n.Files) != want {
		t.Errorf("%d driver files, want %d", len(n.Files), want)
	}
	caps := map[string]int{}
	for _, f := range n.Files {
		caps[f.Capability]++
		fi, err := os.Lstat(n.HostPath(f.Path))
		if err != nil {
			t.Errorf("%s: %v", f.Path, err)
			continue
		}
		if !fi.Mode().IsRegular() {
			t.Errorf("%s: mode %v, want a regular file", f.Path, fi.Mode())
		}
		switch f.Capability {
		case CapFirmware:
			if !strings.HasPrefix(f.Path, "/lib/firmware/nvidia/"+n.DriverVersion+"/gsp_") || fi.Size() < 1024 {
				t.Errorf("firmware %s: size %d", f.Path, fi.Size())
			}
		case CapUtility, CapCompute, CapVideo, CapGraphics, CapNGX, CapDisplay:
		default:
			t.Errorf("%s: unknown capability %q", f.Path, f.Capability)
		}
	}
	for c, min := range map[string]int{CapUtility: 6, CapCompute: 11, CapVideo: 4, CapGraphics: 25, CapNGX: 3, CapDisplay: 4, CapFirmware: 2} {
		if caps[c] != min {
			t.Errorf("%d %s files, want %d", caps[c], c, min)
		}
	}
}

// checkLibraries checks each library's name, SONAME, exported symbols and
// symlinks.
func checkLibraries(t *testing.T, n *Node) {
	t.Helper()
	libs := 0
	for _, f := range n.Files {
		if f.SONAME == "" {
			continue
		}
		libs++
		base := path.Base(f.Path)
		version := n.DriverVersion
		if strings.HasPrefix(base, "libnvidia-egl-") {
			// The EGL platform libraries carry their own versions.
			version = base[strings.Index(base, ".so.")+len(".so."):]
		}
		if path.Dir(f.Path) != n.LibDir || !strings.HasSuffix(base, ".so."+version) {
			t.Errorf("library %s not named lib<name>.so.%s in %s", f.Path, version, n.LibDir)
		}
		stem := strings.TrimSuffix(base, ".so."+version)
		if !strings.HasPrefix(f.SONAME, stem+".so.") {
			t.Errorf("%s: SONAME %q does not belong to it", f.Path, f.SONAME)
		}
		p := n.HostPath(f.Path)
		if got := soname(t, p); got != f.SONAME {
			t.Errorf("%s: DT_SONAME %q, want %q", f.Path, got, f.SONAME)
		}
		syms := definedSymbols(t, p)
		for _, s := range append([]string{"nri_gpu_sim_driver_version"}, exportedSymbols[stem]...) {
			if !syms[s] {
				t.Errorf("%s does not export %s", f.Path, s)
			}
		}
		if f.SONAME != base {
			if got, err := os.Readlink(n.HostPath(n.LibDir + "/" + f.SONAME)); err != nil || got != base {
				t.Errorf("%s -> %q (%v), want -> %s", f.SONAME, got, err, base)
			}
		}
		devLink := n.HostPath(n.LibDir + "/" + stem + ".so")
		got, err := os.Readlink(devLink)
		switch stem {
		case "libcuda", "libnvidia-ml":
			if err != nil || got != f.SONAME {
				t.Errorf("%s.so -> %q (%v), want -> %s", stem, got, err, f.SONAME)
			}
		default:
			if err == nil {
				t.Errorf("unexpected development link %s.so -> %s", stem, got)
			}
		}
	}
	if libs != len(libraries) {
		t.Errorf("%d libraries, want %d", libs, len(libraries))
	}
}

// checkLDCache checks, with the host's ldconfig -p, that the node's
// ld.so.cache maps every SONAME into LibDir and that the entry resolves to
// the library of the node's version.
func checkLDCache(t *testing.T, n *Node) {
	t.Helper()
	out, err := exec.Command(toolchainOf(t, n).ldconfig, "-p", "-C", n.HostPath("/etc/ld.so.cache")).CombinedOutput()
	if err != nil {
		t.Fatalf("ldconfig -p: %v\n%s", err, out)
	}
	entries := map[string]string{}
	line := regexp.MustCompile(`^\s+(\S+) \(([^)]*)\) => (\S+)$`)
	tag := map[string]string{"amd64": "x86-64", "arm64": "AArch64"}[n.Arch]
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			if !strings.Contains(m[2], tag) {
				t.Errorf("cache entry %q not tagged %s", sc.Text(), tag)
			}
			entries[m[1]] = m[3]
		}
	}
	for _, f := range n.Files {
		if f.SONAME == "" {
			continue
		}
		p, ok := entries[f.SONAME]
		if !ok {
			t.Errorf("ld.so.cache has no entry for %s:\n%s", f.SONAME, out)
			continue
		}
		if want := n.LibDir + "/" + f.SONAME; p != want {
			t.Errorf("ld.so.cache: %s => %s, want %s", f.SONAME, p, want)
		}
		real, err := filepath.EvalSymlinks(n.HostPath(p))
		if err != nil || filepath.Base(real) != path.Base(f.Path) {
			t.Errorf("ld.so.cache entry %s resolves to %q (%v), want %s", p, real, err, f.Path)
		}
	}
	for name, p := range entries {
		if _, err := os.Stat(n.HostPath(p)); err != nil {
			t.Errorf("ld.so.cache entry %s => %s does not resolve: %v", name, p, err)
		}
	}
}

// parseInfo parses a /proc/driver/nvidia/gpus/<bus>/information file the
// way discovery code does: split at the first colon, trim both sides.
func parseInfo(t *testing.T, s string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			t.Fatalf("information line without a colon: %q", l)
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m
}

// checkGPUInfo checks that the information files parse back to n.GPUs.
func checkGPUInfo(t *testing.T, n *Node) {
	t.Helper()
	dir := n.HostPath("/proc/driver/nvidia/gpus")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(n.GPUs) {
		t.Fatalf("%d GPU directories, want %d", len(entries), len(n.GPUs))
	}
	var buses []string
	for _, e := range entries {
		buses = append(buses, e.Name())
	}
	sort.Strings(buses)
	for i, g := range n.GPUs {
		if g.Index != i || buses[i] != g.BusID {
			t.Errorf("GPU %d (%s) has index %d; bus order gives %s", i, g.BusID, g.Index, buses[i])
		}
		info := parseInfo(t, readFile(t, filepath.Join(dir, g.BusID, "information")))
		excluded := "No"
		if g.Excluded {
			excluded = "Yes"
		}
		want := map[string]string{
			"Model":        g.Model,
			"GPU UUID":     g.UUID,
			"Bus Location": g.BusID,
			"Device Minor": strconv.Itoa(g.Minor),
			"GPU Excluded": excluded,
			"GPU Firmware": n.DriverVersion,
			"Bus Type":     "PCIe",
		}
		for k, v := range want {
			if info[k] != v {
				t.Errorf("%s: %s = %q, want %q", g.BusID, k, info[k], v)
			}
		}
		for _, k := range []string{"IRQ", "Video BIOS", "DMA Size", "DMA Mask"} {
			if info[k] == "" {
				t.Errorf("%s: no %s", g.BusID, k)
			}
		}
	}
}

// checkKernelFiles checks the version files, /proc/devices and the /dev
// entries.
func checkKernelFiles(t *testing.T, n *Node) {
	t.Helper()
	version := readFile(t, n.HostPath("/proc/driver/nvidia/version"))
	first, _, _ := strings.Cut(version, "\n")
	// The proprietary module's line on x86-64, the open module's (the only
	// one Grace runs) on aarch64.
	want := map[string]string{"amd64": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  ", "arm64": "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  "}[n.Arch]
	if !strings.HasPrefix(first, want+n.DriverVersion+"  Release Build") {
		t.Errorf("/proc/driver/nvidia/version first line %q, want %q", first, want+n.DriverVersion+"  Release Build ...")
	}
	if !strings.Contains(version, "\nGCC version:  gcc version ") {
		t.Errorf("/proc/driver/nvidia/version has no GCC line: %q", version)
	}
	if got := readFile(t, n.HostPath("/sys/module/nvidia/version")); strings.TrimSpace(got) != n.DriverVersion {
		t.Errorf("/sys/module/nvidia/version = %q", got)
	}
	devices := readFile(t, n.HostPath("/proc/devices"))
	char, block, ok := strings.Cut(devices, "\n\nBlock devices:\n")
	if !ok || !strings.HasPrefix(char, "Character devices:\n") || !strings.Contains(block, "259 blkext") {
		t.Fatalf("/proc/devices malformed:\n%s", devices)
	}
	majors := map[string]int{}
	last := 0
	for _, l := range strings.Split(strings.TrimPrefix(char, "Character devices:\n"), "\n") {
		f := strings.Fields(l)
		m, err := strconv.Atoi(f[0])
		if len(f) != 2 || err != nil || m < last {
			t.Fatalf("/proc/devices line %q", l)
		}
		last = m
		if _, dup := majors[f[1]]; dup && f[1] != "sd" {
			t.Errorf("/proc/devices lists %s twice", f[1])
		}
		majors[f[1]] = m
	}
	if majors["nvidia"] != 195 || majors["nvidia-uvm"] != n.UVMMajor || majors["nvidia-caps"] == 0 || majors["mem"] != 1 {
		t.Errorf("/proc/devices majors: %v", majors)
	}
	names := []string{"nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"}
	for _, g := range n.GPUs {
		names = append(names, "nvidia"+strconv.Itoa(g.Minor))
	}
	for _, name := range names {
		fi, err := os.Lstat(n.HostPath("/dev/" + name))
		if err != nil {
			t.Errorf("/dev/%s: %v", name, err)
			continue
		}
		if fi.Mode().Perm() != 0o666 {
			t.Errorf("/dev/%s: permissions %v", name, fi.Mode().Perm())
		}
	}
}

// checkTools runs the generated binaries against the node's libraries.
func checkTools(t *testing.T, n *Node) {
	t.Helper()
	smi := n.HostPath("/usr/bin/nvidia-smi")
	env := []string{"LD_LIBRARY_PATH=" + n.HostPath(n.LibDir), DevGPUEnv + "=" + n.HostPath("/dev")}
	out := run(t, smi, env)
	if want := "NVIDIA-SMI " + n.DriverVersion + " GPUs: " + strconv.Itoa(len(n.GPUs)) + "\n"; out != want {
		t.Errorf("nvidia-smi printed %q, want %q", out, want)
	}
	for _, name := range []string{"nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control -v", "nvidia-cuda-mps-server"} {
		bin, args, _ := strings.Cut(name, " ")
		if out, want := run(t, n.HostPath("/usr/bin/"+bin), nil, strings.Fields(args)...), bin+" "+n.DriverVersion+"\n"; out != want {
			t.Errorf("%s printed %q, want %q", name, out, want)
		}
	}
	// Without the node's libraries nvidia-smi fails with dlerror's text,
	// unless the host has a real driver for it to find.
	if hostHasNVML() {
		return
	}
	cmd := exec.Command(smi)
	cmd.Env = []string{"LD_LIBRARY_PATH=" + t.TempDir()}
	outb, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(outb), "libnvidia-ml.so.1: cannot open shared object file") {
		t.Errorf("nvidia-smi without libraries: %v %q", err, outb)
	}
}

var (
	hostNVMLOnce sync.Once
	hostNVML     bool
)

// hostHasNVML reports whether the host's own ld.so.cache has a
// libnvidia-ml.so.1 (a real GPU machine).
func hostHasNVML() bool {
	hostNVMLOnce.Do(func() {
		a, _ := archOf("")
		ldconfig, err := findLDConfig(a)
		if err != nil {
			return
		}
		out, _ := exec.Command(ldconfig, "-p").Output()
		hostNVML = bytes.Contains(out, []byte("libnvidia-ml.so.1 "))
	})
	return hostNVML
}

// cudaProbe builds (through the ELF cache) and runs a program that dlopens
// the node's libcuda.so.1 and prints what it reports.
func cudaProbe(t *testing.T, n *Node) string {
	t.Helper()
	const src = `#include <dlfcn.h>
#include <stdio.h>
int main(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (h == NULL) { fprintf(stderr, "%s\n", dlerror()); return 1; }
	int (*init)(unsigned int) = (int (*)(unsigned int))dlsym(h, "cuInit");
	int (*ver)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
	int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
	const char *(*sim)(void) = (const char *(*)(void))dlsym(h, "nri_gpu_sim_driver_version");
	int v = 0, c = 0;
	if (!init || !ver || !count || !sim || init(0) || ver(&v) || count(&c)) return 2;
	printf("driver %s version %d count %d\n", sim(), v, c);
	return 0;
}
`
	dir, err := cacheDir("")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := buildELF(dir, toolchainOf(t, n), elfJob{name: "cuda-probe", source: src})
	if err != nil {
		t.Fatal(err)
	}
	out := run(t, bin, []string{"LD_LIBRARY_PATH=" + n.HostPath(n.LibDir), DevGPUEnv + "=" + n.HostPath("/dev")})
	if !strings.HasPrefix(out, "driver "+n.DriverVersion+" ") {
		t.Errorf("libcuda reports %q, want driver %s", out, n.DriverVersion)
	}
	return out
}

func run(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Errorf("%s: %v\n%s", bin, err, stderr.String())
	}
	return string(out)
}

func soname(t *testing.T, p string) string {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Type != elf.ET_DYN {
		t.Errorf("%s: ELF type %v, want ET_DYN", p, f.Type)
	}
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(names) != 1 {
		t.Fatalf("%s: DT_SONAME %q, %v", p, names, err)
	}
	return names[0]
}

func definedSymbols(t *testing.T, p string) map[string]bool {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_BIND(s.Info) == elf.STB_GLOBAL {
			m[s.Name] = true
		}
	}
	return m
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalFiles(a, b []File) bool {
	return slices.EqualFunc(a, b, func(x, y File) bool {
		return x.Path == y.Path && x.SONAME == y.SONAME && x.Capability == y.Capability && slices.Equal(x.Container, y.Container)
	})
}
