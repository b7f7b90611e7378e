package adjust

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/inventory"
)

var layout = Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib"}

func node(p string, major, minor int64) *inventory.DeviceNode {
	return &inventory.DeviceNode{Path: p, Major: major, Minor: minor, Mode: 0o666}
}

func snapshot() *inventory.Snapshot {
	s := &inventory.Snapshot{
		DriverVersion: "580.126.09",
		Control: inventory.ControlNodes{
			Ctl:      node("/dev/nvidiactl", 195, 255),
			UVM:      node("/dev/nvidia-uvm", 510, 0),
			UVMTools: node("/dev/nvidia-uvm-tools", 510, 1),
			Modeset:  node("/dev/nvidia-modeset", 195, 254),
		},
		Files: []inventory.DriverFile{
			{Kind: inventory.Library, Capability: inventory.Compute, HostPath: "/usr/lib64/libcuda.so.580.126.09", Name: "libcuda.so.1"},
			{Kind: inventory.Library, Capability: inventory.Utility, HostPath: "/usr/lib64/libnvidia-ml.so.580.126.09", Name: "libnvidia-ml.so.1"},
			{Kind: inventory.Library, Capability: inventory.Graphics, HostPath: "/usr/lib64/libnvidia-glcore.so.580.126.09", Name: "libnvidia-glcore.so.580.126.09"},
			{Kind: inventory.Library32, Capability: inventory.Compute, HostPath: "/usr/lib/libcuda.so.580.126.09", Name: "libcuda.so.1"},
			{Kind: inventory.Binary, Capability: inventory.Utility, HostPath: "/usr/bin/nvidia-smi", Name: "nvidia-smi"},
			{Kind: inventory.Binary, Capability: inventory.Compute, HostPath: "/usr/bin/nvidia-cuda-mps-control", Name: "nvidia-cuda-mps-control"},
			{Kind: inventory.FirmwareDir, HostPath: "/lib/firmware/nvidia/580.126.09", Name: "580.126.09"},
		},
	}
	for i := 0; i < 4; i++ {
		s.GPUs = append(s.GPUs, inventory.GPU{
			Index: i, Minor: 3 - i, UUID: fmt.Sprintf("GPU-%08x-1111-2222-3333-444444444444", i),
			Node: *node(fmt.Sprintf("/dev/nvidia%d", 3-i), 195, int64(3-i)),
		})
	}
	return s
}

