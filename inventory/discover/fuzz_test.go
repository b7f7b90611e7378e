package discover

import (
	"bytes"
	"os"
	"runtime"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// allocBound fails when one call of fn allocates more than a multiple of
// the input's size: a length field in the input must not decide how much
// the parser allocates.
func allocBound(t *testing.T, n int, fn func()) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(64*n+1<<20); got > limit {
		t.Fatalf("allocated %d bytes for %d bytes of input (limit %d)", got, n, limit)
	}
}

func seedFile(f *testing.F, path string) {
	if data, err := os.ReadFile(path); err == nil {
		f.Add(data)
	}
}

// FuzzParseLDCache fuzzes ld.so.cache contents of both formats.
func FuzzParseLDCache(f *testing.F) {
	seedFile(f, "/etc/ld.so.cache")
	f.Add([]byte(ldMagicOld))
	f.Add([]byte(ldMagicNew + "\x00\x00\x00\x00\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var entries []LDCacheEntry
		allocBound(t, len(data), func() { entries, _ = ParseLDCache(data) })
		if len(entries) > len(data)/ldOldEntrySize {
			t.Fatalf("%d entries from %d bytes", len(entries), len(data))
		}
	})
}

// FuzzParseELF fuzzes the SONAME reader with arbitrary files.
func FuzzParseELF(f *testing.F) {
	seedFile(f, "/lib/x86_64-linux-gnu/libdl.so.2")
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		allocBound(t, len(data), func() {
			info, err := parseELF(bytes.NewReader(data), int64(len(data)))
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
