package discover

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// The hostile files of the driver root that these tests plant, and the
// figures docs/benchmarks.md reports for them, come from here:
//
//	go test -run '^$' -bench Hostile -benchtime 1x ./inventory/discover/

// hostileLDCache returns a new-format ld.so.cache of n entries whose names
// and paths point at offsets spread over one string of strLen bytes (no
// NUL before its end): a reader that scans each entry's string from its
// offset does n x strLen work. name, when set, replaces the long string as
// every entry's name.
func hostileLDCache(n, strLen int) []byte {
	strOff := ldNewHeaderSize + n*ldNewEntrySize
	b := make([]byte, strOff+strLen+1)
	copy(b, ldMagicNew)
	binary.LittleEndian.PutUint32(b[20:], uint32(n))
	binary.LittleEndian.PutUint32(b[24:], uint32(strLen+1))
	for i := range n {
		e := b[ldNewHeaderSize+i*ldNewEntrySize:]
		off := uint32(strOff + i%max(strLen/2, 1))
		binary.LittleEndian.PutUint32(e[0:], ldFlagELFLibc6|ldFlagX8664Lib64)
		binary.LittleEndian.PutUint32(e[4:], off)
		binary.LittleEndian.PutUint32(e[8:], off)
	}
	for i := strOff; i < strOff+strLen; i++ {
		b[i] = 'a'
	}
	return b
}

// newLDCache returns a new-format ld.so.cache of n 64-bit entries over
// the string table strs; entry i names the key at strs offset 0 and the
// value at strs offset value(i).
func newLDCache(n int, strs string, value func(i int) int) []byte {
	strOff := ldNewHeaderSize + n*ldNewEntrySize
	b := make([]byte, strOff+len(strs))
	copy(b, ldMagicNew)
	binary.LittleEndian.PutUint32(b[20:], uint32(n))
	binary.LittleEndian.PutUint32(b[24:], uint32(len(strs)))
	for i := range n {
		e := b[ldNewHeaderSize+i*ldNewEntrySize:]
		binary.LittleEndian.PutUint32(e[0:], ldFlagELFLibc6|ldFlagX8664Lib64)
		binary.LittleEndian.PutUint32(e[4:], uint32(strOff))
		binary.LittleEndian.PutUint32(e[8:], uint32(strOff+value(i)))
	}
	copy(b[strOff:], strs)
	return b
}

// bigLDCache returns a well-formed new-format ld.so.cache of n entries
// that all name one short, unrelated library: big, but cheap to scan.
func bigLDCache(n int) []byte {
	const key = "libunrelated.so.1\x00"
	return newLDCache(n, key+"/usr/lib64/libunrelated.so.1\x00", func(int) int { return len(key) })
}

// loopingLDCache returns a new-format ld.so.cache of n entries, each
// naming libcuda.so.1 and a different path "x/x/.../x/y" of up to 4 KiB:
// where x links to ".", each path costs 40 links to resolve before it
// fails, and a warning that holds it.
func loopingLDCache(n int) []byte {
	const key = "libcuda.so.1\x00"
	long := strings.Repeat("x/", 2000) + "y\x00"
	return newLDCache(n, key+strings.Repeat(long, n/2000+1), func(i int) int {
		return len(key) + (i/2000)*len(long) + 2*(i%2000)
	})
}

