package bench

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// CopyMode is the default configuration with the library cache written
// through a second mount of its directory (libraryCacheMount), as in the
// shipped DaemonSet: the driver root and the cache are one file system
// but two mounts, a hard link cannot cross them, so libcache fills the
// cache with its own copies of the driver's files (reflinks where the file
// system can) instead of hard links.
const CopyMode = "copy"

// NRIGPUCopy is the main-table path of nri-gpu in CopyMode. nri-gpu runs
// in one mode at a time (two instances would both answer the same
// request), so Run restarts it when the next case needs the other mode.
const NRIGPUCopy = "nri-gpu-copy"

const (
	// copyCache is libraryCache of CopyMode, inside the driver root: what
	// the runtime mounts containers' library directories from.
	copyCache = "/var/lib/nri-gpu-copy"
	// copyCacheMount is where nri-gpu writes it: a bind mount of
	// driverRoot + copyCache, under Env.Dir.
	copyCacheMount = "cache-mount"
	// benchLibDir is nri-gpu's default libraryDir.
	benchLibDir = "/usr/local/nvidia/lib64"
)

// setupCopyCache makes driverRoot + copyCache and bind-mounts it at
// Env.Dir/copyCacheMount (private, so nothing propagates), and returns the
// configuration of CopyMode.
func (e *Env) setupCopyCache() (string, error) {
	src := filepath.Join(e.Node.Root, copyCache)
	dst := filepath.Join(e.Dir, copyCacheMount)
	for _, d := range []string{src, dst} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("bind-mounting the copy cache: %w", err)
	}
	e.copyMount = dst
	if err := syscall.Mount("", dst, "", syscall.MS_PRIVATE, ""); err != nil {
		return "", fmt.Errorf("making the copy cache's mount private: %w", err)
	}
	return fmt.Sprintf("hostRoot: %s\ndriverRoot: %s\nlibraryCache: %s\nlibraryCacheMount: %s\n", e.Node.Root, e.Node.Root, copyCache, dst), nil
}

// unmountCopyCache undoes setupCopyCache's mount.
func (e *Env) unmountCopyCache() {
	if e.copyMount == "" {
		return
	}
	if err := syscall.Unmount(e.copyMount, syscall.MNT_DETACH); err != nil {
		e.logf("cleanup: unmounting %s: %v", e.copyMount, err)
	}
	e.copyMount = ""
}

// checkCopies checks that nri-gpu in CopyMode filled its cache with copies:
// the cache holds regular files and none of them is a hard link to a file
// of the driver root (an inode of its own). It returns how many distinct
// files the cache holds.
func (e *Env) checkCopies() (int, error) {
	inodes := func(root string, skip ...string) (map[uint64]string, error) {
		m := map[uint64]string{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && slices.Contains(skip, p) {
				return filepath.SkipDir
			}
			if !d.Type().IsRegular() || strings.HasPrefix(d.Name(), ".nri-gpu-") {
				return nil
			}
			var st syscall.Stat_t
			if err := syscall.Lstat(p, &st); err != nil {
				return err
			}
			m[st.Ino] = p
			return nil
		})
		return m, err
	}
	cache, err := inodes(e.copyMount)
	if err != nil {
		return 0, err
	}
	if len(cache) == 0 {
		return 0, fmt.Errorf("nri-gpu (libraryMode auto, libraryCacheMount %s) left its cache empty", e.copyMount)
	}
	// The driver's files: the node's tree less the copy cache, which is
	// in it, and the hard-link cache (of mode auto), whose files are the
	// driver's own inodes under other names.
	driver, err := inodes(e.Node.Root, filepath.Join(e.Node.Root, copyCache), filepath.Join(e.Node.Root, "var/lib/nri-gpu"))
	if err != nil {
		return 0, err
	}
	for ino, p := range cache {
		if d, ok := driver[ino]; ok {
			return 0, fmt.Errorf("the copy cache's %s is a hard link to the driver's %s (inode %d), not a copy", p, d, ino)
		}
	}
	return len(cache), nil
}

// checkCopyMount checks, from inside the container, that its library
// directory is mounted from the copy cache: the root of the mount at
// libraryDir in /proc/self/mountinfo is a directory of driverRoot +
// copyCache.
func (e *Env) checkCopyMount(ctx context.Context, c *Case, id string) (string, error) {
	m, _, _, err := e.C.CRI().Exec(ctx, id, "cat", "/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(m, "\n") {
		f := strings.Fields(l)
		if len(f) < 5 || f[4] != benchLibDir {
			continue
		}
		if !strings.Contains(f[3], copyCache+"/") {
			return "", fmt.Errorf("%s: %s is mounted from %s, not from the copy cache %s", c.Name, benchLibDir, f[3], copyCache)
		}
		n, err := e.checkCopies()
		if err != nil {
			return "", fmt.Errorf("%s: %w", c.Name, err)
		}
		return fmt.Sprintf(", libraries from the copy cache (%d files, none a hard link to the driver's)", n), nil
	}
	return "", fmt.Errorf("%s: no mount at %s in the container:\n%s", c.Name, benchLibDir, m)
}
