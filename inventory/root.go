package inventory

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
)

// maxSymlinks bounds the symbolic links followed while resolving one path,
// as the kernel does (ELOOP).
const maxSymlinks = 40

// errEscapes is returned when a path leaves its root through "..".
var errEscapes = errors.New("path escapes the root")

// resolveInRoot returns the path, relative to root and free of symbolic
// links, that name (relative to root) refers to. Absolute link targets are
// taken relative to root, as with openat2's RESOLVE_IN_ROOT: the driver
// root is the file system the driver was installed into. A ".." that would
// leave the root is an error. Every lookup goes through root, so a link
// cannot reach outside it even if the tree changes meanwhile.
func resolveInRoot(root *os.Root, name string) (string, error) {
	var done []string // resolved components
	todo := splitPath(name)
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case ".":
			continue
		case "..":
			if len(done) == 0 {
				return "", errEscapes
			}
			done = done[:len(done)-1]
			continue
		}
		p := path.Join(append(done, c)...)
		fi, err := root.Lstat(p)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			done = append(done, c)
			continue
		}
		links++
		if links > maxSymlinks {
			return "", fmt.Errorf("%s: too many levels of symbolic links", name)
		}
		target, err := root.Readlink(p)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			done = done[:0]
		}
		todo = append(splitPath(target), todo...)
	}
	if len(done) == 0 {
		return ".", nil
	}
	return path.Join(done...), nil
}

// splitPath splits a slash-separated path into its non-empty components.
func splitPath(p string) []string {
	parts := strings.Split(p, "/")
	out := parts[:0]
	for _, s := range parts {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// elfInfo is what discovery needs to know of a shared library.
type elfInfo struct {
	SONAME string
	Is64   bool
}

// readELF reads the SONAME and class of the regular file at rel (relative
// to root and already resolved).
func readELF(root *os.Root, rel string) (elfInfo, error) {
	f, err := root.Open(rel)
	if err != nil {
		return elfInfo{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return elfInfo{}, err
	}
	if !fi.Mode().IsRegular() {
		return elfInfo{}, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return elfInfo{}, errors.New("not an ELF file")
	}
	defer ef.Close()
	if ef.Type != elf.ET_DYN {
		return elfInfo{}, fmt.Errorf("not a shared object (%s)", ef.Type)
	}
	names, err := ef.DynString(elf.DT_SONAME)
	if err != nil {
		return elfInfo{}, fmt.Errorf("reading SONAME: %w", err)
	}
	if len(names) == 0 || names[0] == "" {
		return elfInfo{}, errors.New("no SONAME")
	}
	return elfInfo{SONAME: names[0], Is64: ef.Class == elf.ELFCLASS64}, nil
}