// elfWithDynamic returns the head of a 64-bit little-endian ELF shared
// object whose .dynamic section (DT_SONAME, then DT_NULL) is dynSize bytes
// and whose .dynstr ("\x00"+soname+"\x00") follows it, and the total size
// of the file. Everything past the head is zeros except .dynstr, which
// lies at the returned offset: written with os.Truncate, a file of any
// dynSize costs a few KiB of disk.
func elfWithDynamic(dynSize uint64, soname string) (head []byte, strOff uint64, strtab []byte, size uint64) {
	const dynOff = 4096
	strtab = []byte("\x00" + soname + "\x00")
	strOff = dynOff + dynSize
	size = strOff + uint64(len(strtab))
	h := make([]byte, dynOff+32)
	copy(h, "\x7fELF\x02\x01\x01")
	le := binary.LittleEndian
	le.PutUint16(h[16:], 3)  // ET_DYN
	le.PutUint16(h[18:], 62) // EM_X86_64
	le.PutUint32(h[20:], 1)  // EV_CURRENT
	le.PutUint64(h[40:], 64) // e_shoff
	le.PutUint16(h[52:], 64) // e_ehsize
	le.PutUint16(h[58:], 64) // e_shentsize
	le.PutUint16(h[60:], 3)  // e_shnum: null, .dynamic, .dynstr
	sh := func(i int, typ uint32, off, n uint64, link uint32, entsize uint64) {
		s := h[64+64*i:]
		le.PutUint32(s[4:], typ)
		le.PutUint64(s[24:], off)
		le.PutUint64(s[32:], n)
		le.PutUint32(s[40:], link)
		le.PutUint64(s[56:], entsize)
	}
	sh(1, 6, dynOff, dynSize, 2, 16)            // SHT_DYNAMIC
	sh(2, 3, strOff, uint64(len(strtab)), 0, 0) // SHT_STRTAB
	le.PutUint64(h[dynOff:], 14)                // DT_SONAME
	le.PutUint64(h[dynOff+8:], 1)               // at .dynstr offset 1
	le.PutUint64(h[dynOff+16:], 0)              // DT_NULL
	return h[:min(uint64(len(h)), size)], strOff, strtab, size
}

// writeSparseELF writes at p a shared object whose .dynamic section is
// dynSize bytes, sparse: it takes a few KiB of disk.
func writeSparseELF(t testing.TB, p string, dynSize uint64, soname string) {
	t.Helper()
	head, strOff, strtab, size := elfWithDynamic(dynSize, soname)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(head); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(strtab, int64(strOff)); err != nil {
		t.Fatal(err)
	}
}

// sparseReader reads data followed by zeros up to size, as a sparse file
// whose first len(data) bytes were written.
type sparseReader struct {
	data []byte
	size int64
}

func (r sparseReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, io.EOF
	}
	if off >= r.size {
		return 0, io.EOF
	}
	n := len(p)
	var err error
	if int64(n) > r.size-off {
		n, err = int(r.size-off), io.EOF
	}
	clear(p[:n])
	if off < int64(len(r.data)) {
		copy(p[:n], r.data[off:])
	}
	return n, err
}

// measured runs fn and returns the bytes it allocated and how long it
// took. A test that measures must not run in parallel with others.
func measured(fn func()) (alloc uint64, took time.Duration) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	fn()
	took = time.Since(start)
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, took
}

// discoverBounded runs a full discovery of root, failing the test when it
// allocates more than maxDiscoveryAlloc or does not finish within
// hostileTimeout.
func discoverBounded(t *testing.T, root string) *inventory.Snapshot {
	t.Helper()
	type result struct {
		s     *inventory.Snapshot
		err   error
		alloc uint64
		took  time.Duration
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.alloc, r.took = measured(func() {
			r.s, r.err = Discover(Options{HostRoot: root, DriverRoot: root})
		})
		done <- r
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Discover: %v", r.err)
		}
		t.Logf("discovery allocated %d bytes in %v", r.alloc, r.took)
		if r.alloc > maxDiscoveryAlloc {
			t.Errorf("discovery allocated %d bytes, more than %d", r.alloc, maxDiscoveryAlloc)
		}
		return r.s
	case <-time.After(hostileTimeout):
		t.Fatalf("discovery did not finish within %v", hostileTimeout)
	}
	return nil
}

const (
	// maxDiscoveryAlloc bounds what one discovery of a hostile root may
	// allocate in all: the DaemonSet's limit is 64 MiB (GOMEMLIMIT 48 MiB),
	// and a discovery of a well-formed node allocates about 1 MiB.
	maxDiscoveryAlloc = 16 << 20
	// hostileTimeout bounds one discovery of a hostile root. The bound is
	// the requirement itself (discovery has bounded cost), so it is a
	// wall-clock one, generous for a loaded CI machine: these discoveries
	// take a few tens of milliseconds here, where the unbounded readers
	// took minutes (see docs/benchmarks.md).
	hostileTimeout = 20 * time.Second
)

func hasWarning(s *inventory.Snapshot, parts ...string) bool {
	return slices.ContainsFunc(s.Warnings, func(w string) bool {
		for _, p := range parts {
			if !strings.Contains(w, p) {
				return false
			}
		}
		return true
	})
}

