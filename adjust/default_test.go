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
