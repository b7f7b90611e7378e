package discover

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
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
	// ldMaxEntries bounds the entries accepted from a cache. A real cache
	// lists a few thousand libraries (a desktop with every package of its
	// distribution installed, about 5,000); 65,536 leaves a wide margin
	// and keeps the parsed entries under 3 MiB.
	ldMaxEntries = 1 << 16
	// ldMaxString bounds a name or path in the cache: PATH_MAX (4096)
	// with its terminating NUL, the longest path the loader could open.
	// Longer strings are refused rather than cut.
	ldMaxString = 4095
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
	if end > uint64(len(data)) {
		return nil, fmt.Errorf("ld.so.cache: %d entries do not fit in %d bytes", n, len(data))
	}
	if n > ldMaxEntries {
		return nil, fmt.Errorf("ld.so.cache: %d entries, more than the %d accepted", n, ldMaxEntries)
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
	if end > uint64(len(base)) {
		return nil, fmt.Errorf("ld.so.cache: %d entries do not fit in %d bytes", n, len(base))
	}
	if n > ldMaxEntries {
		return nil, fmt.Errorf("ld.so.cache: %d entries, more than the %d accepted", n, ldMaxEntries)
	}
	return readLDEntries(base[ldNewHeaderSize:end], ldNewEntrySize, base)
}

// readLDEntries reads the entries of a cache, each size bytes and starting
// with its flags, key and value (both offsets into strs), as both formats
// lay them out.
//
// Its cost is linear in the cache's size whatever the entries point at.
// The string table is copied once and names and paths are slices of that
// copy: entries that all point at one long string must not each allocate
// it (a cache of n bytes could otherwise cost n² bytes). And the table is
// scanned once: the string offsets are sorted, and the end of the string
// at an offset that lies within the previous offset's string is that
// string's end, so no byte is scanned twice (scanning each entry's string
// from its offset cost entries x string length, minutes for a cache of a
// few MiB).
func readLDEntries(table []byte, size int, strs []byte) ([]LDCacheEntry, error) {
	n := len(table) / size
	key := func(i int) uint32 { return binary.LittleEndian.Uint32(table[i*size+4:]) }
	val := func(i int) uint32 { return binary.LittleEndian.Uint32(table[i*size+8:]) }
	starts := make([]uint32, 0, 2*n)
	for i := range n {
		starts = append(starts, key(i), val(i))
	}
	slices.Sort(starts)
	starts = slices.Compact(starts)
	ends := make([]uint32, len(starts))
	end := -1 // where the last string scanned ends (its NUL)
	for j, o := range starts {
		if int64(o) > int64(end) {
			if int64(o) >= int64(len(strs)) {
				return nil, fmt.Errorf("ld.so.cache: entry %d: string offset %d out of range", entryOf(n, key, val, o), o)
			}
			window := strs[o:min(int64(o)+ldMaxString+1, int64(len(strs)))]
			k := bytes.IndexByte(window, 0)
			switch {
			case k < 0 && int64(o)+int64(len(window)) == int64(len(strs)):
				return nil, fmt.Errorf("ld.so.cache: entry %d: string at offset %d is not terminated", entryOf(n, key, val, o), o)
			case k < 0:
				return nil, fmt.Errorf("ld.so.cache: entry %d: string at offset %d is longer than %d bytes", entryOf(n, key, val, o), o, ldMaxString)
			}
			end = int(o) + k
		}
		ends[j] = uint32(end)
	}

	all := string(strs)
	str := func(o uint32) string {
		j, _ := slices.BinarySearch(starts, o)
		return all[o:ends[j]]
	}
	entries := make([]LDCacheEntry, 0, n)
	for i := range n {
		flags := int32(binary.LittleEndian.Uint32(table[i*size:]))
		entries = append(entries, LDCacheEntry{Name: str(key(i)), Path: str(val(i)), Flags: flags})
	}
	return entries, nil
}

// entryOf returns the index of the first of the n entries whose key or
// value is the offset o, for an error message.
func entryOf(n int, key, val func(int) uint32, o uint32) int {
	for i := range n {
		if key(i) == o || val(i) == o {
			return i
		}
	}
	return -1
}
