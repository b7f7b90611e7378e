package discover

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
)

// maxSymlinks bounds the symbolic links followed while resolving one path,
// as the kernel does (ELOOP).
const maxSymlinks = 40

// maxLookups bounds the components looked up while resolving one path: a
// driver file's path takes fewer than 20, while 40 links of 2,000
// components each ("x/x/.../x") could take 80,000 and, before the bound,
// copied the rest of the path at each link.
const maxLookups = 256

// errEscapes is returned when a path leaves its root through "..".
var errEscapes = errors.New("path escapes the root")

// resolveInRoot returns the path, relative to root and free of symbolic
// links, that name (relative to root) refers to. Absolute link targets are
// taken relative to root, as with openat2's RESOLVE_IN_ROOT: the driver
// root is the file system the driver was installed into. A ".." that would
// leave the root is an error. Every lookup goes through root, so a link
// cannot reach outside it even if the tree changes meanwhile.
func resolveInRoot(root *os.Root, name string) (string, error) {
	var done []string       // resolved components
	todo := splitPath(name) // components left, the next one last
	slices.Reverse(todo)
	links, lookups := 0, 0
	for len(todo) > 0 {
		c := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
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
		if lookups++; lookups > maxLookups {
			return "", fmt.Errorf("resolving takes more than %d lookups", maxLookups)
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
			return "", fmt.Errorf("too many levels of symbolic links")
		}
		target, err := root.Readlink(p)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			done = done[:0]
		}
		next := splitPath(target)
		slices.Reverse(next)
		todo = append(todo, next...)
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

// Bounds of what is read of a shared object to find its SONAME: the ELF
// header, the section headers up to the first SHT_DYNAMIC one and the
// header of its string table, the .dynamic section up to DT_SONAME, and
// the SONAME itself; each read is bounded, so reading any file costs at
// most a few KiB of memory and, in the worst case (65,535 section
// headers), 4 MiB of reads. debug/elf, used before, reads whole sections
// whatever their size: a sparse file with a 256 MiB .dynamic section (a
// few KiB of disk) cost discovery 1.3 GiB.
const (
	// maxDynamic bounds the .dynamic section: real ones are a few hundred
	// bytes to a few KiB (30 to 60 entries of 16 bytes); a larger one is
	// refused.
	maxDynamic = 64 << 10
	// maxSONAME bounds the SONAME: it is a file name, at most NAME_MAX
	// (255) bytes; a longer one is refused.
	maxSONAME = 255
	// elfChunk is the most read at once of the section headers or of the
	// .dynamic section.
	elfChunk = 4096
)

// parseELF reads the SONAME and class of the ELF shared object r of the
// given size, as the DT_SONAME entry of its first SHT_DYNAMIC section (up
// to DT_NULL) and that section's string table say (debug/elf's DynString
// reads the same). Every read lies within size and is bounded (see
// maxDynamic): a length field in the file cannot make it read or allocate
// more.
func parseELF(r io.ReaderAt, size int64) (elfInfo, error) {
	f, err := readELFHeader(r, size)
	if err != nil {
		return elfInfo{}, err
	}
	buf := make([]byte, elfChunk)
	dyn, str, err := f.dynamic(buf)
	if err != nil {
		return elfInfo{}, err
	}
	off, err := f.soname(buf, dyn)
	if err != nil {
		return elfInfo{}, err
	}
	name, err := f.name(buf, str, off)
	if err != nil {
		return elfInfo{}, err
	}
	return elfInfo{SONAME: name, Is64: f.is64}, nil
}

// elfFile is an ELF shared object whose file header was read: where its
// section headers are and how its numbers are written.
type elfFile struct {
	r     io.ReaderAt
	size  int64
	bo    binary.ByteOrder
	is64  bool
	shoff uint64
	shnum uint16
	// shentsize is the size of a section header: 64 or 40 bytes.
	shentsize uint16
}

// elfSection is what parseELF reads of a section header.
type elfSection struct {
	typ, flags, link uint32
	off, size        uint64
}

// within reports whether n bytes at off lie within the file.
func (f *elfFile) within(off, n uint64) bool { return off <= uint64(f.size) && n <= uint64(f.size)-off }

// readELFHeader reads and checks the ELF file header of r: an ELF shared
// object of a known class and byte order, with section headers of the
// class's size that lie within the file.
func readELFHeader(r io.ReaderAt, size int64) (*elfFile, error) {
	var h [64]byte
	if size < 52 || readFull(r, h[:min(size, 64)], 0) != nil || string(h[:4]) != elf.ELFMAG {
		return nil, errors.New("not an ELF file")
	}
	f := &elfFile{r: r, size: size}
	switch elf.Data(h[elf.EI_DATA]) {
	case elf.ELFDATA2LSB:
		f.bo = binary.LittleEndian
	case elf.ELFDATA2MSB:
		f.bo = binary.BigEndian
	default:
		return nil, errors.New("not an ELF file (bad byte order)")
	}
	if v := elf.Version(h[elf.EI_VERSION]); v != elf.EV_CURRENT {
		return nil, fmt.Errorf("not an ELF file (version %d)", v)
	}
	var shentsize uint16
	f.is64 = elf.Class(h[elf.EI_CLASS]) == elf.ELFCLASS64
	switch {
	case f.is64 && size >= 64:
		f.shoff, shentsize, f.shnum = f.bo.Uint64(h[40:]), f.bo.Uint16(h[58:]), f.bo.Uint16(h[60:])
	case elf.Class(h[elf.EI_CLASS]) == elf.ELFCLASS32:
		f.shoff, shentsize, f.shnum = uint64(f.bo.Uint32(h[32:])), f.bo.Uint16(h[46:]), f.bo.Uint16(h[48:])
	default:
		return nil, errors.New("not an ELF file (bad class)")
	}
	if t := elf.Type(f.bo.Uint16(h[16:])); t != elf.ET_DYN {
		return nil, fmt.Errorf("not a shared object (%s)", t)
	}
	if f.shnum == 0 {
		if f.shoff != 0 {
			return nil, errors.New("ELF extended section numbering is not supported")
		}
		return nil, errors.New("no SONAME")
	}
	f.shentsize = 40
	if f.is64 {
		f.shentsize = 64
	}
	if shentsize != f.shentsize {
		return nil, fmt.Errorf("ELF section header size %d (want %d)", shentsize, f.shentsize)
	}
	if !f.within(f.shoff, uint64(f.shentsize)*uint64(f.shnum)) {
		return nil, errors.New("ELF section headers lie outside the file")
	}
	return f, nil
}

// section decodes the section header at the start of b.
func (f *elfFile) section(b []byte) elfSection {
	bo := f.bo
	if f.is64 {
		return elfSection{typ: bo.Uint32(b[4:]), flags: uint32(bo.Uint64(b[8:])), off: bo.Uint64(b[24:]), size: bo.Uint64(b[32:]), link: bo.Uint32(b[40:])}
	}
	return elfSection{typ: bo.Uint32(b[4:]), flags: bo.Uint32(b[8:]), off: uint64(bo.Uint32(b[16:])), size: uint64(bo.Uint32(b[20:])), link: bo.Uint32(b[24:])}
}

// dynamic returns the first SHT_DYNAMIC section, its headers read
// elfChunk at a time into buf, and its string table, both checked to lie
// within the file, uncompressed, the section within maxDynamic.
func (f *elfFile) dynamic(buf []byte) (dyn, str elfSection, err error) {
	want := int(f.shentsize)
	found := false
	per := elfChunk / want
	for i := 0; i < int(f.shnum) && !found; i += per {
		n := min(per, int(f.shnum)-i)
		if readFull(f.r, buf[:n*want], int64(f.shoff)+int64(i)*int64(want)) != nil {
			return dyn, str, errors.New("ELF section headers unreadable")
		}
		for j := range n {
			if s := f.section(buf[j*want:]); elf.SectionType(s.typ) == elf.SHT_DYNAMIC {
				dyn, found = s, true
				break
			}
		}
	}
	switch {
	case !found:
		return dyn, str, errors.New("no SONAME")
	case !f.within(dyn.off, dyn.size):
		return dyn, str, errors.New("ELF .dynamic section lies outside the file")
	case dyn.size > maxDynamic:
		return dyn, str, fmt.Errorf("ELF .dynamic section of %d bytes, more than the %d read", dyn.size, maxDynamic)
	case dyn.flags&uint32(elf.SHF_COMPRESSED) != 0:
		return dyn, str, errors.New("ELF .dynamic section is compressed")
	}
	if dyn.link == 0 || dyn.link >= uint32(f.shnum) || readFull(f.r, buf[:want], int64(f.shoff)+int64(dyn.link)*int64(want)) != nil {
		return dyn, str, errors.New("ELF .dynamic section has no string table")
	}
	str = f.section(buf[:want])
	if elf.SectionType(str.typ) != elf.SHT_STRTAB || str.flags&uint32(elf.SHF_COMPRESSED) != 0 || !f.within(str.off, str.size) {
		return dyn, str, errors.New("ELF .dynamic section has no string table")
	}
	return dyn, str, nil
}

// soname returns the string table offset of DT_SONAME in dyn, reading the
// entries elfChunk at a time into buf, up to DT_NULL.
func (f *elfFile) soname(buf []byte, dyn elfSection) (uint64, error) {
	entsize := uint64(8)
	if f.is64 {
		entsize = 16
	}
	for off := uint64(0); off+entsize <= dyn.size; off += elfChunk {
		n := min(elfChunk, (dyn.size-off)/entsize*entsize)
		if readFull(f.r, buf[:n], int64(dyn.off+off)) != nil {
			return 0, errors.New("ELF .dynamic section unreadable")
		}
		for e := buf[:n]; len(e) > 0; e = e[entsize:] {
			var tag, val uint64
			if f.is64 {
				tag, val = f.bo.Uint64(e), f.bo.Uint64(e[8:])
			} else {
				tag, val = uint64(f.bo.Uint32(e)), uint64(f.bo.Uint32(e[4:]))
			}
			if elf.DynTag(tag) == elf.DT_NULL {
				return 0, errors.New("no SONAME")
			}
			if elf.DynTag(tag) == elf.DT_SONAME {
				return val, nil
			}
		}
	}
	return 0, errors.New("no SONAME")
}

// name reads the NUL-terminated name at offset off of the string table
// str into buf: at most maxSONAME bytes.
func (f *elfFile) name(buf []byte, str elfSection, off uint64) (string, error) {
	if off >= str.size {
		return "", fmt.Errorf("SONAME at offset %d outside its string table", off)
	}
	name := buf[:min(maxSONAME+1, str.size-off)]
	if readFull(f.r, name, int64(str.off+off)) != nil {
		return "", errors.New("ELF string table unreadable")
	}
	end := bytes.IndexByte(name, 0)
	switch {
	case end < 0 && uint64(len(name)) == str.size-off:
		return "", errors.New("SONAME not terminated")
	case end < 0:
		return "", fmt.Errorf("SONAME longer than %d bytes", maxSONAME)
	case end == 0:
		return "", errors.New("no SONAME")
	}
	return string(name[:end]), nil
}

// readFull reads len(b) bytes at off, or fails.
func readFull(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return err
}
