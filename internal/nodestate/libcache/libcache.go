// Package libcache prepares, on the host, one directory of driver
// libraries per set of capabilities, so that a container gets all its
// libraries through a single bind mount instead of one mount per file.
//
// Each directory holds, named by SONAME, the library files that discovery
// found: hard links to them where the cache and the driver's files are in
// one mount (nri-gpu on the host), else links to the cache's own copy of
// each file, made once per driver version, by a reflink (FICLONE) where
// the file system shares blocks between files and by a copy otherwise (a
// DaemonSet that mounts the driver root read-only and only the cache
// read-write: a hard link cannot cross two mounts, even of one file
// system). Either way a directory keeps the exact file that discovery
// checked, and keeps an old driver's files for the containers that use
// them after an upgrade replaced them.
//
// Directories are content-addressed (their name hashes the files' identity)
// and made by renaming a complete temporary directory, so that a directory
// a container uses never changes, a plugin restart reuses what exists, and
// two plugins racing make the same thing.
//
// nri-gpu removes only what it made: the cache directory carries a marker
// file (.nri-gpu-cache) and so does each driver version's directory in it
// (.nri-gpu-version). Build refuses a cache directory that holds anything
// else, and Clean never removes a directory without its marker.
package libcache

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/devchar"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Options say where the cache lives.
type Options struct {
	// DriverRoot is the driver root as the runtime sees it; the cache's
	// directories are returned under it.
	DriverRoot string
	// DriverRootMount is where this process reads DriverRoot.
	DriverRootMount string
	// Dir is the cache's directory, relative to the driver root
	// ("var/lib/nri-gpu"): the runtime mounts DriverRoot/Dir/...
	Dir string
	// DirMount is where this process reads and writes DriverRoot/Dir,
	// when that is not DriverRootMount/Dir (a DaemonSet that mounts the
	// driver root read-only and only the cache read-write). Empty: the
	// cache is written inside DriverRootMount, and cannot leave it.
	DirMount string
	// Binaries also prepares one directory of the driver's binaries per
	// set of binary-bearing capabilities (for binaryDir).
	Binaries bool
}

// The markers of what nri-gpu made.
const (
	// RootMarker is the file in the cache directory that says nri-gpu
	// owns it.
	RootMarker = ".nri-gpu-cache"
	// VersionMarker is the file in each driver version's directory that
	// nri-gpu made.
	VersionMarker = ".nri-gpu-version"
	// storeDir is the directory, in a version's directory, of the cache's
	// own copies of the driver's files (when they cannot be hard-linked).
	storeDir = ".files"
	// lostFound is a file system's own directory, tolerated at the root of
	// a cache that is a file system of its own.
	lostFound = "lost+found"
)

const rootMarkerText = "This directory is nri-gpu's library cache: nri-gpu makes and removes its driver version\n" +
	"directories here, and refuses to use it if it holds anything else. Do not put other files here.\n"

// dirFormat is the version of what a set's directory holds: 2 added the
// development links (libcuda.so -> libcuda.so.1).
const dirFormat = "format 2"

// setDirName is the name of a directory of one set (a set of capabilities,
// a file kind, a hash), as makeDir names it.
// (a set of GPUs, by the hex mask of their minors, for a profile or
// by-path directory: see gpuSets).
var setDirName = regexp.MustCompile(`^[a-z0-9+]+-(library|library32|binary|profile|bypath)-[0-9a-f]{16}$`)