func TestBuild(t *testing.T) {
	s := snapshot()
	caps := func(cs ...inventory.Capability) inventory.Capabilities {
		var c inventory.Capabilities
		for _, x := range cs {
			c = c.With(x)
		}
		return c
	}
	for _, tc := range []struct {
		name        string
		gpus        []inventory.GPU
		caps        inventory.Capabilities
		wantDevices []string
		wantMounts  []inventory.Mount
		wantVisible string
		wantDirs    []string
	}{
		{
			name:        "two GPUs default capabilities",
			gpus:        []inventory.GPU{s.GPUs[0], s.GPUs[2]},
			caps:        inventory.DefaultCapabilities,
			wantDevices: []string{"/dev/nvidia3", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"},
			wantMounts: []inventory.Mount{
				{Source: "/usr/lib64/libcuda.so.580.126.09", Destination: "/usr/local/nvidia/lib64/libcuda.so.1"},
				{Source: "/usr/lib64/libcuda.so.580.126.09", Destination: "/usr/local/nvidia/lib64/libcuda.so"},
				{Source: "/usr/lib64/libnvidia-ml.so.580.126.09", Destination: "/usr/local/nvidia/lib64/libnvidia-ml.so.1"},
				{Source: "/usr/bin/nvidia-smi", Destination: "/usr/bin/nvidia-smi"},
				{Source: "/usr/bin/nvidia-cuda-mps-control", Destination: "/usr/bin/nvidia-cuda-mps-control"},
				{Source: "/lib/firmware/nvidia/580.126.09", Destination: "/lib/firmware/nvidia/580.126.09"},
			},
			wantVisible: "GPU-00000000-1111-2222-3333-444444444444,GPU-00000002-1111-2222-3333-444444444444",
			wantDirs:    []string{"/usr/local/nvidia/lib64"},
		},
		{
			name:        "utility only: no uvm, no compute files",
			gpus:        s.GPUs[1:2],
			caps:        caps(inventory.Utility),
			wantDevices: []string{"/dev/nvidia2", "/dev/nvidiactl"},
			wantMounts: []inventory.Mount{
				{Source: "/usr/lib64/libnvidia-ml.so.580.126.09", Destination: "/usr/local/nvidia/lib64/libnvidia-ml.so.1"},
				{Source: "/usr/bin/nvidia-smi", Destination: "/usr/bin/nvidia-smi"},
				{Source: "/lib/firmware/nvidia/580.126.09", Destination: "/lib/firmware/nvidia/580.126.09"},
			},
			wantVisible: "GPU-00000001-1111-2222-3333-444444444444",
			wantDirs:    []string{"/usr/local/nvidia/lib64"},
		},
		{
			name:        "driver only, display and compat32",
			gpus:        nil,
			caps:        caps(inventory.Display, inventory.Compat32, inventory.Compute),
			wantDevices: []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"},
			wantMounts: []inventory.Mount{
				{Source: "/usr/lib64/libcuda.so.580.126.09", Destination: "/usr/local/nvidia/lib64/libcuda.so.1"},
				{Source: "/usr/lib64/libcuda.so.580.126.09", Destination: "/usr/local/nvidia/lib64/libcuda.so"},
				{Source: "/usr/lib/libcuda.so.580.126.09", Destination: "/usr/local/nvidia/lib/libcuda.so.1"},
				{Source: "/usr/lib/libcuda.so.580.126.09", Destination: "/usr/local/nvidia/lib/libcuda.so"},
				{Source: "/usr/bin/nvidia-cuda-mps-control", Destination: "/usr/bin/nvidia-cuda-mps-control"},
				{Source: "/lib/firmware/nvidia/580.126.09", Destination: "/lib/firmware/nvidia/580.126.09"},
			},
			wantVisible: "none",
			wantDirs:    []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := Prepare(s, layout).Edits(tc.gpus, tc.caps)
			var devs []string
			for _, d := range e.Devices {
				devs = append(devs, d.Path)
			}
			if diff := cmp.Diff(tc.wantDevices, devs); diff != "" {
				t.Errorf("devices (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantMounts, e.Mounts); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			if e.VisibleDevices != tc.wantVisible {
				t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want %q", e.VisibleDevices, tc.wantVisible)
			}
			if diff := cmp.Diff(tc.wantDirs, e.LibraryDirs); diff != "" {
				t.Errorf("library dirs (-want +got):\n%s", diff)
			}
			// The development link libcuda.so is a second mount of a
			// file, not a file of its own.
			files := 0
			for _, m := range tc.wantMounts {
				if !strings.HasSuffix(m.Destination, "/libcuda.so") {
					files++
				}
			}
			if e.Files != files {
				t.Errorf("Files = %d, want %d", e.Files, files)
			}
		})
	}
}

// TestSkipFirmware checks that a layout without firmware drops exactly the
// firmware directory, for every capability set.
func TestSkipFirmware(t *testing.T) {
	s := snapshot()
	skip := layout
	skip.SkipFirmware = true
	with, without := Prepare(s, layout), Prepare(s, skip)
	for _, caps := range []inventory.Capabilities{inventory.DefaultCapabilities, inventory.AllCapabilities, 0} {
		a, b := with.Edits(s.GPUs[:1], caps), without.Edits(s.GPUs[:1], caps)
		var want []inventory.Mount
		for _, m := range a.Mounts {
			if m.Destination != "/lib/firmware/nvidia/580.126.09" {
				want = append(want, m)
			}
		}
		if len(want) != len(a.Mounts)-1 {
			t.Fatalf("caps %v: the full layout has no firmware mount: %+v", caps, a.Mounts)
		}
		if diff := cmp.Diff(want, b.Mounts); diff != "" {
			t.Errorf("caps %v: mounts without firmware (-want +got):\n%s", caps, diff)
		}
		if b.Files != a.Files-1 {
			t.Errorf("caps %v: Files = %d, want %d", caps, b.Files, a.Files-1)
		}
	}
}

func TestAdjustment(t *testing.T) {
	s := snapshot()
	e := Prepare(s, layout).Edits(s.GPUs[:1], inventory.DefaultCapabilities)
	adj := e.Adjustment([]string{"PATH=/bin"})

	want := &api.ContainerAdjustment{}
	for _, d := range []*inventory.DeviceNode{&s.GPUs[0].Node, s.Control.Ctl, s.Control.UVM, s.Control.UVMTools} {
		mode := os.FileMode(0o666)
		want.AddDevice(&api.LinuxDevice{Path: d.Path, Type: "c", Major: d.Major, Minor: d.Minor, FileMode: api.FileMode(mode)})
	}
	for _, m := range e.Mounts {
		want.AddMount(&api.Mount{Source: m.Source, Destination: m.Destination, Type: "bind",
			Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}})
	}
	want.AddEnv("NVIDIA_VISIBLE_DEVICES", "GPU-00000000-1111-2222-3333-444444444444")
	want.AddEnv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")
	if diff := cmp.Diff(want, adj, cmp.Comparer(func(a, b *api.ContainerAdjustment) bool {
		return a.String() == b.String()
	})); diff != "" {
		t.Errorf("adjustment (-want +got):\n%s\nwant %s\ngot  %s", diff, want, adj)
	}
	if adj.Linux.Devices[0].FileMode == nil || adj.Linux.Devices[0].FileMode.Value != 0o666 {
		t.Errorf("device file mode not set: %v", adj.Linux.Devices[0].FileMode)
	}
}

