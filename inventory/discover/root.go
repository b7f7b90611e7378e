package discover

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
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

// openNoBlock opens name under root for reading without blocking: a FIFO
// planted where a driver or procfs file is expected would otherwise block
// discovery forever in open(2). Callers check the file's type.
func openNoBlock(root *os.Root, name string) (*os.File, error) {
	return root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}

// elfInfo is what discovery needs to know of a shared library.
type elfInfo struct {
	SONAME string
	Is64   bool
}

// readELF reads the SONAME and class of the regular file at rel (relative
// to root and already resolved).
func readELF(root *os.Root, rel string) (elfInfo, error) {
	f, err := openNoBlock(root, rel)
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
	return parseELF(f, fi.Size())
}

// parseELF reads the SONAME and class of the ELF shared object r of the
// given size. The header's tables and every section must lie within the
// file before debug/elf reads them: debug/elf sizes its buffers by those
// fields (up to 10 MiB each) whatever the file's real size, so without the
// check a 64-byte file could make discovery allocate megabytes.
func parseELF(r io.ReaderAt, size int64) (elfInfo, error) {
	if err := checkELFBounds(r, size); err != nil {
		return elfInfo{}, err
	}
	ef, err := elf.NewFile(r)
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

// checkELFBounds checks that the program and section header tables and the
// contents of every section lie within the file's size.
func checkELFBounds(r io.ReaderAt, size int64) error {
	var h [64]byte
	if size < 52 {
		return errors.New("not an ELF file")
	}
	if _, err := r.ReadAt(h[:min(size, 64)], 0); err != nil || string(h[:4]) != elf.ELFMAG {
		return errors.New("not an ELF file")
	}
	var bo binary.ByteOrder
	switch elf.Data(h[elf.EI_DATA]) {
	case elf.ELFDATA2LSB:
		bo = binary.LittleEndian
	case elf.ELFDATA2MSB:
		bo = binary.BigEndian
	default:
		return errors.New("not an ELF file (bad byte order)")
	}
	var phoff, shoff uint64
	var phentsize, phnum, shentsize, shnum uint16
	is64 := elf.Class(h[elf.EI_CLASS]) == elf.ELFCLASS64
	switch {
	case is64 && size >= 64:
		phoff, shoff = bo.Uint64(h[32:]), bo.Uint64(h[40:])
		phentsize, phnum, shentsize, shnum = bo.Uint16(h[54:]), bo.Uint16(h[56:]), bo.Uint16(h[58:]), bo.Uint16(h[60:])
	case elf.Class(h[elf.EI_CLASS]) == elf.ELFCLASS32:
		phoff, shoff = uint64(bo.Uint32(h[28:])), uint64(bo.Uint32(h[32:]))
		phentsize, phnum, shentsize, shnum = bo.Uint16(h[42:]), bo.Uint16(h[44:]), bo.Uint16(h[46:]), bo.Uint16(h[48:])
	default:
		return errors.New("not an ELF file (bad class)")
	}
	within := func(off, n uint64) bool { return off <= uint64(size) && n <= uint64(size)-off }
	if !within(phoff, uint64(phentsize)*uint64(phnum)) || !within(shoff, uint64(shentsize)*uint64(shnum)) {
		return errors.New("ELF header tables lie outside the file")
	}
	if shnum == 0 && shoff != 0 {
		return errors.New("ELF extended section numbering is not supported")
	}
	want := uint16(40)
	if is64 {
		want = 64
	}
	if shnum > 0 && shentsize != want {
		return fmt.Errorf("ELF section header size %d (want %d)", shentsize, want)
	}
	sh := make([]byte, want)
	for i := uint64(0); i < uint64(shnum); i++ {
		if _, err := r.ReadAt(sh, int64(shoff+i*uint64(want))); err != nil {
			return errors.New("ELF section headers unreadable")
		}
		var typ uint32
		var off, n uint64
		if is64 {
			typ, off, n = bo.Uint32(sh[4:]), bo.Uint64(sh[24:]), bo.Uint64(sh[32:])
		} else {
			typ, off, n = bo.Uint32(sh[4:]), uint64(bo.Uint32(sh[16:])), uint64(bo.Uint32(sh[20:]))
		}
		if elf.SectionType(typ) != elf.SHT_NOBITS && !within(off, n) {
			return fmt.Errorf("ELF section %d lies outside the file", i)
		}
	}
	return nil
}
