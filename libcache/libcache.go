// Package libcache prepares, on the host, one directory of driver
// libraries per set of capabilities, so that a container gets all its
// libraries through a single bind mount instead of one mount per file.
//
// Each directory holds hard links, named by SONAME, to the library files
// that discovery found. Hard links need no mount privileges, keep the exact
// inode that was checked, and keep an old driver's files alive for the
// containers that use them after an upgrade replaced them. They only work
// within one file system, which is why the cache lives inside the driver
// root.
//
// Directories are content-addressed (their name hashes the files' identity)
// and made by renaming a complete temporary directory, so that a directory
// a container uses never changes, a plugin restart reuses what exists, and
// two plugins racing make the same thing.
package libcache

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Options say where the cache lives.
type Options struct {
	// DriverRoot is the driver root as the runtime sees it; the cache's
	// directories are returned under it.
	DriverRoot string
	// DriverRootMount is where this process reads and writes DriverRoot.
	DriverRootMount string
	// Dir is the cache's directory, relative to the driver root
	// ("var/lib/nri-gpu").
	Dir string
	// Binaries also prepares one directory of the driver's binaries per
	// set of binary-bearing capabilities (for binaryDir).
	Binaries bool
}

// Cache maps sets of capabilities to prepared library directories.
type Cache struct {
	// Version is the driver version the directories are for.
	Version string
	// Dirs maps a set of library-bearing capabilities to the directory
	// (runtime view) holding the 64-bit libraries of exactly that set.
	Dirs map[inventory.Capabilities]string
	// Dirs32 does the same for the 32-bit libraries.
	Dirs32 map[inventory.Capabilities]string
	// DirsBin does the same for the binaries, when asked for.
	DirsBin map[inventory.Capabilities]string
	// Links counts the hard links the cache holds (made or reused).
	Links int
}

// Build makes (or reuses) the directories for every set of the
// library-bearing capabilities that the snapshot's libraries have. It
// fails, making nothing usable, when a link cannot be made (another file
// system, a read-only driver root).
func Build(snap *inventory.Snapshot, o Options) (*Cache, error) {
	if snap.DriverVersion == "" {
		return nil, errors.New("no driver")
	}
	root, err := os.OpenRoot(o.DriverRootMount)
	if err != nil {
		return nil, fmt.Errorf("opening the driver root: %w", err)
	}
	defer root.Close()

	c := &Cache{Version: snap.DriverVersion, Dirs: map[inventory.Capabilities]string{}, Dirs32: map[inventory.Capabilities]string{}, DirsBin: map[inventory.Capabilities]string{}}
	kinds := []inventory.FileKind{inventory.Library, inventory.Library32}
	if o.Binaries {
		kinds = append(kinds, inventory.Binary)
	}
	for _, kind := range kinds {
		var libs []lib
		var present inventory.Capabilities
		for _, f := range snap.Files {
			if f.Kind != kind {
				continue
			}
			rel, ok := relTo(o.DriverRoot, f.HostPath)
			if !ok {
				return nil, fmt.Errorf("%s is not under the driver root %s", f.HostPath, o.DriverRoot)
			}
			fi, err := root.Stat(rel)
			if err != nil {
				return nil, err
			}
			st, _ := fi.Sys().(*syscall.Stat_t)
			if st == nil {
				return nil, fmt.Errorf("%s: no inode information", f.HostPath)
			}
			libs = append(libs, lib{rel: rel, name: f.Name, cap: f.Capability,
				id: fmt.Sprintf("%s %d %d %d %d", f.Name, st.Dev, st.Ino, fi.Size(), fi.ModTime().UnixNano())})
			present |= inventory.Capabilities(f.Capability)
		}
		dirs := map[inventory.FileKind]map[inventory.Capabilities]string{
			inventory.Library: c.Dirs, inventory.Library32: c.Dirs32, inventory.Binary: c.DirsBin,
		}[kind]
		for _, set := range subsets(present) {
			var members []lib
			for _, l := range libs {
				if set.Has(l.cap) {
					members = append(members, l)
				}
			}
			rel, err := makeDir(root, o.Dir, snap.DriverVersion, kind, set, members)
			if err != nil {
				return nil, err
			}
			dirs[set] = filepath.Join(o.DriverRoot, rel)
			c.Links += len(members)
		}
	}
	return c, nil
}

