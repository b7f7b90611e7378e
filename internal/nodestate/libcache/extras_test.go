package libcache_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/libcache"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// TestBuildLibraryExtras checks that the directories of sets with
// graphics hold gbm/nvidia-drm_gbm.so, a hard link to the discovered
// libnvidia-allocator.so.1, and those with ngx hold nvidia/wine/nvngx.dll
// and _nvngx.dll, hard links to the discovered DLLs; other sets' directories
// hold neither.
func TestBuildLibraryExtras(t *testing.T) {
	_, snap, o := setup(t)
	c, err := libcache.Build(snap, o)
	if err != nil {
		t.Fatal(err)
	}
	find := func(name string) string {
		for _, f := range snap.Files {
			if f.Name == name || f.Kind == inventory.Config && filepath.Base(f.Name) == name {
				return f.HostPath
			}
		}
		t.Fatalf("no %s discovered", name)
		return ""
	}
	extras := map[string]struct {
		cap  inventory.Capability
		host string
	}{
		"gbm/nvidia-drm_gbm.so":  {inventory.Graphics, find("libnvidia-allocator.so.1")},
		"nvidia/wine/nvngx.dll":  {inventory.NGX, find("nvngx.dll")},
		"nvidia/wine/_nvngx.dll": {inventory.NGX, find("_nvngx.dll")},
	}
	for set, dir := range c.Dirs {
		for name, x := range extras {
			p := filepath.Join(dir, name)
			if !set.Has(x.cap) {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s: holds %s", set, name)
				}
				continue
			}
			fi, err := os.Lstat(p)
			if err != nil || !fi.Mode().IsRegular() {
				t.Errorf("%s: %s: %v, want a regular file", set, name, err)
				continue
			}
			if inode(t, p) != inode(t, x.host) {
				t.Errorf("%s: %s is not a hard link to %s", set, name, x.host)
			}
		}
	}
	// Building again reuses every directory.
	again, err := libcache.Build(snap, o)
	if err != nil {
		t.Fatal(err)
	}
	for set, dir := range c.Dirs {
		if again.Dirs[set] != dir {
			t.Errorf("%s: rebuilt as %s, was %s", set, again.Dirs[set], dir)
		}
	}
}
