// Package harness drives a real containerd + runc through CRI for end-to-end tests
// of nri-gpu: it installs pinned runtime binaries from the Go module proxy, builds
// small OCI images by hand, runs a private containerd under one temp dir and talks
// CRI to it.
//
// Everything the harness starts it also stops by PID, and everything mounted under
// its private dir is unmounted, so tests can run side by side and leave the machine
// clean. It needs root.
package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Pinned versions.
const (
	// DefaultContainerdVersion is the containerd release the harness uses by default.
	DefaultContainerdVersion = "v2.4.2"
	// CompatContainerdVersion is the second containerd release, for a compatibility run.
	CompatContainerdVersion = "v2.2.9"
	// LegacyContainerdVersion is the containerd 1.7 release (NRI v0.8.0, config
	// version 2), built from its module source: `go install` refuses 1.7.
	LegacyContainerdVersion = "v1.7.36"
	// RuncVersion is the runc release installed next to containerd.
	RuncVersion = "v1.5.3"

	containerdModule = "github.com/containerd/containerd/v2"
	runcModule       = "github.com/opencontainers/runc"
)

// Logf is where the harness prints progress (what it installs, how long it took).
// Tests may point it at t.Logf; the default writes to stderr.
var Logf = func(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nri-gpu-e2e: "+format+"\n", args...)
}

// Tools holds absolute paths of the installed runtime binaries.
type Tools struct {
	ContainerdVersion string
	RuncVersion       string
	// RuncSeccomp says whether runc was built with seccomp support (the "seccomp"
	// build tag, which needs libseccomp-dev at build time).
	RuncSeccomp bool

	Containerd string // containerd daemon
	Shim       string // containerd-shim-runc-v2
	Ctr        string // ctr client
	Runc       string // runc
}