func TestLibraryPath(t *testing.T) {
	dirs := []string{"/usr/local/nvidia/lib64"}
	for _, tc := range []struct {
		name   string
		env    []string
		want   string
		change bool
	}{
		{"unset", []string{"PATH=/bin"}, "/usr/local/nvidia/lib64", true},
		{"empty", []string{"LD_LIBRARY_PATH="}, "/usr/local/nvidia/lib64", true},
		{"image's own kept first", []string{"LD_LIBRARY_PATH=/opt/app/lib"}, "/opt/app/lib:/usr/local/nvidia/lib64", true},
		{"already listed (cuda images)", []string{"LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64"}, "/usr/local/nvidia/lib:/usr/local/nvidia/lib64", false},
		{"listed with slash", []string{"LD_LIBRARY_PATH=/usr/local/nvidia/lib64/"}, "/usr/local/nvidia/lib64/", false},
		{"prefix is not a match", []string{"LD_LIBRARY_PATH=/usr/local/nvidia/lib64x"}, "/usr/local/nvidia/lib64x:/usr/local/nvidia/lib64", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, change := LibraryPath(tc.env, dirs)
			if got != tc.want || change != tc.change {
				t.Errorf("LibraryPath = %q, %v; want %q, %v", got, change, tc.want, tc.change)
			}
		})
	}
	if _, change := LibraryPath(nil, nil); change {
		t.Error("no library dirs must leave LD_LIBRARY_PATH alone")
	}
}

