package discover

import (
	"bytes"
	"debug/elf"
	"os"
	"runtime"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// allocBound fails when one call of fn allocates more than perByte bytes
// per byte of the input's n bytes plus fixed: a length field in the input
// must not decide how much the parser allocates.
func allocBound(t *testing.T, n int, perByte, fixed uint64, fn func()) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	if got, limit := after.TotalAlloc-before.TotalAlloc, perByte*uint64(n)+fixed; got > limit {
		t.Fatalf("allocated %d bytes for %d bytes of input (limit %d)", got, n, limit)
	}
}

// fuzzSlack is added to every bound: TotalAlloc counts the whole process,
// and the fuzzing engine allocates meanwhile.
const fuzzSlack = 256 << 10

func seedFile(f *testing.F, path string) {
	if data, err := os.ReadFile(path); err == nil {
		f.Add(data)
	}
}

// FuzzParseLDCache fuzzes ld.so.cache contents of both formats. The seeds
// in testdata hold the hostile shapes of bounds_test.go: entries pointing
// into one long string, strings longer than a path, paths through a link
// loop. Parsing allocates at most the string table's copy, 40 bytes of
// entry and 16 of sorted offsets per 24-byte entry: under 4 bytes per
// byte of cache, whatever the entries point at.
func FuzzParseLDCache(f *testing.F) {
	seedFile(f, "/etc/ld.so.cache")
	f.Add([]byte(ldMagicOld))
	f.Add([]byte(ldMagicNew + "\x00\x00\x00\x00\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var entries []LDCacheEntry
		allocBound(t, len(data), 4, fuzzSlack, func() { entries, _ = ParseLDCache(data) })
		if len(entries) > len(data)/ldOldEntrySize || len(entries) > ldMaxEntries {
			t.Fatalf("%d entries from %d bytes", len(entries), len(data))
		}
		for _, e := range entries {
			if len(e.Name) > ldMaxString || len(e.Path) > ldMaxString {
				t.Fatalf("string of %d bytes accepted", max(len(e.Name), len(e.Path)))
			}
		}
	})
}

// FuzzParseELF fuzzes the SONAME reader with arbitrary files, each read as
// it is and as the head of a sparse 1 GiB file: either way the reader
// allocates at most maxELFAlloc, whatever the file's sections claim (the
// seed sparse-dynamic-256MiB is the head of the file TestDiscoverSparseELF
// plants). Where it finds a SONAME, debug/elf (which reads whole sections)
// must find the same one.
func FuzzParseELF(f *testing.F) {
	seedFile(f, "/lib/x86_64-linux-gnu/libdl.so.2")
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var info elfInfo
		var err error
		allocBound(t, len(data), 0, maxELFAlloc+fuzzSlack, func() {
			info, err = parseELF(bytes.NewReader(data), int64(len(data)))
		})
		if err == nil && info.SONAME == "" {
			t.Fatal("no error and no SONAME")
		}
		if err == nil {
			ef, eerr := elf.NewFile(bytes.NewReader(data))
			if eerr == nil {
				names, _ := ef.DynString(elf.DT_SONAME)
				if len(names) == 0 || names[0] != info.SONAME || (ef.Class == elf.ELFCLASS64) != info.Is64 {
					t.Fatalf("SONAME %q (64-bit %v), debug/elf: %q (%v)", info.SONAME, info.Is64, names, ef.Class)
				}
			}
		}
		allocBound(t, len(data), 0, maxELFAlloc+fuzzSlack, func() {
			info, err := parseELF(sparseReader{data, 1 << 30}, 1<<30)
			if err == nil && info.SONAME == "" {
				t.Fatal("no error and no SONAME")
			}
		})
	})
}

// FuzzParseGPUInformation fuzzes /proc/driver/nvidia/gpus/*/information.
func FuzzParseGPUInformation(f *testing.F) {
	f.Add([]byte("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t\t GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7\n" +
		"Video BIOS: \t\t ??.??.??.??.??\nBus Type: \t\t PCIe\nDMA Size: \t\t 52 bits\nDMA Mask: \t\t 0xfffffffffffff\n" +
		"Bus Location: \t\t 0000:38:00.0\nDevice Minor: \t\t 0\nGPU Excluded:\t\t No\n"))
	f.Add([]byte("GPU UUID: GPU-x\nDevice Minor: -1\nBus Location: 0000:zz:00.0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		info, err := ParseGPUInformation(data)
		if err != nil {
			return
		}
		if info.Minor < 0 || info.Minor > 254 || !validUUID(info.UUID) {
			t.Fatalf("accepted %+v", info)
		}
		if b, err := inventory.NormalizeBusID(info.BusID); info.BusID != "" && (err != nil || b != info.BusID) {
			t.Fatalf("bus id %q not normalized (%q, %v)", info.BusID, b, err)
		}
	})
}

// FuzzParseProcDevices fuzzes /proc/devices.
func FuzzParseProcDevices(f *testing.F) {
	f.Add([]byte("Character devices:\n  1 mem\n195 nvidia-frontend\n510 nvidia-uvm\n\nBlock devices:\n  8 sd\n"))
	f.Add([]byte("Character devices:\n99999999999 x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseProcDevices(data)
		if err != nil {
			return
		}
		for name, major := range m {
			if major < 0 || major > 4095 {
				t.Fatalf("%s: major %d", name, major)
			}
		}
	})
}

// FuzzParseDriverVersion fuzzes /proc/driver/nvidia/version.
func FuzzParseDriverVersion(f *testing.F) {
	f.Add([]byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.126.09  Release Build  (dvs-builder@U16-I3-B07-4-1)  Thu Jan  8 20:44:09 UTC 2026\nGCC version:  gcc version 12.2.0\n"))
	f.Add([]byte("580.126.09\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := ParseDriverVersion(data)
		if err == nil && !validVersion(v) {
			t.Fatalf("accepted version %q", v)
		}
		if err == nil {
			inventory.CUDAVersion(v)
		}
	})
}

// FuzzParseMIGMinors fuzzes /proc/driver/nvidia-caps/mig-minors: no
// panic, and every minor and instance it returns within its bounds.
func FuzzParseMIGMinors(f *testing.F) {
	f.Add([]byte("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n"))
	f.Add([]byte("gpu255/gi63/ci63/access 1048576\ngpu0/gi0/x/y/access 3\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMIGMinors(data)
		if err != nil {
			return
		}
		for k, v := range m.GI {
			if k[0] < 0 || k[0] > maxMIGGPU || k[1] < 0 || k[1] > maxMIGInstance || v < 0 || v > maxCapsMinor {
				t.Fatalf("GI %v: minor %d", k, v)
			}
		}
		for k, v := range m.CI {
			if k[2] < 0 || k[2] > maxMIGInstance || v < 0 || v > maxCapsMinor {
				t.Fatalf("CI %v: minor %d", k, v)
			}
		}
	})
}