// TestDiscoverHostileLDCache plants ld.so.caches a hostile driver root
// could hold: one far larger than any real cache (cheap to parse, costly
// to hold), and one within the size limit whose entries all point into one
// long string. Discovery must refuse each with a warning naming the file,
// within bounded memory and time, and still find the driver's libraries in
// the usual directories.
func TestDiscoverHostileLDCache(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cache []byte
		want  string
	}{
		// 1M entries, 24 MiB: within the old 32 MiB limit.
		{"oversized", bigLDCache(1 << 20), "larger than"},
		// 30000 entries pointing into a 3 MiB string: each entry was
		// scanned to the string's end.
		{"long strings", hostileLDCache(30000, 3<<20), "longer than"},
		// 65536 different paths for libcuda.so.1 through a link loop:
		// each was resolved, and warned about with its 4 KiB path.
		{"many candidates", loopingLDCache(1 << 16), "more than 16 files for libcuda.so"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(n.Root, "etc/ld.so.cache"), tc.cache, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(".", filepath.Join(n.Root, "x")); err != nil {
				t.Fatal(err)
			}
			s := discoverBounded(t, n.Root)
			if len(s.Warnings) > maxWarnings+1 {
				t.Errorf("%d warnings, more than %d", len(s.Warnings), maxWarnings+1)
			}
			if !hasWarning(s, "ld.so.cache", tc.want) {
				t.Errorf("no warning naming ld.so.cache and containing %q in:\n%s", tc.want, strings.Join(s.Warnings, "\n"))
			}
			if !slices.ContainsFunc(s.Files, func(f inventory.DriverFile) bool { return f.Name == "libcuda.so.1" }) {
				t.Error("libcuda.so.1 missing: the usual directories must still be searched")
			}
		})
	}
}

// TestDiscoverSparseELF plants, as libcuda's real file, a sparse shared
// object whose .dynamic section is 256 MiB (a few KiB on disk). Discovery
// must refuse it with a warning naming the file, within bounded memory,
// and keep the rest of the driver.
func TestDiscoverSparseELF(t *testing.T) {
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(n.Root, n.LibDir, "libcuda.so."+n.DriverVersion)
	if err := os.Remove(real); err != nil {
		t.Fatal(err)
	}
	writeSparseELF(t, real, 256<<20, "libcuda.so.1")
	s := discoverBounded(t, n.Root)
	for _, f := range s.Files {
		if strings.HasPrefix(f.Name, "libcuda.so") {
			t.Errorf("file that should have been refused: %+v", f)
		}
	}
	if !hasWarning(s, "libcuda.so."+n.DriverVersion, ".dynamic") {
		t.Errorf("no warning naming libcuda.so.%s and its .dynamic section in:\n%s", n.DriverVersion, strings.Join(s.Warnings, "\n"))
	}
	if !slices.ContainsFunc(s.Files, func(f inventory.DriverFile) bool { return f.Name == "libnvidia-ml.so.1" }) {
		t.Error("libnvidia-ml.so.1 missing: the rest of the driver must still be found")
	}
}

// TestParseELFBoundedReads checks that parseELF reads a bounded amount of
// any file, whatever its sections claim: a .dynamic section of 4 KiB is
// read, one of 256 MiB or 4 GiB is refused, and the allocation stays under
// a fixed bound independent of the file's size.
func TestParseELFBoundedReads(t *testing.T) {
	for _, dynSize := range []uint64{4 << 10, 256 << 20, 4 << 30} {
		t.Run(fmt.Sprint(dynSize), func(t *testing.T) {
			head, strOff, strtab, size := elfWithDynamic(dynSize, "libcuda.so.1")
			r := &overlayReader{sparseReader{head, int64(size)}, strOff, strtab}
			var info elfInfo
			var err error
			alloc, took := measured(func() { info, err = parseELF(r, int64(size)) })
			t.Logf("allocated %d bytes in %v: %+v, %v", alloc, took, info, err)
			if alloc > maxELFAlloc {
				t.Errorf("allocated %d bytes, more than %d", alloc, maxELFAlloc)
			}
			if dynSize == 4<<10 {
				if err != nil || info.SONAME != "libcuda.so.1" || !info.Is64 {
					t.Errorf("got %+v, %v; want libcuda.so.1, 64-bit", info, err)
				}
			} else if err == nil || !strings.Contains(err.Error(), ".dynamic") {
				t.Errorf("error %v, want one about the .dynamic section", err)
			}
		})
	}
}

