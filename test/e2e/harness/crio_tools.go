package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// CRIOVersion is the CRI-O release the harness builds (the only one the Go
// module proxy serves). Keep in sync with install-tools.sh.
const CRIOVersion = "v1.34.0"

const crioModule = "github.com/cri-o/cri-o"

// crioBuildTags are the build tags of a CRI-O without btrfs, ostree and gpgme
// (none of which the harness needs), with seccomp.
const crioBuildTags = "containers_image_ostree_stub exclude_graphdriver_btrfs containers_image_openpgp seccomp"

// CRIOTools are the binaries a harness CRI-O runs besides runc.
type CRIOTools struct {
	Version string
	CRIO    string // the crio daemon, built from the module source
	Pinns   string // its namespace pinning helper
	Conmon  string // the container monitor (Debian's conmon)
	Skopeo  string // image copy into CRI-O's storage (Debian's skopeo)
}

// InstallCRIO builds crio and pinns at CRIOVersion into
// <cacheDir>/crio-<version> when missing, and installs Debian's conmon and
// skopeo (and libseccomp-dev for the build) with apt-get when missing. An
// empty cacheDir means DefaultCacheDir(). `go install` cannot build CRI-O (the
// proxy refuses its version list), so it builds from the downloaded module
// source, as install-tools.sh does.
func InstallCRIO(ctx context.Context, cacheDir string) (*CRIOTools, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	cacheDir, err := filepath.Abs(cacheDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, ".install.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	var missing []string
	for _, p := range []string{"conmon", "skopeo"} {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if exec.CommandContext(ctx, "pkg-config", "--exists", "libseccomp").Run() != nil {
		missing = append(missing, "libseccomp-dev")
	}
	if len(missing) > 0 {
		if err := aptInstall(ctx, missing...); err != nil {
			return nil, err
		}
	}
	t := &CRIOTools{Version: CRIOVersion}
	if t.Conmon, err = exec.LookPath("conmon"); err != nil {
		return nil, err
	}
	if t.Skopeo, err = exec.LookPath("skopeo"); err != nil {
		return nil, err
	}
	dir := filepath.Join(cacheDir, "crio-"+CRIOVersion)
	t.CRIO, t.Pinns = filepath.Join(dir, "crio"), filepath.Join(dir, "pinns")
	if isExecutable(t.CRIO) && isExecutable(t.Pinns) {
		return t, nil
	}
	if err := buildCRIO(ctx, dir); err != nil {
		return nil, err
	}
	return t, nil
}

// buildCRIO builds cmd/crio and pinns from the module source into dir.
func buildCRIO(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	Logf("building %s@%s -> %s", crioModule, CRIOVersion, dir)
	start := time.Now()
	run := func(cwd string, env []string, name string, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = cwd
		cmd.Env = append(append(os.Environ(), "GOWORK=off"), env...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("%s %v: %w\n%s", name, args, err, tail(errOut.String()+out.String(), 4000))
		}
		return out.Bytes(), nil
	}
	out, err := run(os.TempDir(), nil, goBinary(), "mod", "download", "-json", crioModule+"@"+CRIOVersion)
	if err != nil {
		return err
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return fmt.Errorf("go mod download %s@%s: no module dir (%v)", crioModule, CRIOVersion, err)
	}
	src, err := os.MkdirTemp(dir, ".src-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	// The module cache is read-only: build in a writable copy.
	if _, err := run(dir, nil, "cp", "-r", mod.Dir+"/.", src+"/"); err != nil {
		return err
	}
	if _, err := run(dir, nil, "chmod", "-R", "u+w", src); err != nil {
		return err
	}
	if _, err := run(src, []string{"CGO_ENABLED=1"}, goBinary(), "build", "-trimpath", "-tags", crioBuildTags,
		"-ldflags", "-s -w", "-o", filepath.Join(dir, ".crio.tmp"), "./cmd/crio"); err != nil {
		return err
	}
	if _, err := run(src, nil, "make", "-C", "pinns"); err != nil {
		return err
	}
	// pinns/Makefile writes ../bin/pinns.
	if _, err := run(dir, nil, "cp", filepath.Join(src, "bin", "pinns"), filepath.Join(dir, ".pinns.tmp")); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dir, ".pinns.tmp"), filepath.Join(dir, "pinns")); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dir, ".crio.tmp"), filepath.Join(dir, "crio")); err != nil {
		return err
	}
	Logf("built crio %s in %s", CRIOVersion, time.Since(start).Round(100*time.Millisecond))
	return nil
}