// TestBinaryDir checks binaryDir: binaries appear in the directory, through
// one mount of the prepared directory of their capability set when there is
// one and one by one otherwise, and the directory is appended to PATH.
func TestBinaryDir(t *testing.T) {
	s := snapshot()
	l := layout
	l.BinaryDir = "/usr/local/nvidia/bin"
	perFile := Prepare(s, l).Edits(s.GPUs[:1], inventory.DefaultCapabilities)
	var bins []inventory.Mount
	for _, m := range perFile.Mounts {
		if strings.HasPrefix(m.Destination, "/usr/bin/") {
			t.Errorf("binary at /usr/bin with binaryDir set: %+v", m)
		}
		if strings.HasPrefix(m.Destination, l.BinaryDir+"/") {
			bins = append(bins, m)
		}
	}
	want := []inventory.Mount{
		{Source: "/usr/bin/nvidia-smi", Destination: "/usr/local/nvidia/bin/nvidia-smi"},
		{Source: "/usr/bin/nvidia-cuda-mps-control", Destination: "/usr/local/nvidia/bin/nvidia-cuda-mps-control"},
	}
	if diff := cmp.Diff(want, bins); diff != "" {
		t.Errorf("per-file binary mounts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{l.BinaryDir}, perFile.BinaryDirs); diff != "" {
		t.Errorf("binary dirs (-want +got):\n%s", diff)
	}

	utility := inventory.Capabilities(0).With(inventory.Utility)
	l.HostBinaryDirs = map[inventory.Capabilities]string{
		utility:                         "/cache/bin-utility",
		utility.With(inventory.Compute): "/cache/bin-compute+utility",
	}
	whole := Prepare(s, l).Edits(s.GPUs[:1], inventory.DefaultCapabilities)
	var got []inventory.Mount
	for _, m := range whole.Mounts {
		if strings.Contains(m.Destination, "/bin") {
			got = append(got, m)
		}
	}
	if diff := cmp.Diff([]inventory.Mount{{Source: "/cache/bin-compute+utility", Destination: l.BinaryDir}}, got); diff != "" {
		t.Errorf("binary directory mount (-want +got):\n%s", diff)
	}
	if whole.Files != perFile.Files {
		t.Errorf("Files = %d with the directory, %d without: a directory counts for what it holds", whole.Files, perFile.Files)
	}
	// Capabilities without binaries get neither the mount nor PATH.
	if e := Prepare(s, l).Edits(nil, inventory.Capabilities(0).With(inventory.Graphics)); len(e.BinaryDirs) != 0 {
		t.Errorf("graphics only: binary dirs %v", e.BinaryDirs)
	}

	for _, tc := range []struct {
		name string
		env  []string
		want string // "" = PATH not set by the adjustment
	}{
		{"image PATH kept first", []string{"PATH=/opt/app/bin:/usr/bin"}, "/opt/app/bin:/usr/bin:/usr/local/nvidia/bin"},
		{"already listed (cuda images)", []string{"PATH=/usr/local/nvidia/bin:/usr/bin"}, ""},
		{"no PATH: the default, then the directory", nil, DefaultPath + ":/usr/local/nvidia/bin"},
		{"PATHX is another variable", []string{"PATHX=/x"}, DefaultPath + ":/usr/local/nvidia/bin"},
	} {
		adj := whole.Adjustment(tc.env)
		var path string
		for _, kv := range adj.Env {
			if kv.Key == EnvPath {
				path = kv.Value
			}
		}
		if path != tc.want {
			t.Errorf("%s: PATH %q, want %q", tc.name, path, tc.want)
		}
	}
	plain := Prepare(s, layout).Edits(s.GPUs[:1], inventory.DefaultCapabilities)
	if adj := plain.Adjustment(nil); slices.ContainsFunc(adj.Env, func(kv *api.KeyValue) bool { return kv.Key == EnvPath }) {
		t.Error("binaries at /usr/bin must leave PATH alone")
	}
}

// TestAdjustmentSharesPlanMounts checks that adjustments of one set of
// capabilities share the prepared mount messages, and that edits whose
// mounts were changed get messages of their own.
func TestAdjustmentSharesPlanMounts(t *testing.T) {
	p := Prepare(snapshot(), layout)
	e1 := p.Edits(nil, inventory.DefaultCapabilities)
	e2 := p.Edits(nil, inventory.DefaultCapabilities)
	a1, a2 := e1.Adjustment(nil), e2.Adjustment(nil)
	if len(a1.Mounts) == 0 || a1.Mounts[0] != a2.Mounts[0] {
		t.Fatal("adjustments of one capability set do not share the prepared mounts")
	}
	e2.Mounts = e2.Mounts[1:] // as dropExisting does: a changed list
	a3 := e2.Adjustment(nil)
	if len(a3.Mounts) != len(a1.Mounts)-1 || a3.Mounts[0] == a1.Mounts[1] {
		t.Errorf("changed mounts reused the shared messages")
	}
	if a3.Mounts[0].Destination != a1.Mounts[1].Destination {
		t.Errorf("changed mounts: %v", a3.Mounts)
	}
}

// TestEditsByCapability checks which driver files each set of
// capabilities brings: 32-bit libraries only with compat32, and then only
// those of the set's other capabilities; the firmware with every set.
func TestEditsByCapability(t *testing.T) {
	s := &inventory.Snapshot{Files: []inventory.DriverFile{
		{Kind: inventory.Library, Capability: inventory.Compute, Name: "libcuda.so.1", HostPath: "/lib64/libcuda.so.1"},
		{Kind: inventory.Library32, Capability: inventory.Compute, Name: "libcuda.so.1", HostPath: "/lib32/libcuda.so.1"},
		{Kind: inventory.Library32, Capability: inventory.Graphics, Name: "libGLX_nvidia.so.0", HostPath: "/lib32/libGLX_nvidia.so.0"},
		{Kind: inventory.Binary, Capability: inventory.Utility, Name: "nvidia-smi", HostPath: "/bin/nvidia-smi"},
		{Kind: inventory.FirmwareDir, Name: "580", HostPath: "/lib/firmware/nvidia/580"},
	}}
	p := Prepare(s, layout)
	sources := func(caps inventory.Capabilities) []string {
		var out []string
		for _, m := range p.Edits(nil, caps).Mounts {
			out = append(out, m.Source)
		}
		return out
	}
	if diff := cmp.Diff([]string{"/lib64/libcuda.so.1", "/lib64/libcuda.so.1", "/lib32/libcuda.so.1", "/lib32/libcuda.so.1", "/lib/firmware/nvidia/580"},
		sources(inventory.Capabilities(inventory.Compute).With(inventory.Compat32))); diff != "" {
		t.Errorf("compute,compat32 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"/bin/nvidia-smi", "/lib/firmware/nvidia/580"}, sources(inventory.Capabilities(inventory.Utility))); diff != "" {
		t.Errorf("utility (-want +got):\n%s", diff)
	}
}

// TestBinariesAtUsrBinWhenPathRepeated: a runtime that shows PATH twice
// (CRI-O 1.34: its spec template's, then the image's) keeps the second over
// an adjusted PATH, so a binary directory appended to PATH would not be
// searched. Then the binaries go one by one to /usr/bin, without the
// directory mount and without a PATH adjustment; when the last PATH lists
// the directory already (nvidia/cuda images), nothing changes. Fails
// before the fallback: PATH was adjusted and the directory mounted.
func TestBinariesAtUsrBinWhenPathRepeated(t *testing.T) {
	s := snapshot()
	l := layout
	l.BinaryDir = "/usr/local/nvidia/bin"
	utility := inventory.Capabilities(0).With(inventory.Utility)
	l.HostBinaryDirs = map[inventory.Capabilities]string{utility.With(inventory.Compute): "/cache/bin-compute+utility"}
	for _, perFile := range []bool{false, true} {
		ll := l
		if perFile {
			ll.HostBinaryDirs = nil
		}
		e := Prepare(s, ll).Edits(s.GPUs[:1], inventory.DefaultCapabilities)
		bins := func(adj *api.ContainerAdjustment) (usrBin, dir []string, path string) {
			for _, m := range adj.Mounts {
				switch {
				case strings.HasPrefix(m.Destination, "/usr/bin/"):
					usrBin = append(usrBin, m.Source+"->"+m.Destination)
				case m.Destination == l.BinaryDir || strings.HasPrefix(m.Destination, l.BinaryDir+"/"):
					dir = append(dir, m.Destination)
				}
			}
			for _, kv := range adj.Env {
				if kv.Key == EnvPath {
					path = kv.Value
				}
			}
			return
		}
		crio := []string{"PATH=" + DefaultPath, "TERM=xterm", "HOSTNAME=vm", "PATH=/opt/app/bin:/usr/bin:/bin"}
		if !e.BinariesAtUsrBin(crio) {
			t.Errorf("perFile=%v: PATH set twice: BinariesAtUsrBin false", perFile)
		}
		usrBin, dir, path := bins(e.Adjustment(crio))
		want := []string{"/usr/bin/nvidia-smi->/usr/bin/nvidia-smi", "/usr/bin/nvidia-cuda-mps-control->/usr/bin/nvidia-cuda-mps-control"}
		if diff := cmp.Diff(want, usrBin); diff != "" || len(dir) != 0 || path != "" {
			t.Errorf("perFile=%v, PATH set twice: /usr/bin mounts (-want +got):\n%s\ndirectory mounts %q, PATH %q (want none)", perFile, diff, dir, path)
		}
		// The other mounts (libraries) are the plan's.
		other := 0
		for _, m := range e.Mounts {
			if !strings.HasPrefix(m.Destination, l.BinaryDir) {
				other++
			}
		}
		if got := len(e.Adjustment(crio).Mounts); got != other+len(want) {
			t.Errorf("perFile=%v: %d mounts, want %d other and %d binaries", perFile, got, other, len(want))
		}
		// The last PATH lists the directory: the directory is used as is.
		cuda := []string{"PATH=" + DefaultPath, "PATH=/usr/local/nvidia/bin:/usr/bin"}
		if e.BinariesAtUsrBin(cuda) {
			t.Errorf("perFile=%v: the last PATH lists the directory: BinariesAtUsrBin true", perFile)
		}
		if usrBin, dir, path := bins(e.Adjustment(cuda)); len(usrBin) != 0 || len(dir) == 0 || path != "" {
			t.Errorf("perFile=%v, PATH listing the directory: /usr/bin %q, directory %q, PATH %q", perFile, usrBin, dir, path)
		}
		// Once, or not at all: PATH is extended as always.
		for _, env := range [][]string{nil, {"PATH=/opt/app/bin"}} {
			if usrBin, dir, path := bins(e.Adjustment(env)); len(usrBin) != 0 || len(dir) == 0 || !strings.HasSuffix(path, ":"+l.BinaryDir) {
				t.Errorf("perFile=%v, env %q: /usr/bin %q, directory %q, PATH %q", perFile, env, usrBin, dir, path)
			}
		}
	}
	// Binaries at /usr/bin already (layout: toolkit): nothing to fall back from.
	plain := Prepare(s, layout).Edits(s.GPUs[:1], inventory.DefaultCapabilities)
	if plain.BinariesAtUsrBin([]string{"PATH=/a", "PATH=/b"}) {
		t.Error("layout without BinaryDir: BinariesAtUsrBin true")
	}
}
