package libcache_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/libcache"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// setup lays out a 1-GPU node and discovers it. The cache is made of the
// driver's files only: the node has no device nodes (so no usable GPU,
// which nothing here looks at), and the tests need no root.
func setup(t *testing.T) (*simnode.Node, *inventory.Snapshot, libcache.Options) {
	t.Helper()
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root})
	if err != nil {
		t.Fatal(err)
	}
	return n, snap, libcache.Options{DriverRoot: n.Root, DriverRootMount: n.Root, Dir: "var/lib/nri-gpu"}
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestBuild(t *testing.T) {
	_, snap, o := setup(t)
	c, err := libcache.Build(snap, o)
	if err != nil {
		t.Fatal(err)
	}
	// utility, compute, video, graphics, ngx have libraries: 31 sets.
	if len(c.Dirs) != 31 || len(c.Dirs32) != 0 {
		t.Fatalf("%d directories (%d 32-bit), want 31 and 0", len(c.Dirs), len(c.Dirs32))
	}
	set := inventory.DefaultCapabilities
	dir, ok := c.Dirs[set]
	if !ok {
		t.Fatalf("no directory for %s", set)
	}
	checkDir(t, dir, snap, inventory.Library, set)
	// Every SONAME is in the directory, and so is the development link
	// libcuda.so that -lcuda searches for (JIT linkers, Triton).
	for _, name := range []string{"libcuda.so.1", "libnvidia-ml.so.1", "libcuda.so"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(c.Dirs[inventory.Capabilities(0).With(inventory.Utility)], "libcuda.so")); err == nil {
		t.Errorf("utility-only directory has libcuda.so without libcuda.so.1")
	}

	// A second build (a plugin restart) reuses the same directories.
	c2, err := libcache.Build(snap, o)
	if err != nil {
		t.Fatal(err)
	}
	if c2.Dirs[set] != dir {
		t.Errorf("rebuild made %s, want the existing %s", c2.Dirs[set], dir)
	}
}

// TestUpgradeAndClean checks that a driver upgrade makes new directories,
// keeps the old version's files alive while a container uses them, and
// removes them once none does.
func TestUpgradeAndClean(t *testing.T) {
	n, snap, o := setup(t)
	old, err := libcache.Build(snap, o)
	if err != nil {
		t.Fatal(err)
	}
	oldDir := old.Dirs[inventory.DefaultCapabilities]
	oldCuda := filepath.Join(oldDir, "libcuda.so.1")

	n2, err := simnode.Upgrade(n, "590.44.01", simnode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	snap2, err := discover.Discover(discover.Options{HostRoot: n2.Root, DriverRoot: n2.Root})
	if err != nil {
		t.Fatal(err)
	}
	if snap2.DriverVersion != "590.44.01" {
		t.Fatalf("upgraded version %q", snap2.DriverVersion)
	}
	cur, err := libcache.Build(snap2, o)
	if err != nil {
		t.Fatal(err)
	}
	newDir := cur.Dirs[inventory.DefaultCapabilities]
	if newDir == oldDir {
		t.Fatal("the upgrade reused the old directory")
	}
	// The old driver's files are gone from the driver root but the old
	// directory still holds them for running containers.
	if _, err := os.Stat(filepath.Join(n.Root, n.LibDir, "libcuda.so.580.126.09")); !os.IsNotExist(err) {
		t.Fatalf("old libcuda still in the driver root: %v", err)
	}
	if data, err := os.ReadFile(oldCuda); err != nil || len(data) == 0 {
		t.Fatalf("old directory lost libcuda: %v", err)
	}

	// In use: kept.
	removed, err := libcache.Clean(o, "590.44.01", func(d string) bool { return d == oldDir })
	if err != nil || len(removed) != 0 {
		t.Fatalf("Clean with the old directory in use removed %q (%v)", removed, err)
	}
	if _, err := os.Stat(oldDir); err != nil {
		t.Fatal(err)
	}
	// Unused: removed; the current version stays.
	removed, err = libcache.Clean(o, "590.44.01", func(string) bool { return false })
	if err != nil || len(removed) != 1 || removed[0] != filepath.Join(n.Root, "var/lib/nri-gpu/580.126.09") {
		t.Fatalf("Clean removed %q (%v)", removed, err)
	}
	if _, err := os.Stat(oldDir); !os.IsNotExist(err) {
		t.Errorf("old directory still there: %v", err)
	}
	if _, err := os.Stat(newDir); err != nil {
		t.Errorf("current directory removed: %v", err)
	}
}

// TestBuildAcrossFileSystems checks that a cache on another file system
// than the libraries (where hard links cannot be made) holds its own copy
// of each file, once, linked into every directory that has it.
func TestBuildAcrossFileSystems(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a tmpfs on the cache directory to put it on another file system than the driver's files")
	}
	_, snap, o := setup(t)
	dir := filepath.Join(o.DriverRootMount, o.Dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mounting a tmpfs (needs root): %v", err)
	}
	defer syscall.Unmount(dir, syscall.MNT_DETACH)
	c, err := libcache.Build(snap, o)
	if err != nil {
		t.Fatal(err)
	}
	checkStored(t, c, snap, inventory.Library)
}

