package discover_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// ldconfigList returns what `ldconfig -p` says a cache file holds, as
// "name -> path" lines.
func ldconfigList(t *testing.T, cache string) []string {
	t.Helper()
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		ldconfig = "/sbin/ldconfig"
	}
	out, err := exec.Command(ldconfig, "-p", "-C", cache).Output()
	if err != nil {
		t.Fatalf("ldconfig -p: %v", err)
	}
	re := regexp.MustCompile(`^\s+(\S+) \(([^)]*)\) => (\S+)$`)
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			lines = append(lines, m[1]+" -> "+m[3])
		}
	}
	return lines
}

// TestParseLDCacheAgainstLdconfig parses real caches written by ldconfig
// (the simulated nodes': an x86-64 node's, an arm64 node's written by
// aarch64 ldconfig where this machine runs one; and the host's own) and
// compares with what ldconfig itself reads from them.
func TestParseLDCacheAgainstLdconfig(t *testing.T) {
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1, Layout: simnode.LayoutDebian, Arch: "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	caches := []string{filepath.Join(n.Root, "etc/ld.so.cache")}
	if err := simnode.CanBuild("arm64"); err == nil {
		a, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1, Layout: simnode.LayoutDebian, Arch: "arm64"})
		if err != nil {
			t.Fatal(err)
		}
		caches = append(caches, filepath.Join(a.Root, "etc/ld.so.cache"))
	} else {
		t.Logf("no arm64 node's cache: %v", err)
	}
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		caches = append(caches, "/etc/ld.so.cache")
	}
	for _, cache := range caches {
		t.Run(cache, func(t *testing.T) {
			data, err := os.ReadFile(cache)
			if err != nil {
				t.Fatal(err)
			}
			entries, err := discover.ParseLDCache(data)
			if err != nil {
				t.Fatalf("ParseLDCache: %v", err)
			}
			var got []string
			for _, e := range entries {
				got = append(got, e.Name+" -> "+e.Path)
			}
			want := ldconfigList(t, cache)
			if len(want) == 0 {
				t.Fatal("ldconfig lists nothing")
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("entries (-ldconfig +ours):\n%s", diff)
			}
			if cache != "/etc/ld.so.cache" {
				i := slices.IndexFunc(entries, func(e discover.LDCacheEntry) bool { return e.Name == "libcuda.so.1" })
				if i < 0 || !entries[i].Is64Bit() || entries[i].Is32Bit() {
					t.Errorf("libcuda.so.1 missing or not 64-bit: %+v", entries)
				}
			}
		})
	}
}

// oldFormatCache builds a cache in the "ld.so-1.7.0" format.
func oldFormatCache(entries [][2]string, flags int32) []byte {
	var strs bytes.Buffer
	var ents bytes.Buffer
	for _, e := range entries {
		k := strs.Len()
		strs.WriteString(e[0] + "\x00")
		v := strs.Len()
		strs.WriteString(e[1] + "\x00")
		binary.Write(&ents, binary.LittleEndian, [3]uint32{uint32(flags), uint32(k), uint32(v)})
	}
	var b bytes.Buffer
	b.WriteString("ld.so-1.7.0\x00")
	binary.Write(&b, binary.LittleEndian, uint32(len(entries)))
	b.Write(ents.Bytes())
	b.Write(strs.Bytes())
	return b.Bytes()
}

