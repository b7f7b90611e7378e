package simnode

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// LDConfigEnv names ldconfig programs (a list like PATH) that build the
// ld.so.cache of nodes whose architecture is not the host ldconfig's: an
// x86-64 ldconfig skips aarch64 libraries without a word. make test-arm64
// and make unit point it at the aarch64 ldconfig of Debian's
// libc-bin:arm64, which the kernel runs with qemu-user (binfmt_misc).
const LDConfigEnv = "NRI_GPU_SIMNODE_LDCONFIG"

// arch is what a node's CPU architecture decides: the machine its driver
// files are built for, Debian's multiarch directory, and the kernel
// module's name for it.
type arch struct {
	name    string      // Go's: amd64, arm64
	triplet string      // Debian's multiarch triplet: x86_64-linux-gnu
	machine elf.Machine // of the driver's ELF files
	uname   string      // the kernel's (uname -m): x86_64, aarch64
}

// arches are the architectures a simulated node can have: x86-64 servers
// and arm64 Grace nodes (GH200, GB200).
var arches = []arch{
	{"amd64", "x86_64-linux-gnu", elf.EM_X86_64, "x86_64"},
	{"arm64", "aarch64-linux-gnu", elf.EM_AARCH64, "aarch64"},
}

// archOf returns the architecture named name, Go's name ("" is the
// architecture the test runs on).
func archOf(name string) (arch, error) {
	if name == "" {
		name = runtime.GOARCH
	}
	for _, a := range arches {
		if a.name == name {
			return a, nil
		}
	}
	return arch{}, fmt.Errorf("simnode: unknown architecture %q (amd64 or arm64)", name)
}

// toolchain is how a node of one architecture gets built: its gcc (path,
// and an identity that keys the ELF cache) and its ldconfig.
type toolchain struct {
	gcc, gccID, ldconfig string
	err                  error
}

var (
	toolchainsMu sync.Mutex
	toolchains   = map[string]*toolchain{}
)

// toolchainFor finds, once per architecture, the gcc and the ldconfig
// that build a node of a. gcc: Debian's <triplet>-gcc (the native
// compiler's other name, or gcc-aarch64-linux-gnu's cross compiler), else
// gcc when gcc -dumpmachine is the triplet. ldconfig: the first of
// LDConfigEnv's, the host's (PATH, /sbin, /usr/sbin) that is an ELF file
// of a's machine.
func toolchainFor(a arch) (*toolchain, error) {
	toolchainsMu.Lock()
	defer toolchainsMu.Unlock()
	if tc, ok := toolchains[a.name]; ok {
		return tc, tc.err
	}
	tc := &toolchain{}
	tc.gcc, tc.gccID, tc.err = findGCC(a)
	if tc.err == nil {
		tc.ldconfig, tc.err = findLDConfig(a)
	}
	toolchains[a.name] = tc
	return tc, tc.err
}

// CanBuild reports why a node of the architecture (Go's name: amd64,
// arm64) cannot be generated and used on this machine, nil when it can: a
// gcc and an ldconfig for it (toolchainFor), and that this machine runs
// its programs, static (ldconfig) and linked with glibc (the node's tools):
// for another machine than the test's, qemu-user registered with
// binfmt_misc and the architecture's glibc installed (Debian: libc6:arm64).
func CanBuild(name string) error {
	a, err := archOf(name)
	if err != nil {
		return err
	}
	tc, err := toolchainFor(a)
	if err != nil {
		return err
	}
	if out, err := exec.Command(tc.ldconfig, "--version").CombinedOutput(); err != nil {
		return fmt.Errorf("simnode: run %s (%s): %v (this machine runs another architecture's programs with qemu-user registered with binfmt_misc)\n%s", tc.ldconfig, a.machine, err, out)
	}
	dir, err := cacheDir("")
	if err != nil {
		return err
	}
	probe, err := buildELF(dir, tc, elfJob{name: "canbuild-probe", source: "#include <stdio.h>\nint main(void) { puts(\"ok\"); return 0; }\n"})
	if err != nil {
		return err
	}
	if out, err := exec.Command(probe).CombinedOutput(); err != nil || string(out) != "ok\n" {
		return fmt.Errorf("simnode: run a program linked with glibc for %s: %v %q (this machine needs glibc's loader of %s: Debian's libc6:%s)", a.name, err, out, a.name, a.name)
	}
	return nil
}

// findGCC returns the gcc that builds for a and its identity: path, size
// and modification time, so that a compiler upgrade misses the cache.
func findGCC(a arch) (path, id string, err error) {
	path, err = exec.LookPath(a.triplet + "-gcc")
	if err != nil {
		gcc, lerr := exec.LookPath("gcc")
		if lerr != nil {
			return "", "", fmt.Errorf("simnode: gcc is needed to build the simulated driver (or use Options.NoDriver): %w", lerr)
		}
		out, derr := exec.Command(gcc, "-dumpmachine").Output()
		if got := strings.TrimSpace(string(out)); derr != nil || got != a.triplet {
			return "", "", fmt.Errorf("simnode: no gcc for %s: %s-gcc is not on PATH (Debian: gcc-%s and libc6-dev-%s-cross) and gcc builds for %q", a.name, a.triplet, a.triplet, a.name, got)
		}
		path = gcc
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", "", err
	}
	return path, fmt.Sprintf("%s\x00%d\x00%d", path, fi.Size(), fi.ModTime().UnixNano()), nil
}

// findLDConfig returns the first ldconfig of LDConfigEnv's and the
// host's that is an ELF file of a's machine.
func findLDConfig(a arch) (string, error) {
	var candidates []string
	for _, p := range filepath.SplitList(os.Getenv(LDConfigEnv)) {
		if p != "" {
			candidates = append(candidates, p)
		}
	}
	if p, err := exec.LookPath("ldconfig"); err == nil {
		candidates = append(candidates, p)
	}
	candidates = append(candidates, "/sbin/ldconfig", "/usr/sbin/ldconfig")
	var tried []string
	seen := map[string]bool{}
	for _, p := range candidates {
		if seen[p] {
			continue
		}
		seen[p] = true
		m, err := elfMachine(p)
		if err != nil {
			continue
		}
		if m == a.machine {
			return p, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%s)", p, m))
	}
	if len(tried) == 0 {
		return "", errors.New("simnode: ldconfig not found (looked in " + LDConfigEnv + ", PATH, /sbin, /usr/sbin)")
	}
	return "", fmt.Errorf("simnode: no ldconfig for %s (%s) among %s: set %s to one (Debian's libc-bin:%s has it; make test-arm64 unpacks it)", a.name, a.machine, strings.Join(tried, ", "), LDConfigEnv, a.name)
}

// elfMachine is the machine of the ELF file at p.
func elfMachine(p string) (elf.Machine, error) {
	f, err := elf.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Machine, nil
}

// kernelVersionLine is the first line of /proc/driver/nvidia/version for
// the architecture: the proprietary module's on x86-64, the open module's
// (the only one Grace supports) on aarch64.
func kernelVersionLine(a arch, version string) string {
	const build = "  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Nov 20 01:32:29 UTC 2025"
	if a.name == "amd64" {
		return "NVRM version: NVIDIA UNIX x86_64 Kernel Module  " + version + build
	}
	return "NVRM version: NVIDIA UNIX Open Kernel Module for " + a.uname + "  " + version + build
}