// TestBuildReadOnlyDriverRoot builds the cache as the DaemonSet does: the
// driver root mounted read-only, the cache directory of the same file
// system mounted read-write elsewhere (libraryCacheMount). A hard link
// cannot cross the two mounts, so the cache holds copies; the directories
// it returns are the runtime's paths of the cache directory.
func TestBuildReadOnlyDriverRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind-mounts the driver root read-only")
	}
	n, snap, o := setup(t)
	hostCache := filepath.Join(n.Root, o.Dir)
	if err := os.MkdirAll(hostCache, 0o755); err != nil {
		t.Fatal(err)
	}
	pod := t.TempDir()
	o.DriverRootMount, o.DirMount = filepath.Join(pod, "driver-root"), filepath.Join(pod, "cache")
	bind(t, n.Root, o.DriverRootMount, true)
	bind(t, hostCache, o.DirMount, false)
	c, err := libcache.Build(snap, o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fmt.Sprint(c.LinkError), "cross-device") {
		t.Errorf("link error %v, want cross-device", c.LinkError)
	}
	checkStored(t, c, snap, inventory.Library)
	for _, d := range c.Dirs {
		if !strings.HasPrefix(d, hostCache+"/") {
			t.Fatalf("directory %s is not in the cache's host path %s", d, hostCache)
		}
	}
	// A restart reuses the copies and writes nothing.
	c2, err := libcache.Build(snap, o)
	if err != nil || c2.Stored != 0 || c2.Dirs[inventory.DefaultCapabilities] != c.Dirs[inventory.DefaultCapabilities] {
		t.Errorf("rebuild: stored %d files (%v), directory %s; want none and %s", c2.Stored, err, c2.Dirs[inventory.DefaultCapabilities], c.Dirs[inventory.DefaultCapabilities])
	}
}

// TestBuildLinksWithCacheMount checks that a libraryCacheMount in the same
// mount as the driver's files gets hard links, not copies.
func TestBuildLinksWithCacheMount(t *testing.T) {
	n, snap, o := setup(t)
	o.DirMount = filepath.Join(n.Root, o.Dir)
	c, err := libcache.Build(snap, o)
	if err != nil {
		t.Fatal(err)
	}
	if c.Stored != 0 || c.LinkError != nil {
		t.Fatalf("stored %d files (%v), want hard links", c.Stored, c.LinkError)
	}
	checkDir(t, c.Dirs[inventory.DefaultCapabilities], snap, inventory.Library, inventory.DefaultCapabilities)
}

