package adjust_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/libcache"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite adjust/testdata/*.golden")

// simulated lays out a simulated node with real /dev nodes (root) and
// returns its discovery, prepared with the product's default layout.
func simulated(tb testing.TB) (*simnode.Node, *adjust.Prepared) {
	tb.Helper()
	if err := simnode.CanMknod(); err != nil {
		tb.Skipf("needs root: the GPUs of a simulated node are character devices made with mknod: %v", err)
	}
	n, err := simnode.Generate(tb.TempDir(), simnode.Options{NumGPUs: 2, DeviceNodes: true})
	if err != nil {
		tb.Fatalf("simnode.Generate: %v", err)
	}
	s, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root})
	if err != nil {
		tb.Fatal(err)
	}
	return n, adjust.Prepare(s, adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib"})
}

// render writes an adjustment as sorted lines, with the node's root as
// $ROOT, so that it compares across runs.
func render(root string, adj *api.ContainerAdjustment) string {
	var lines []string
	for _, d := range adj.GetLinux().GetDevices() {
		lines = append(lines, fmt.Sprintf("device %s %s %d:%d mode=%o uid=%v gid=%v", d.Path, d.Type, d.Major, d.Minor, d.FileMode.GetValue(), d.Uid, d.Gid))
	}
	for _, m := range adj.Mounts {
		lines = append(lines, fmt.Sprintf("mount %s <- %s %s %s", m.Destination, strings.ReplaceAll(m.Source, root, "$ROOT"), m.Type, strings.Join(m.Options, ",")))
	}
	for _, e := range adj.Env {
		lines = append(lines, fmt.Sprintf("env %s=%s", e.Key, e.Value))
	}
	if adj.Hooks != nil {
		lines = append(lines, "hooks "+adj.Hooks.String())
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n") + "\n"
}

// TestDefaultCapabilitiesUnchanged pins the exact adjustment of the
// default capabilities (compute,utility) on the simulated node: the
// graphics, display, video and ngx files, the DRM nodes and the vendor
// files added to discovery must not reach such a container. The golden
// file was written by the code before those were discovered.
func TestDefaultCapabilitiesUnchanged(t *testing.T) {
	n, p := simulated(t)
	e := p.Edits(p.Devices()[:1], inventory.DefaultCapabilities)
	got := render(n.Root, e.Adjustment(nil))
	golden := filepath.Join("testdata", "compute-utility.golden")
	if *updateGolden {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the compute,utility adjustment changed:\n--- got\n%s--- want\n%s", got, want)
	}
}

// BenchmarkEditsDefault is the request path's cost of the default
// capabilities on the simulated node: the edits of one GPU and their NRI
// adjustment.
func BenchmarkEditsDefault(b *testing.B) {
	_, p := simulated(b)
	gpus := p.Devices()[:1]
	env := []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=0"}
	b.ReportAllocs()
	for b.Loop() {
		e := p.Edits(gpus, inventory.DefaultCapabilities)
		_ = e.Adjustment(env)
	}
}

// TestCapabilityFiles checks, on the simulated node, where the
// non-library files of each capability go and that nothing of a
// capability reaches a container that did not ask for it: the vendor
// files, X.Org modules and NGX DLLs at the paths their loaders search,
// the DRM nodes of the container's GPUs only (with their group), the
// IPC endpoints with the toolkit's options.
func TestCapabilityFiles(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: the GPUs of a simulated node are character devices made with mknod: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 3, DeviceNodes: true, IPC: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := libcache.Build(s, libcache.Options{DriverRoot: n.Root, DriverRootMount: n.Root, Dir: "var/lib/nri-gpu"})
	if err != nil {
		t.Fatal(err)
	}
	sets := map[uint64]adjust.GPUSetFiles{}
	for m, set := range cache.GPUSets {
		sets[m] = adjust.GPUSetFiles{Profile: set.Profile, ByPath: set.ByPath}
	}
	p := adjust.Prepare(s, adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib", HostGPUSets: sets})
	gpu1 := p.Devices()[1:2]
	set1 := cache.GPUSets[1<<uint(gpu1[0].Minor)]
	if set1.Profile == "" || set1.ByPath == "" {
		t.Fatalf("no profile or by-path directory for GPU 1: %+v", set1)
	}

	// want maps each container path of a non-library file to its
	// capability.
	want := map[string]string{}
	for _, f := range n.Files {
		for _, c := range f.Container {
			want[c] = f.Capability
		}
	}
	for _, must := range []string{
		"/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
		"/etc/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
		"/etc/OpenCL/vendors/nvidia.icd", "/usr/share/nvidia/nvoptix.bin",
		"/usr/lib64/xorg/modules/drivers/nvidia_drv.so", "/usr/lib64/xorg/modules/extensions/libglxserver_nvidia.so",
		"/usr/lib/x86_64-linux-gnu/nvidia/wine/nvngx.dll",
	} {
		if want[must] == "" {
			t.Errorf("the simulated node has no file for %s", must)
		}
	}

	for _, tc := range []struct {
		caps inventory.Capabilities
		ipc  []string
	}{
		{inventory.DefaultCapabilities, []string{simnode.PersistencedSocket, simnode.FabricManagerSocket, simnode.MPSPipeDir}},
		{inventory.Capabilities(inventory.Compute), []string{simnode.MPSPipeDir}},
		{inventory.Capabilities(inventory.Graphics), nil},
		{inventory.Capabilities(inventory.Video), nil},
		{inventory.Capabilities(inventory.Display), nil},
		{inventory.Capabilities(inventory.NGX), nil},
		{inventory.Capabilities(inventory.Graphics | inventory.Display | inventory.Video), nil},
		{inventory.AllCapabilities, []string{simnode.PersistencedSocket, simnode.FabricManagerSocket, simnode.MPSPipeDir}},
	} {
		t.Run(tc.caps.String(), func(t *testing.T) {
			e := p.Edits(gpu1, tc.caps)
			adj := e.Adjustment(nil)
			mounts := map[string]*api.Mount{}
			for _, m := range adj.Mounts {
				if mounts[m.Destination] != nil {
					t.Errorf("two mounts at %s", m.Destination)
				}
				mounts[m.Destination] = m
			}
			for dst, c := range want {
				c, _ := inventory.CapabilityByName(c)
				if got := mounts[dst] != nil; got != tc.caps.Has(c) {
					t.Errorf("mount at %s: %v, want %v (capability %s)", dst, got, !got, c)
				}
			}
			for _, lib := range []string{"libnvcuvid.so.1", "libnvidia-encode.so.1", "libnvidia-opticalflow.so.1", "libvdpau_nvidia.so.1"} {
				if got := mounts["/usr/local/nvidia/lib64/"+lib] != nil; got != tc.caps.Has(inventory.Video) {
					t.Errorf("video library %s: %v", lib, got)
				}
			}
			for _, lib := range []string{"libnvidia-egl-gbm.so.1", "libnvidia-egl-wayland.so.1", "libEGL_nvidia.so.0", "libGLX_nvidia.so.0"} {
				if got := mounts["/usr/local/nvidia/lib64/"+lib] != nil; got != tc.caps.Has(inventory.Graphics) {
					t.Errorf("graphics library %s: %v", lib, got)
				}
			}
			var ipc []string
			for _, m := range adj.Mounts {
				if strings.Contains(m.Destination, "nvidia-mps") || strings.HasSuffix(m.Destination, "/socket") {
					ipc = append(ipc, m.Destination)
					if strings.Join(m.Options, ",") != "nosuid,nodev,rbind,rprivate,noexec" || m.Type != "bind" {
						t.Errorf("IPC mount %s: type %q options %q", m.Destination, m.Type, m.Options)
					}
				}
			}
			sort.Strings(ipc)
			wantIPC := append([]string(nil), tc.ipc...)
			sort.Strings(wantIPC)
			if strings.Join(ipc, " ") != strings.Join(wantIPC, " ") {
				t.Errorf("IPC mounts %q, want %q", ipc, wantIPC)
			}

			var dri []string
			for _, d := range adj.Linux.Devices {
				if strings.HasPrefix(d.Path, "/dev/dri/") {
					dri = append(dri, d.Path)
					if d.Gid.GetValue() != simnode.RenderGID || d.FileMode.GetValue() != 0o660 || d.Major != 226 {
						t.Errorf("%s: gid %v mode %o major %d", d.Path, d.Gid, d.FileMode.GetValue(), d.Major)
					}
				} else if d.Gid != nil {
					t.Errorf("%s has gid %d", d.Path, d.Gid.GetValue())
				}
			}
			var wantDRI []string
			graphics := tc.caps.Has(inventory.Graphics) || tc.caps.Has(inventory.Display)
			if graphics {
				wantDRI = []string{simnode.CardPath(1), simnode.RenderPath(1)}
			}
			for dst, src := range map[string]string{adjust.ProfileDestination: set1.Profile, adjust.ByPathDestination: set1.ByPath} {
				m := mounts[dst]
				if graphics && (m == nil || m.Source != src || strings.Join(m.Options, ",") != "ro,nosuid,nodev,rbind,rprivate") {
					t.Errorf("mount at %s: %v, want %s read-only", dst, m, src)
				}
				if !graphics && m != nil {
					t.Errorf("mount at %s without graphics or display", dst)
				}
			}
			if strings.Join(dri, " ") != strings.Join(wantDRI, " ") {
				t.Errorf("DRM nodes %q, want %q (GPU 1's only)", dri, wantDRI)
			}
		})
	}
}