func TestParseLDCacheOldFormat(t *testing.T) {
	data := oldFormatCache([][2]string{{"libcuda.so.1", "/usr/lib64/libcuda.so.1"}, {"libc.so.6", "/lib/libc.so.6"}}, 0x0303)
	got, err := discover.ParseLDCache(data)
	if err != nil {
		t.Fatal(err)
	}
	want := []discover.LDCacheEntry{
		{Name: "libcuda.so.1", Path: "/usr/lib64/libcuda.so.1", Flags: 0x0303},
		{Name: "libc.so.6", Path: "/lib/libc.so.6", Flags: 0x0303},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestParseLDCacheErrors(t *testing.T) {
	good := oldFormatCache([][2]string{{"a", "b"}}, 0x0303)
	huge := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(huge[12:], 0xffffffff)
	badOffset := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(badOffset[20:], 1000)
	unterminated := good[:len(good)-1]
	newHeader := []byte("glibc-ld.so.cache1.1")
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "unknown format"},
		{"garbage", []byte("hello world, not a cache"), "unknown format"},
		{"truncated old header", []byte("ld.so-1.7.0"), "truncated header"},
		{"huge count", huge, "entries do not fit"},
		{"offset out of range", badOffset, "out of range"},
		{"unterminated string", unterminated, "not terminated"},
		{"truncated new header", newHeader, "truncated header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := discover.ParseLDCache(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseGPUInformation(t *testing.T) {
	real := `Model: 		 NVIDIA H100 80GB HBM3
IRQ:   		 188
GPU UUID: 	 GPU-3E953D37-558d-fb20-8eca-25de8b98f5a7
Video BIOS: 	 96.00.99.00.01
Bus Type: 	 PCIe
DMA Size: 	 52 bits
DMA Mask: 	 0xfffffffffffff
Bus Location: 	 0000:38:00.0
Device Minor: 	 2
GPU Firmware: 	 580.126.09
GPU Excluded:	 No
`
	got, err := discover.ParseGPUInformation([]byte(real))
	if err != nil {
		t.Fatal(err)
	}
	want := discover.GPUInfo{Model: "NVIDIA H100 80GB HBM3", UUID: "GPU-3E953D37-558d-fb20-8eca-25de8b98f5a7", BusID: "0000:38:00.0", Minor: 2}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	excl, err := discover.ParseGPUInformation([]byte(strings.Replace(real, "GPU Excluded:\t No", "GPU Excluded:\t Yes", 1)))
	if err != nil || !excl.Excluded {
		t.Errorf("excluded GPU: %+v, %v", excl, err)
	}
	for _, tc := range []struct{ name, data, want string }{
		{"no minor", "GPU UUID: GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7\n", "no Device Minor"},
		{"bad minor", "Device Minor: x\nGPU UUID: GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7\n", `bad Device Minor "x"`},
		{"minor out of range", "Device Minor: 255\n", `bad Device Minor "255"`},
		{"bad uuid", "Device Minor: 1\nGPU UUID: GPU-1234\n", `bad GPU UUID "GPU-1234"`},
		{"bad bus", "Device Minor: 1\nGPU UUID: GPU-3e953d37-558d-fb20-8eca-25de8b98f5a7\nBus Location: 38:00.0\n", `bad PCI bus id`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := discover.ParseGPUInformation([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"0000:38:00.0":     "0000:38:00.0",
		"00000000:38:00.0": "0000:38:00.0",
		"0000:3B:00.1":     "0000:3b:00.1",
		"0001:3b:1f.7":     "0001:3b:1f.7",
	} {
		if got, err := inventory.NormalizeBusID(in); err != nil || got != want {
			t.Errorf("NormalizeBusID(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "38:00.0", "00010000:38:00.0", "0000:38:00.8", "0000:3g:00.0", "0000:38-00.0", "000:38:00.0"} {
		if got, err := inventory.NormalizeBusID(in); err == nil {
			t.Errorf("NormalizeBusID(%q) = %q, want an error", in, got)
		}
	}
}

func TestParseProcDevices(t *testing.T) {
	data := `Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
244 nvidia-uvm
509 nvidia-caps

Block devices:
  8 sd
259 blkext
`
	got, err := discover.ParseProcDevices([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"mem": 1, "/dev/vc/0": 4, "nvidia-frontend": 195, "nvidia-uvm": 244, "nvidia-caps": 509}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, bad := range []string{"Character devices:\nx nvidia\n", "Character devices:\n195\n", "Character devices:\n99999 big\n"} {
		if _, err := discover.ParseProcDevices([]byte(bad)); err == nil {
			t.Errorf("ParseProcDevices(%q) succeeded", bad)
		}
	}
}

func TestParseDriverVersion(t *testing.T) {
	for in, want := range map[string]string{
		"NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.126.09  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Nov 20 2025\nGCC version: gcc 12\n": "580.126.09",
		"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.44.01  Release Build\n":                                                             "590.44.01",
		"580.126.09\n": "580.126.09",
	} {
		if got, err := discover.ParseDriverVersion([]byte(in)); err != nil || got != want {
			t.Errorf("ParseDriverVersion(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "NVRM version: none\n", "..\n"} {
		if got, err := discover.ParseDriverVersion([]byte(bad)); err == nil {
			t.Errorf("ParseDriverVersion(%q) = %q, want an error", bad, got)
		}
	}
}

func TestFirmwareFromInitNamespace(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    bool
		err     bool
	}{
		{"6.8.0-49-generic", true, false},
		{"5.7.0", true, false},
		{"5.15.0-1049-aws", true, false},
		{"5.10.0-182.0.0.95.oe2203sp3.x86_64", true, false},
		{"10.0.1", true, false},
		{"5.6.19", false, false},
		{"5.4.0-150-generic", false, false},
		{"4.18.0-553.el8_10.x86_64", false, false},
		{"3.10.0-1160.el7.x86_64\n", false, false},
		{"", false, true},
		{"linux-6.8", false, true},
		{"6", false, true},
		{"6.x", false, true},
		{"99999.1", false, true},
	} {
		got, err := discover.FirmwareFromInitNamespace(tc.release)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("FirmwareFromInitNamespace(%q) = %v, %v; want %v, error %v", tc.release, got, err, tc.want, tc.err)
		}
		if err != nil && !strings.Contains(err.Error(), "kernel release") {
			t.Errorf("error %q does not name the kernel release", err)
		}
	}
}