// bind bind-mounts src at dst for the test, read-only if ro.
func bind(t *testing.T, src, dst string, ro bool) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dst, syscall.MNT_DETACH) })
	if ro {
		if err := syscall.Mount("", dst, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// checkStored checks that the cache holds copies of the snapshot's files
// of kind, not links to them: the same content, another inode, one inode
// per file across all directories, and the bytes counted once.
func checkStored(t *testing.T, c *libcache.Cache, snap *inventory.Snapshot, kind inventory.FileKind) {
	t.Helper()
	var want int64
	files := 0
	for _, f := range snap.Files {
		if f.Kind == kind {
			fi, err := os.Stat(f.HostPath)
			if err != nil {
				t.Fatal(err)
			}
			want += fi.Size()
			files++
		}
	}
	if kind == inventory.Library {
		// The NGX Wine DLLs the directories hold too (the GBM backend is
		// a library already stored).
		for _, x := range inventory.LibraryExtras(snap.Files) {
			if x.File.Kind != kind {
				fi, err := os.Stat(x.File.HostPath)
				if err != nil {
					t.Fatal(err)
				}
				want += fi.Size()
				files++
			}
		}
	}
	if c.Stored != files || c.StoredBytes != want {
		t.Errorf("stored %d files, %d bytes; want %d, %d", c.Stored, c.StoredBytes, files, want)
	}
	inodes := map[string]uint64{}
	for set, dir := range c.Dirs {
		for _, f := range snap.Files {
			if f.Kind != kind || !set.Has(f.Capability) {
				continue
			}
			p := filepath.Join(dir, f.Name)
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			orig, _ := os.ReadFile(f.HostPath)
			if !bytes.Equal(got, orig) {
				t.Fatalf("%s differs from %s", p, f.HostPath)
			}
			ino := inode(t, p)
			if ino == inode(t, f.HostPath) {
				t.Fatalf("%s is a hard link to the driver's file", p)
			}
			if prev, ok := inodes[f.Name]; ok && prev != ino {
				t.Fatalf("%s: two copies in the cache", f.Name)
			}
			inodes[f.Name] = ino
		}
	}
}

// TestBuildRefusesLinkOutOfRoot checks that a cache path leaving the
// driver root is refused.
func TestBuildRefusesLinkOutOfRoot(t *testing.T) {
	_, snap, o := setup(t)
	o.Dir = "proc-link"
	if err := os.Symlink("/proc/self", filepath.Join(o.DriverRootMount, "proc-link")); err != nil {
		t.Fatal(err)
	}
	if _, err := libcache.Build(snap, o); err == nil {
		t.Fatal("Build through a link leaving the driver root succeeded")
	}
}

// TestBuildBinaries checks the directories of binaries made for binaryDir:
// one per set of binary-bearing capabilities, holding exactly that set's
// binaries as hard links; none unless asked for.
func TestBuildBinaries(t *testing.T) {
	_, snap, o := setup(t)
	c, err := libcache.Build(snap, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.DirsBin) != 0 {
		t.Fatalf("binaries prepared without being asked: %v", c.DirsBin)
	}
	o.Binaries = true
	if c, err = libcache.Build(snap, o); err != nil {
		t.Fatal(err)
	}
	// utility, compute and display (nvidia-xconfig) have binaries: 7 sets.
	if len(c.DirsBin) != 7 || len(c.Dirs) != 31 {
		t.Fatalf("%d binary directories, %d library directories; want 7 and 31", len(c.DirsBin), len(c.Dirs))
	}
	for set, dir := range c.DirsBin {
		checkDir(t, dir, snap, inventory.Binary, set)
	}
}

// checkDir checks that dir holds exactly the snapshot's files of kind
// that set brings (at least one), each a hard link to the discovered file
// itself under its container name.
func checkDir(t *testing.T, dir string, snap *inventory.Snapshot, kind inventory.FileKind, set inventory.Capabilities) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names, want []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	for _, f := range snap.Files {
		if f.Kind == kind && set.Has(f.Capability) {
			want = append(want, f.Name)
			if inode(t, filepath.Join(dir, f.Name)) != inode(t, f.HostPath) {
				t.Errorf("%s is not a hard link to %s", f.Name, f.HostPath)
			}
			if dev, ok := inventory.DevLink(f.Name); ok && kind != inventory.Binary {
				want = append(want, dev)
				if target, err := os.Readlink(filepath.Join(dir, dev)); err != nil || target != f.Name {
					t.Errorf("%s: %q, %v; want a relative symbolic link to %s", dev, target, err, f.Name)
				}
			}
		}
	}
	slices.Sort(want)
	if len(want) == 0 || !slices.Equal(names, want) {
		t.Errorf("%s %s: directory holds %q, want exactly %q", set, kind, names, want)
	}
}
