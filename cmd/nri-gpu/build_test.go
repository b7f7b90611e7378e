package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReleaseBuildNeedsNoGlibcVersion builds nri-gpu as the Makefile and
// deploy/Dockerfile do (CGO_ENABLED=0) and checks that the binary asks the
// node's C library for no versioned symbol. NVML is loaded at run time
// (purego), which makes the binary dynamically linked; a cgo build would
// also tie it to the glibc it was built with (GLIBC_2.34 on Debian 12),
// and then `make install` on a node with an older glibc (RHEL 8: 2.28)
// would not start.
func TestReleaseBuildNeedsNoGlibcVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "nri-gpu")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.ImportedSymbols()
	if err != nil && err != elf.ErrNoSymbols {
		t.Fatal(err)
	}
	for _, s := range syms {
		if strings.HasPrefix(s.Version, "GLIBC_") {
			t.Errorf("the release binary needs %s@%s from the node's C library", s.Name, s.Version)
		}
	}
}
