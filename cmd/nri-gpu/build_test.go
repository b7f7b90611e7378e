package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestReleaseBuildNeedsNoGlibcVersion builds nri-gpu as the Makefile and
// deploy/Dockerfile do (CGO_ENABLED=0), for amd64 and cross-built for
// arm64 (Grace nodes), and checks each binary's ELF: its machine, glibc's
// loader of the architecture as interpreter, the three glibc libraries it
// names, and no versioned symbol asked of the node's C library. NVML is
// loaded at run time (purego), which makes the binary dynamically linked;
// a cgo build would also tie it to the glibc it was built with
// (GLIBC_2.34 on Debian 12), and then `make install` on a node with an
// older glibc (RHEL 8: 2.28) would not start.
func TestReleaseBuildNeedsNoGlibcVersion(t *testing.T) {
	for _, tc := range []struct {
		goarch  string
		machine elf.Machine
		interp  string
	}{
		{"amd64", elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2"},
		{"arm64", elf.EM_AARCH64, "/lib/ld-linux-aarch64.so.1"},
	} {
		t.Run(tc.goarch, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "nri-gpu")
			cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOOS=linux", "GOARCH="+tc.goarch)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Machine != tc.machine || f.Type != elf.ET_EXEC {
				t.Errorf("the %s binary is a %s %s, want an executable for %s", tc.goarch, f.Machine, f.Type, tc.machine)
			}
			if got := interpreter(t, f); got != tc.interp {
				t.Errorf("the %s binary's interpreter is %q, want glibc's loader %s", tc.goarch, got, tc.interp)
			}
			needed, err := f.ImportedLibraries()
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(needed)
			if want := []string{"libc.so.6", "libdl.so.2", "libpthread.so.0"}; !slices.Equal(needed, want) {
				t.Errorf("the %s binary needs %q, want %q", tc.goarch, needed, want)
			}
			syms, err := f.ImportedSymbols()
			if err != nil && err != elf.ErrNoSymbols {
				t.Fatal(err)
			}
			for _, s := range syms {
				if strings.HasPrefix(s.Version, "GLIBC_") {
					t.Errorf("the %s release binary needs %s@%s from the node's C library", tc.goarch, s.Name, s.Version)
				}
			}
		})
	}
}

// interpreter is the program interpreter an ELF executable names
// (PT_INTERP), empty when it names none.
func interpreter(t *testing.T, f *elf.File) string {
	t.Helper()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			return strings.TrimRight(string(b), "\x00")
		}
	}
	return ""
}
