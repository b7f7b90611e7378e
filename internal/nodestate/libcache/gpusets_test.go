package libcache_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/libcache"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestProfileContent pins the application profile to the bytes the
// NVIDIA Container Toolkit's update-application-profile hook writes.
func TestProfileContent(t *testing.T) {
	for mask, want := range map[uint64]string{
		0x1:    `{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x1]}],"rules":[{"pattern":[],"profile":"_container_"}]}`,
		0x8001: `{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x8001]}],"rules":[{"pattern":[],"profile":"_container_"}]}`,
	} {
		if got := string(libcache.ProfileContent(mask)); got != want {
			t.Errorf("ProfileContent(%#x) = %s, want %s", mask, got, want)
		}
	}
}

// TestBuildGPUSets checks the profile and by-path directories of every
// set of a node's GPUs: the profile names the set's minors, the links
// the set's DRM nodes by bus id, and Clean keeps a profile a container
// mounts.
func TestBuildGPUSets(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: the GPUs of a simulated node are character devices made with mknod: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 3, SwapMinors: true, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root})
	if err != nil {
		t.Fatal(err)
	}
	o := libcache.Options{DriverRoot: n.Root, DriverRootMount: n.Root, Dir: "var/lib/nri-gpu"}
	c, err := libcache.Build(snap, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.GPUSets) != 7 {
		t.Fatalf("%d GPU sets, want 7", len(c.GPUSets))
	}
	// GPU index 0 has minor 2 (SwapMinors), index 2 minor 0.
	mask, ok := libcache.MinorMask([]inventory.GPU{snap.GPUs[0], snap.GPUs[2]})
	if !ok || mask != 0b101 {
		t.Fatalf("mask %b %v", mask, ok)
	}
	set := c.GPUSets[mask]
	data, err := os.ReadFile(set.Profile)
	if err != nil || string(data) != string(libcache.ProfileContent(0b101)) {
		t.Errorf("profile %s = %q (%v)", set.Profile, data, err)
	}
	if fi, err := os.Stat(set.Profile); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("profile mode: %v %v", fi.Mode(), err)
	}
	entries, err := os.ReadDir(set.ByPath)
	if err != nil || len(entries) != 4 {
		t.Fatalf("by-path %s: %v (%v)", set.ByPath, entries, err)
	}
	for _, i := range []int{0, 2} {
		g := snap.GPUs[i]
		for kind, want := range map[string]string{"card": simnode.CardPath(i), "render": simnode.RenderPath(i)} {
			got, err := os.Readlink(filepath.Join(set.ByPath, "pci-"+g.BusID+"-"+kind))
			if err != nil || got != "../"+filepath.Base(want) {
				t.Errorf("GPU %d %s link -> %q (%v), want ../%s", i, kind, got, err, filepath.Base(want))
			}
		}
	}

	// A rebuild reuses them; Clean keeps an old version's profile that a
	// container mounts (the file, not its directory).
	c2, err := libcache.Build(snap, o)
	if err != nil || c2.GPUSets[mask] != set {
		t.Fatalf("rebuild: %+v (%v), want %+v", c2.GPUSets[mask], err, set)
	}
	removed, err := libcache.Clean(o, "590.44.01", func(d string) bool { return d == set.Profile })
	if err != nil || len(removed) != 0 {
		t.Fatalf("Clean with a profile in use removed %q (%v)", removed, err)
	}
	removed, err = libcache.Clean(o, "590.44.01", func(string) bool { return false })
	if err != nil || len(removed) != 1 {
		t.Fatalf("Clean removed %q (%v)", removed, err)
	}
}

// TestBuildGPUSetsMany checks that a node of more than MaxAllSetsGPUs
// GPUs gets directories for each GPU and for all of them, not for the
// 2^n sets.
func TestBuildGPUSetsMany(t *testing.T) {
	if err := simnode.CanMknod(); err != nil {
		t.Skipf("needs root: the GPUs of a simulated node are character devices made with mknod: %v", err)
	}
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: libcache.MaxAllSetsGPUs + 2, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root})
	if err != nil {
		t.Fatal(err)
	}
	c, err := libcache.Build(snap, libcache.Options{DriverRoot: n.Root, DriverRootMount: n.Root, Dir: "var/lib/nri-gpu"})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := libcache.MinorMask(snap.GPUs)
	if len(c.GPUSets) != len(snap.GPUs)+1 || c.GPUSets[all].Profile == "" || c.GPUSets[1].Profile == "" {
		t.Errorf("%d GPU sets for %d GPUs", len(c.GPUSets), len(snap.GPUs))
	}
}