// lib is a library (or binary) to link into a directory.
type lib struct {
	rel  string // resolved path relative to the driver root
	name string // SONAME (a binary's base name): the name of the link
	cap  inventory.Capability
	id   string // identity of the file: name, device, inode, size, mtime
}

// subsets returns the non-empty subsets of caps.
func subsets(caps inventory.Capabilities) []inventory.Capabilities {
	var out []inventory.Capabilities
	for s := caps; s != 0; s = (s - 1) & caps {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// makeDir returns the directory (relative to the driver root) holding
// links to members, making it when it does not exist yet.
func makeDir(root *os.Root, base, version string, kind inventory.FileKind, set inventory.Capabilities, members []lib) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n", version, kind, set)
	for _, l := range members {
		fmt.Fprintln(h, l.id)
	}
	name := strings.ReplaceAll(set.String(), ",", "+") + "-" + kind.String() + "-" + hex.EncodeToString(h.Sum(nil))[:16]
	verDir := path.Join(base, version)
	final := path.Join(verDir, name)
	if fi, err := root.Lstat(final); err == nil && fi.IsDir() {
		return final, nil // complete: made by renaming
	}
	if err := root.MkdirAll(verDir, 0o755); err != nil {
		return "", err
	}
	tmp := path.Join(verDir, ".tmp-"+name+fmt.Sprintf("-%d", os.Getpid()))
	_ = root.RemoveAll(tmp)
	if err := root.Mkdir(tmp, 0o755); err != nil {
		return "", err
	}
	for _, l := range members {
		if err := root.Link(l.rel, path.Join(tmp, l.name)); err != nil {
			_ = root.RemoveAll(tmp)
			return "", fmt.Errorf("linking %s: %w", l.rel, err)
		}
	}
	if err := root.Chmod(tmp, 0o755); err != nil {
		_ = root.RemoveAll(tmp)
		return "", err
	}
	if err := root.Rename(tmp, final); err != nil {
		_ = root.RemoveAll(tmp)
		if fi, err2 := root.Lstat(final); err2 == nil && fi.IsDir() {
			return final, nil // another plugin made it first
		}
		return "", err
	}
	return final, nil
}

// relTo returns p relative to root, if it is under it.
func relTo(root, p string) (string, bool) {
	rel, err := filepath.Rel(root, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", false
	}
	return rel, true
}

// Clean removes the directories of driver versions other than current
// that no container uses (inUse reports whether a runtime-view path is a
// mount source of some container), and leftovers of interrupted builds.
// It returns the runtime-view paths it removed.
func Clean(o Options, current string, inUse func(dir string) bool) ([]string, error) {
	root, err := os.OpenRoot(o.DriverRootMount)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	versions, err := readDir(root, o.Dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var removed []string
	for _, v := range versions {
		verDir := path.Join(o.Dir, v)
		dirs, err := readDir(root, verDir)
		if err != nil {
			continue
		}
		used := false
		for _, d := range dirs {
			p := path.Join(verDir, d)
			if strings.HasPrefix(d, ".tmp-") {
				_ = root.RemoveAll(p)
				continue
			}
			used = used || inUse(filepath.Join(o.DriverRoot, p))
		}
		if v == current || used {
			continue
		}
		if err := root.RemoveAll(verDir); err != nil {
			return removed, err
		}
		removed = append(removed, filepath.Join(o.DriverRoot, verDir))
	}
	return removed, nil
}

func readDir(root *os.Root, dir string) ([]string, error) {
	f, err := root.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}