// maxELFAlloc bounds what one parseELF may allocate, whatever the file.
const maxELFAlloc = 64 << 10

// overlayReader is a sparseReader with one more written range, at off.
type overlayReader struct {
	sparseReader
	off  uint64
	data []byte
}

func (r *overlayReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.sparseReader.ReadAt(p, off)
	lo, hi := max(uint64(off), r.off), min(uint64(off)+uint64(n), r.off+uint64(len(r.data)))
	if lo < hi {
		copy(p[lo-uint64(off):hi-uint64(off)], r.data[lo-r.off:])
	}
	return n, err
}

// BenchmarkHostile measures the readers of the driver root on the hostile
// inputs of the tests above; docs/benchmarks.md reports its figures.
func BenchmarkHostile(b *testing.B) {
	for _, tc := range []struct {
		name  string
		cache []byte
	}{
		{"ParseLDCache/bigcache-1M-entries", bigLDCache(1 << 20)},
		{"ParseLDCache/longstr-30000x3MiB", hostileLDCache(30000, 3<<20)},
		{"ParseLDCache/longstr-65536x4KiB", hostileLDCache(65536, 4095)},
		{"ParseLDCache/longstr-1000x31MiB", hostileLDCache(1000, 31<<20)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.cache)))
			for b.Loop() {
				ParseLDCache(tc.cache)
			}
		})
	}
	b.Run("parseELF/sparse-dynamic-256MiB", func(b *testing.B) {
		p := filepath.Join(b.TempDir(), "libcuda.so.1")
		writeSparseELF(b, p, 256<<20, "libcuda.so.1")
		root, err := os.OpenRoot(filepath.Dir(p))
		if err != nil {
			b.Fatal(err)
		}
		defer root.Close()
		b.ReportAllocs()
		for b.Loop() {
			readELF(root, filepath.Base(p))
		}
	})
	for _, tc := range []struct {
		name  string
		plant func(b *testing.B, n *simnode.Node)
	}{
		{"Discover/wellformed", func(*testing.B, *simnode.Node) {}},
		{"Discover/sparse-elf", func(b *testing.B, n *simnode.Node) {
			real := filepath.Join(n.Root, n.LibDir, "libcuda.so."+n.DriverVersion)
			os.Remove(real)
			writeSparseELF(b, real, 256<<20, "libcuda.so.1")
		}},
		{"Discover/bigcache", func(b *testing.B, n *simnode.Node) {
			os.WriteFile(filepath.Join(n.Root, "etc/ld.so.cache"), bigLDCache(1<<20), 0o644)
		}},
		{"Discover/longstr-cache", func(b *testing.B, n *simnode.Node) {
			os.WriteFile(filepath.Join(n.Root, "etc/ld.so.cache"), hostileLDCache(30000, 3<<20), 0o644)
		}},
		{"Discover/looping-cache", func(b *testing.B, n *simnode.Node) {
			os.WriteFile(filepath.Join(n.Root, "etc/ld.so.cache"), loopingLDCache(1<<16), 0o644)
			os.Symlink(".", filepath.Join(n.Root, "x"))
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			n, err := simnode.Generate(b.TempDir(), simnode.Options{NumGPUs: 1})
			if err != nil {
				b.Fatal(err)
			}
			tc.plant(b, n)
			b.ReportAllocs()
			var peak uint64
			for b.Loop() {
				runtime.GC()
				var base runtime.MemStats
				runtime.ReadMemStats(&base)
				stop := make(chan struct{})
				got := make(chan uint64)
				go func() { // samples the live heap while discovery runs
					var m runtime.MemStats
					hi := uint64(0)
					for {
						runtime.ReadMemStats(&m)
						hi = max(hi, m.HeapAlloc)
						select {
						case <-stop:
							got <- hi
							return
						case <-time.After(time.Millisecond):
						}
					}
				}()
				Discover(Options{HostRoot: n.Root, DriverRoot: n.Root})
				close(stop)
				if hi := <-got; hi > base.HeapAlloc {
					peak = max(peak, hi-base.HeapAlloc)
				}
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		})
	}
}