// Dirs returns the directories holding the tools, for a PATH.
func (t *Tools) Dirs() []string {
	var dirs []string
	seen := map[string]bool{}
	for _, p := range []string{t.Containerd, t.Shim, t.Ctr, t.Runc} {
		d := filepath.Dir(p)
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// DefaultCacheDir is $NRI_GPU_E2E_CACHE, else $HOME/.cache/nri-gpu-e2e.
func DefaultCacheDir() string {
	if d := os.Getenv("NRI_GPU_E2E_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "nri-gpu-e2e")
}

// InstallTools installs containerd, containerd-shim-runc-v2 and ctr at
// containerdVersion, and runc at RuncVersion, each with
// `GOBIN=<cacheDir>/<component>-<version> go install <pkg>@<version>`, only when
// missing. An empty cacheDir means DefaultCacheDir(); an empty version means
// DefaultContainerdVersion.
//
// runc is built with seccomp support when libseccomp's headers are present or can be
// installed with apt-get (libseccomp-dev); otherwise it is built without seccomp
// (into runc-<version>-noseccomp), which is enough for CRI pods that leave seccomp
// unset. NRI_GPU_E2E_RUNC_SECCOMP=0 forces the build without seccomp.
//
// Concurrent callers (parallel test packages) are serialized with a lock file.
func InstallTools(ctx context.Context, cacheDir, containerdVersion string) (*Tools, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	cacheDir, err := filepath.Abs(cacheDir)
	if err != nil {
		return nil, err
	}
	if containerdVersion == "" {
		containerdVersion = DefaultContainerdVersion
	}
	if !strings.HasPrefix(containerdVersion, "v") {
		containerdVersion = "v" + containerdVersion
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, ".install.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	t := &Tools{ContainerdVersion: containerdVersion, RuncVersion: RuncVersion}
	cdir := filepath.Join(cacheDir, "containerd-"+containerdVersion)
	if major, _ := parseVersion(containerdVersion); major < 2 {
		if err := buildContainerd1(ctx, cdir, containerdVersion, t); err != nil {
			return nil, err
		}
	}
	for _, c := range []struct {
		bin string
		dst *string
	}{
		{"containerd", &t.Containerd},
		{"containerd-shim-runc-v2", &t.Shim},
		{"ctr", &t.Ctr},
	} {
		if *c.dst != "" {
			continue
		}
		pkg := containerdModule + "/cmd/" + c.bin + "@" + containerdVersion
		p, err := GoInstall(ctx, cdir, pkg, c.bin, nil, nil)
		if err != nil {
			return nil, err
		}
		*c.dst = p
	}

	runcPkg := runcModule + "@" + RuncVersion
	seccompDir := filepath.Join(cacheDir, "runc-"+RuncVersion)
	plainDir := filepath.Join(cacheDir, "runc-"+RuncVersion+"-noseccomp")
	cgo := []string{"CGO_ENABLED=1"}
	wantSeccomp := os.Getenv("NRI_GPU_E2E_RUNC_SECCOMP") != "0"
	switch {
	case wantSeccomp && isExecutable(filepath.Join(seccompDir, "runc")):
		t.Runc, t.RuncSeccomp = filepath.Join(seccompDir, "runc"), true
	case wantSeccomp && ensureLibseccompDev(ctx) == nil:
		p, err := GoInstall(ctx, seccompDir, runcPkg, "runc", []string{"-tags", "seccomp"}, cgo)
		if err != nil {
			return nil, err
		}
		t.Runc, t.RuncSeccomp = p, true
	default:
		if wantSeccomp {
			Logf("libseccomp-dev unavailable: building runc without seccomp support")
		}
		p, err := GoInstall(ctx, plainDir, runcPkg, "runc", nil, cgo)
		if err != nil {
			return nil, err
		}
		t.Runc = p
	}
	return t, nil
}

// GoInstall runs `GOBIN=dir go install [args] pkg` unless dir/bin exists. The binary
// is built into a scratch GOBIN and renamed into place, so an interrupted build never
// leaves a half-written binary behind.
func GoInstall(ctx context.Context, dir, pkg, bin string, args, env []string) (string, error) {
	dst := filepath.Join(dir, bin)
	if isExecutable(dst) {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	scratch, err := os.MkdirTemp(dir, ".gobin-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(scratch)

	Logf("installing %s -> %s", pkg, dir)
	start := time.Now()
	cmdArgs := append([]string{"install", "-trimpath"}, args...)
	cmdArgs = append(cmdArgs, pkg)
	cmd := exec.CommandContext(ctx, goBinary(), cmdArgs...)
	cmd.Dir = os.TempDir() // outside any module: pkg@version ignores go.mod anyway
	cmd.Env = append(os.Environ(), "GOBIN="+scratch, "GOWORK=off")
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go install %s: %w\n%s", pkg, err, tail(out.String(), 4000))
	}
	if err := os.Rename(filepath.Join(scratch, bin), dst); err != nil {
		return "", err
	}
	Logf("installed %s in %s", dst, time.Since(start).Round(100*time.Millisecond))
	return dst, nil
}

// goBinary finds the go command: $GOROOT/bin/go of the running toolchain if it
// exists, else go from PATH.
func goBinary() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	for _, p := range []string{filepath.Join(os.Getenv("GOROOT"), "bin", "go"), "/usr/local/go/bin/go"} {
		if isExecutable(p) {
			return p
		}
	}
	return "go"
}

// ensureLibseccompDev makes libseccomp's headers available for a cgo build of runc
// with the seccomp tag, installing Debian's libseccomp-dev when missing.
func ensureLibseccompDev(ctx context.Context) error {
	if exec.CommandContext(ctx, "pkg-config", "--exists", "libseccomp").Run() == nil {
		return nil
	}
	if err := aptInstall(ctx, "libseccomp-dev"); err != nil {
		return err
	}
	return exec.CommandContext(ctx, "pkg-config", "--exists", "libseccomp").Run()
}

// aptInstall installs Debian packages with apt-get, running apt-get update once if
// the first attempt fails (a fresh machine may have no package lists).
func aptInstall(ctx context.Context, pkgs ...string) error {
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("apt-get not found, install %v by hand", pkgs)
	}
	Logf("apt-get install %s", strings.Join(pkgs, " "))
	start := time.Now()
	run := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, tail(string(out), 2000))
		}
		return nil
	}
	install := append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)
	err := run(install...)
	if err != nil {
		if uerr := run("update"); uerr != nil {
			return fmt.Errorf("%v; %v", err, uerr)
		}
		err = run(install...)
	}
	if err == nil {
		Logf("apt-get installed %s in %s", strings.Join(pkgs, " "), time.Since(start).Round(100*time.Millisecond))
	}
	return err
}

// lockFile takes an exclusive flock on path, waiting until ctx is done.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if err != syscall.EWOULDBLOCK {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// tail returns the last n bytes of s, cut at a line start.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "..." + "\n" + s
}

// fileTail returns the last n bytes of a file (for error messages).
func fileTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	b, _ := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	return tail(string(b), int(n))
}