// versionName is the driver versions nri-gpu makes directories for.
var versionName = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$`)

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
	// GPUSets maps sets of GPUs (MinorMask) to their application
	// profile and by-path directory (see MaxAllSetsGPUs).
	GPUSets map[uint64]GPUSet
	// Links counts the directories' entries (made or reused).
	Links int
	// Stored counts the driver files that this build put in the cache's
	// own store because they could not be hard-linked (another mount or
	// file system); StoredBytes is their size. Cloned of them are reflinks
	// (no new data blocks); the others are copies (StoredBytes written).
	Stored, Cloned int
	StoredBytes    int64
	// LinkError is why the driver's files could not be hard-linked, when
	// they were stored instead.
	LinkError error
}

// ForeignError is a cache directory that holds what nri-gpu did not make.
type ForeignError struct {
	// Dir is the directory, as this process reads it.
	Dir string
	// Found are some of the entries nri-gpu did not make.
	Found []string
}

func (e *ForeignError) Error() string {
	return fmt.Sprintf("%s holds %s, which nri-gpu did not make; the library cache must be a directory that only nri-gpu uses (such as /var/lib/nri-gpu): nri-gpu neither writes in nor cleans one that holds anything else",
		e.Dir, strings.Join(quoteAll(e.Found), ", "))
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strconv.Quote(v)
	}
	return out
}

// mountDir is where this process reads the cache.
func (o Options) mountDir() string {
	if o.DirMount != "" {
		return o.DirMount
	}
	return filepath.Join(o.DriverRootMount, o.Dir)
}

// openCache opens the cache directory; with create it is made when
// missing. Without DirMount it is opened inside the driver root, and a
// path leaving it (a symbolic link) fails.
func openCache(o Options, create bool) (*os.Root, error) {
	if o.DirMount != "" {
		if create {
			if err := os.MkdirAll(o.DirMount, 0o755); err != nil {
				return nil, err
			}
		}
		return os.OpenRoot(o.DirMount)
	}
	root, err := os.OpenRoot(o.DriverRootMount)
	if err != nil {
		return nil, fmt.Errorf("opening the driver root: %w", err)
	}
	defer root.Close()
	if create {
		if err := root.MkdirAll(o.Dir, 0o755); err != nil {
			return nil, err
		}
	}
	return root.OpenRoot(o.Dir)
}

// claim makes sure that nri-gpu owns the cache directory: it holds the
// root marker and nothing but marked version directories (and a file
// system's lost+found, and nri-gpu's record of /dev/char links). An empty directory, or one that holds only an
// older nri-gpu's unmarked directories, is marked; anything else is a
// ForeignError.
func claim(cache *os.Root, dir string) error {
	names, err := readDir(cache, ".")
	if err != nil {
		return err
	}
	marked := slices.Contains(names, RootMarker)
	var foreign, legacy []string
	for _, n := range names {
		switch {
		case n == RootMarker || n == lostFound:
		case devchar.IsRecordFile(n) && isRegular(cache, n):
			// The record of /dev/char links, when devCharLinks.stateDir
			// is this directory too (/var/lib/nri-gpu in the DaemonSet).
		case isVersionDir(cache, n):
		case !marked && isLegacyVersionDir(cache, n):
			legacy = append(legacy, n)
		default:
			foreign = append(foreign, n)
		}
	}
	if len(foreign) > 0 {
		slices.Sort(foreign)
		if len(foreign) > 5 {
			foreign = append(foreign[:5], fmt.Sprintf("... (%d entries in all)", len(foreign)))
		}
		return &ForeignError{Dir: dir, Found: foreign}
	}
	for _, v := range legacy {
		if err := cache.WriteFile(path.Join(v, VersionMarker), []byte(v+"\n"), 0o444); err != nil {
			return err
		}
	}
	if !marked {
		return cache.WriteFile(RootMarker, []byte(rootMarkerText), 0o444)
	}
	return nil
}

// isRegular reports whether name is a regular file.
func isRegular(cache *os.Root, name string) bool {
	fi, err := cache.Lstat(name)
	return err == nil && fi.Mode().IsRegular()
}

// isVersionDir reports whether name is a directory with a version marker.
func isVersionDir(cache *os.Root, name string) bool {
	if fi, err := cache.Lstat(name); err != nil || !fi.IsDir() {
		return false
	}
	fi, err := cache.Lstat(path.Join(name, VersionMarker))
	return err == nil && fi.Mode().IsRegular()
}

// isLegacyVersionDir reports whether name is a version directory as an
// nri-gpu without markers made it: a directory holding only directories
// named as makeDir names them (or leftovers of interrupted builds).
func isLegacyVersionDir(cache *os.Root, name string) bool {
	if !versionName.MatchString(name) {
		return false
	}
	if fi, err := cache.Lstat(name); err != nil || !fi.IsDir() {
		return false
	}
	entries, err := readDir(cache, name)
	if err != nil || len(entries) == 0 {
		return false
	}
	for _, e := range entries {
		fi, err := cache.Lstat(path.Join(name, e))
		if err != nil || !fi.IsDir() || !setDirName.MatchString(e) && !strings.HasPrefix(e, ".tmp-") {
			return false
		}
	}
	return true
}

// Build makes (or reuses) the directories for every set of the
// library-bearing capabilities that the snapshot's libraries have. It
// fails, making nothing usable, when the cache directory holds what
// nri-gpu did not make (a ForeignError) or cannot be written.
func Build(snap *inventory.Snapshot, o Options) (*Cache, error) {
	if snap.DriverVersion == "" {
		return nil, errors.New("no driver")
	}
	if !versionName.MatchString(snap.DriverVersion) {
		return nil, fmt.Errorf("driver version %q cannot name a directory", snap.DriverVersion)
	}
	root, err := os.OpenRoot(o.DriverRootMount)
	if err != nil {
		return nil, fmt.Errorf("opening the driver root: %w", err)
	}
	defer root.Close()
	cache, err := openCache(o, true)
	if err != nil {
		return nil, fmt.Errorf("opening the library cache %s: %w", o.mountDir(), err)
	}
	defer cache.Close()
	if err := claim(cache, o.mountDir()); err != nil {
		return nil, err
	}

	c := &Cache{Version: snap.DriverVersion, Dirs: map[inventory.Capabilities]string{}, Dirs32: map[inventory.Capabilities]string{}, DirsBin: map[inventory.Capabilities]string{}}
	p := &placer{cache: cache, version: snap.DriverVersion, c: c}
	defer p.close()
	kinds := []inventory.FileKind{inventory.Library, inventory.Library32}
	if o.Binaries {
		kinds = append(kinds, inventory.Binary)
	}
	for _, kind := range kinds {
		if err := p.buildKind(root, snap, o, kind); err != nil {
			return nil, err
		}
	}
	sets, err := p.gpuSets(snap, o)
	if err != nil {
		return nil, fmt.Errorf("preparing the application profiles and by-path links: %w", err)
	}
	c.GPUSets = sets
	return c, nil
}

// buildKind makes (or reuses) the directories of the files of kind: one
// per set of the capabilities the files have, holding the files of those
// capabilities (and, for the 64-bit libraries, the files held under names
// of their own).
func (p *placer) buildKind(root *os.Root, snap *inventory.Snapshot, o Options, kind inventory.FileKind) error {
	libs, present, err := p.openKind(root, snap, o, kind)
	if err != nil {
		return err
	}
	// The files the 64-bit directories hold under names of their
	// own (the GBM backend, the NGX Wine DLLs).
	var extras []extra
	if kind == inventory.Library {
		for _, x := range inventory.LibraryExtras(snap.Files) {
			rel, ok := relTo(o.DriverRoot, x.File.HostPath)
			if !ok {
				return fmt.Errorf("%s is not under the driver root %s", x.File.HostPath, o.DriverRoot)
			}
			l, err := p.open(root, rel, x.File)
			if err != nil {
				return err
			}
			extras = append(extras, extra{name: x.Name, cap: x.Capability, l: l})
		}
	}
	dirs := map[inventory.FileKind]map[inventory.Capabilities]string{
		inventory.Library: p.c.Dirs, inventory.Library32: p.c.Dirs32, inventory.Binary: p.c.DirsBin,
	}[kind]
	for _, set := range subsets(present) {
		var members []*lib
		for _, l := range libs {
			if set.Has(l.cap) {
				members = append(members, l)
			}
		}
		var xs []extra
		for _, x := range extras {
			if set.Has(x.cap) {
				xs = append(xs, x)
			}
		}
		rel, err := p.makeDir(kind, set, members, xs)
		if err != nil {
			return err
		}
		dirs[set] = filepath.Join(o.DriverRoot, o.Dir, rel)
		p.c.Links += len(members)
	}
	return nil
}

// openKind opens the snapshot's files of kind under the driver root, and
// returns them with the capabilities they have.
func (p *placer) openKind(root *os.Root, snap *inventory.Snapshot, o Options, kind inventory.FileKind) ([]*lib, inventory.Capabilities, error) {
	var libs []*lib
	var present inventory.Capabilities
	for _, f := range snap.Files {
		if f.Kind != kind {
			continue
		}
		rel, ok := relTo(o.DriverRoot, f.HostPath)
		if !ok {
			return nil, 0, fmt.Errorf("%s is not under the driver root %s", f.HostPath, o.DriverRoot)
		}
		l, err := p.open(root, rel, f)
		if err != nil {
			return nil, 0, err
		}
		libs = append(libs, l)
		present |= inventory.Capabilities(f.Capability)
	}
	return libs, present, nil
}

// lib is a library (or binary) to link into a directory.
type lib struct {
	file *os.File // the file discovery found, opened
	rel  string   // resolved path relative to the driver root
	name string   // SONAME (a binary's base name): the name of the link
	cap  inventory.Capability
	id   string // identity of the file: name, device, inode, size, mtime
	size int64
	mode fs.FileMode
}

// extra is a file a 64-bit library directory holds below it under a name
// of its own (inventory.LibraryExtras).
type extra struct {
	name string // relative to the directory
	cap  inventory.Capability
	l    *lib
}

// placer puts driver files into the cache's directories.
type placer struct {
	cache   *os.Root
	version string
	c       *Cache
	files   []*os.File
	// noLink is set once a hard link to a driver file failed: the rest are
	// stored too.
	noLink bool
}

// open opens the driver file rel and records its identity. The file
// opened is the one that is linked or copied, whatever happens to the
// path afterwards.
func (p *placer) open(root *os.Root, rel string, f inventory.DriverFile) (*lib, error) {
	file, err := root.Open(rel)
	if err != nil {
		return nil, err
	}
	p.files = append(p.files, file)
	var st unix.Stat_t
	if err := unix.Fstat(int(file.Fd()), &st); err != nil {
		return nil, fmt.Errorf("%s: %w", f.HostPath, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file", f.HostPath)
	}
	return &lib{file: file, rel: rel, name: f.Name, cap: f.Capability, size: st.Size, mode: fs.FileMode(st.Mode & 0o777),
		id: fmt.Sprintf("%s %d %d %d %d", f.Name, st.Dev, st.Ino, st.Size, st.Mtim.Nano())}, nil
}

func (p *placer) close() {
	for _, f := range p.files {
		f.Close()
	}
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

// makeDir returns the directory (relative to the cache) holding members,
// making it when it does not exist yet.
func (p *placer) makeDir(kind inventory.FileKind, set inventory.Capabilities, members []*lib, extras []extra) (string, error) {
	h := sha256.New()
	// dirFormat changes the name when what a directory holds besides its
	// members changes (the development links), so that a cache made by an
	// older nri-gpu is not reused as it is.
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", dirFormat, p.version, kind, set)
	for _, l := range members {
		fmt.Fprintln(h, l.id)
	}
	// Only directories with extras hash them: the others keep their
	// names (and a cache made before extras existed is reused).
	for _, x := range extras {
		fmt.Fprintf(h, "x %s %s\n", x.name, x.l.id)
	}
	name := strings.ReplaceAll(set.String(), ",", "+") + "-" + kind.String() + "-" + hex.EncodeToString(h.Sum(nil))[:16]
	verDir := p.version
	final := path.Join(verDir, name)
	if fi, err := p.cache.Lstat(final); err == nil && fi.IsDir() {
		return final, nil // complete: made by renaming
	}
	if err := p.makeVersionDir(); err != nil {
		return "", err
	}
	tmp := path.Join(verDir, ".tmp-"+name+fmt.Sprintf("-%d", os.Getpid()))
	_ = p.cache.RemoveAll(tmp)
	if err := p.cache.Mkdir(tmp, 0o755); err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		_ = p.cache.RemoveAll(tmp)
		return "", err
	}
	dir, err := p.cache.Open(tmp)
	if err != nil {
		return fail(err)
	}
	defer dir.Close()
	for _, l := range members {
		if err := p.place(l, dir, l.name, path.Join(tmp, l.name)); err != nil {
			return fail(fmt.Errorf("linking %s: %w", l.rel, err))
		}
	}
	for _, x := range extras {
		if err := p.cache.MkdirAll(path.Join(tmp, path.Dir(x.name)), 0o755); err != nil {
			return fail(err)
		}
		if err := p.place(x.l, dir, x.name, path.Join(tmp, x.name)); err != nil {
			return fail(fmt.Errorf("linking %s as %s: %w", x.l.rel, x.name, err))
		}
	}
	if kind != inventory.Binary {
		for _, l := range members {
			if dev, ok := inventory.DevLink(l.name); ok && !slices.ContainsFunc(members, func(m *lib) bool { return m.name == dev }) {
				// Relative, so that it resolves inside the container.
				if err := p.cache.Symlink(l.name, path.Join(tmp, dev)); err != nil {
					return fail(fmt.Errorf("linking %s to %s: %w", dev, l.name, err))
				}
			}
		}
	}
	if err := p.cache.Chmod(tmp, 0o755); err != nil {
		return fail(err)
	}
	if err := p.cache.Rename(tmp, final); err != nil {
		_ = p.cache.RemoveAll(tmp)
		if fi, err2 := p.cache.Lstat(final); err2 == nil && fi.IsDir() {
			return final, nil // another plugin made it first
		}
		return "", err
	}
	return final, nil
}

// makeVersionDir makes the version's directory with its marker.
func (p *placer) makeVersionDir() error {
	if err := p.cache.MkdirAll(p.version, 0o755); err != nil {
		return err
	}
	m := path.Join(p.version, VersionMarker)
	if _, err := p.cache.Lstat(m); err == nil {
		return nil
	}
	return p.cache.WriteFile(m, []byte(p.version+"\n"), 0o444)
}

// place puts l at rel (in dir, a temporary directory): a hard link to the
// driver's file when the cache is in its mount, else a hard link to the
// cache's own copy of it.
func (p *placer) place(l *lib, dir *os.File, name, rel string) error {
	if !p.noLink {
		// The opened file itself, through /proc: the inode discovery
		// checked, and no capability needed (unlike AT_EMPTY_PATH).
		err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", l.file.Fd()), int(dir.Fd()), name, unix.AT_SYMLINK_FOLLOW)
		if err == nil {
			return nil
		}
		if errors.Is(err, unix.EEXIST) {
			return err
		}
		p.noLink, p.c.LinkError = true, err
	}
	stored, err := p.store(l)
	if err != nil {
		return err
	}
	return p.cache.Link(stored, rel)
}

// store returns the cache's own copy of l (relative to the cache), made
// when missing: a reflink where the file system can, else a copy.
func (p *placer) store(l *lib) (string, error) {
	sum := sha256.Sum256([]byte(l.id))
	dir := path.Join(p.version, storeDir)
	final := path.Join(dir, hex.EncodeToString(sum[:16]))
	if fi, err := p.cache.Lstat(final); err == nil && fi.Mode().IsRegular() && fi.Size() == l.size {
		return final, nil
	}
	if err := p.cache.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp := path.Join(dir, fmt.Sprintf(".tmp-%s-%d", path.Base(final), os.Getpid()))
	_ = p.cache.Remove(tmp)
	out, err := p.cache.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, l.mode&0o555|0o444)
	if err != nil {
		return "", err
	}
	cloned, err := copyFile(out, l.file, l.size)
	if err == nil {
		err = out.Sync()
	}
	if err2 := out.Close(); err == nil {
		err = err2
	}
	if err == nil {
		err = p.cache.Rename(tmp, final)
	}
	if err != nil {
		_ = p.cache.Remove(tmp)
		return "", err
	}
	p.c.Stored++
	p.c.StoredBytes += l.size
	if cloned {
		p.c.Cloned++
	}
	return final, nil
}

// copyFile copies size bytes of src into the empty dst: a reflink
// (FICLONE) when the file system shares blocks between files, else a copy
// (copy_file_range, which the kernel may still make a reflink).
func copyFile(dst, src *os.File, size int64) (cloned bool, err error) {
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err == nil {
		return true, nil
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return false, err
	}
	// A LimitedReader of an *os.File: io.Copy uses copy_file_range.
	n, err := io.Copy(dst, &io.LimitedReader{R: src, N: size})
	if err == nil && n != size {
		err = fmt.Errorf("%s: copied %d bytes of %d", src.Name(), n, size)
	}
	return false, err
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
// It removes only what nri-gpu made: a cache directory without its
// marker is left alone (an error), and so is anything in it without a
// marker, or not named as nri-gpu names what it makes. It returns the
// runtime-view paths it removed.
func Clean(o Options, current string, inUse func(dir string) bool) ([]string, error) {
	cache, err := openCache(o, false)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer cache.Close()
	if fi, err := cache.Lstat(RootMarker); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s has no %s marker: not nri-gpu's, left alone", o.mountDir(), RootMarker)
	}
	versions, err := readDir(cache, ".")
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, v := range versions {
		if !isVersionDir(cache, v) {
			continue
		}
		entries, err := readDir(cache, v)
		if err != nil {
			continue
		}
		used, foreign := false, false
		var ours []string
		for _, d := range entries {
			p := path.Join(v, d)
			switch {
			case strings.HasPrefix(d, ".tmp-"):
				_ = cache.RemoveAll(p)
			case d == storeDir:
				ours = append(ours, p)
				cleanStore(cache, p)
			case setDirName.MatchString(d):
				ours = append(ours, p)
				dir := filepath.Join(o.DriverRoot, o.Dir, p)
				used = used || inUse(dir) || inUse(filepath.Join(dir, ProfileFile))
			case d != VersionMarker:
				foreign = true
			}
		}
		if v == current || used || foreign {
			continue
		}
		for _, p := range ours {
			if err := cache.RemoveAll(p); err != nil {
				return removed, err
			}
		}
		if err := cache.Remove(path.Join(v, VersionMarker)); err != nil {
			return removed, err
		}
		if err := cache.Remove(v); err != nil {
			return removed, err
		}
		removed = append(removed, filepath.Join(o.DriverRoot, o.Dir, v))
	}
	return removed, nil
}

// cleanStore removes leftovers of interrupted copies from a store.
func cleanStore(cache *os.Root, dir string) {
	names, err := readDir(cache, dir)
	if err != nil {
		return
	}
	for _, n := range names {
		if strings.HasPrefix(n, ".tmp-") {
			_ = cache.Remove(path.Join(dir, n))
		}
	}
}

func readDir(root *os.Root, dir string) ([]string, error) {
	f, err := root.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}
