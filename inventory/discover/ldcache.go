package discover

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// LDCacheEntry is one library of the dynamic loader's cache: the name the
// loader looks up (usually a SONAME) and the path it resolves to.
type LDCacheEntry struct {
	Name  string
	Path  string
	Flags int32
}

// ld.so.cache flags, from glibc's dl-cache.h.
const (
	ldFlagTypeMask     = 0x00ff
	ldFlagELFLibc6     = 0x0003
	ldFlagRequiredMask = 0xff00
	ldFlagX8664Lib64   = 0x0300
	ldFlagAArch64Lib64 = 0x0a00
)

// Is64Bit reports whether the entry is a 64-bit (x86-64 or aarch64) glibc
// library.
func (e LDCacheEntry) Is64Bit() bool {
	if e.Flags&ldFlagTypeMask != ldFlagELFLibc6 {
		return false
	}
	arch := e.Flags & ldFlagRequiredMask
	return arch == ldFlagX8664Lib64 || arch == ldFlagAArch64Lib64
}

// Is32Bit reports whether the entry is a 32-bit glibc library (the i386
// libraries of compat32).
func (e LDCacheEntry) Is32Bit() bool {
	return e.Flags&ldFlagTypeMask == ldFlagELFLibc6 && e.Flags&ldFlagRequiredMask == 0
}

const (
	ldMagicOld      = "ld.so-1.7.0"
	ldMagicNew      = "glibc-ld.so.cache1.1"
	ldOldHeaderSize = 16 // magic (11) + padding (1) + nlibs
	ldOldEntrySize  = 12
	ldNewHeaderSize = 48
	ldNewEntrySize  = 24
	// ldMaxEntries bounds the entries accepted from a cache, so that a
	// corrupt count cannot make the reader allocate without limit.
	ldMaxEntries = 1 << 20
)

// ParseLDCache parses the contents of an ld.so.cache file in the old
// ("ld.so-1.7.0", possibly followed by a new-format part) or new
// ("glibc-ld.so.cache1.1") format. It never reads past data and allocates at
// most in proportion to len(data).
func ParseLDCache(data []byte) ([]LDCacheEntry, error) {
	if bytes.HasPrefix(data, []byte(ldMagicNew)) {
		return parseLDCacheNew(data, 0)
	}
	if !bytes.HasPrefix(data, []byte(ldMagicOld)) {
		return nil, errors.New("ld.so.cache: unknown format (bad magic)")
	}
	if len(data) < ldOldHeaderSize {
		return nil, errors.New("ld.so.cache: truncated header")
	}
	n := binary.LittleEndian.Uint32(data[12:16])
	end := uint64(ldOldHeaderSize) + uint64(n)*ldOldEntrySize
	if n > ldMaxEntries || end > uint64(len(data)) {
		return nil, fmt.Errorf("ld.so.cache: %d entries do not fit in %d bytes", n, len(data))
	}
	// A new-format cache follows the old entries, 8-byte aligned, in the
	// compatibility format that glibc wrote until 2.32; prefer it.
	newOff := (end + 7) &^ 7
	if newOff < uint64(len(data)) && bytes.HasPrefix(data[newOff:], []byte(ldMagicNew)) {
		return parseLDCacheNew(data, int(newOff))
	}
	return readLDEntries(data[ldOldHeaderSize:end], ldOldEntrySize, data[end:])
}

// parseLDCacheNew parses a new-format cache whose header starts at off;
// string offsets are relative to that header.
func parseLDCacheNew(data []byte, off int) ([]LDCacheEntry, error) {
	base := data[off:]
	if len(base) < ldNewHeaderSize {
		return nil, errors.New("ld.so.cache: truncated header")
	}
	if endian := base[28]; endian == 3 {
		return nil, errors.New("ld.so.cache: big-endian cache is not supported")
	}
	n := binary.LittleEndian.Uint32(base[20:24])
	end := uint64(ldNewHeaderSize) + uint64(n)*ldNewEntrySize
	if n > ldMaxEntries || end > uint64(len(base)) {
		return nil, fmt.Errorf("ld.so.cache: %d entries do not fit in %d bytes", n, len(base))
	}
	return readLDEntries(base[ldNewHeaderSize:end], ldNewEntrySize, base)
}

// readLDEntries reads the entries of a cache, each size bytes and starting
// with its flags, key and value (both offsets into strs), as both formats
// lay them out.
//
// The string table is copied once and names and paths are slices of that
// copy: entries that all point at one long string must not each allocate
// it (a cache of n bytes could otherwise cost n² bytes).
func readLDEntries(table []byte, size int, strs []byte) ([]LDCacheEntry, error) {
	all := string(strs)
	entries := make([]LDCacheEntry, 0, len(table)/size)
	for i := 0; i+size <= len(table); i += size {
		e := table[i : i+size]
		flags := int32(binary.LittleEndian.Uint32(e[0:4]))
		key, err := cString(all, uint64(binary.LittleEndian.Uint32(e[4:8])))
		if err != nil {
			return nil, fmt.Errorf("ld.so.cache: entry %d: %w", i/size, err)
		}
		val, err := cString(all, uint64(binary.LittleEndian.Uint32(e[8:12])))
		if err != nil {
			return nil, fmt.Errorf("ld.so.cache: entry %d: %w", i/size, err)
		}
		entries = append(entries, LDCacheEntry{Name: key, Path: val, Flags: flags})
	}
	return entries, nil
}

// cString returns the NUL-terminated string at off in b, without copying.
func cString(b string, off uint64) (string, error) {
	if off >= uint64(len(b)) {
		return "", fmt.Errorf("string offset %d out of range", off)
	}
	s := b[off:]
	i := strings.IndexByte(s, 0)
	if i < 0 {
		return "", fmt.Errorf("string at offset %d is not terminated", off)
	}
	return s[:i], nil
}
