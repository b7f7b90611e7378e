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

// containerd1Module is containerd 1.x's module path (2.x is .../v2).
const containerd1Module = "github.com/containerd/containerd"

// buildContainerd1 builds containerd, containerd-shim-runc-v2 and ctr of a
// containerd 1.x release into dir, only when missing. `go install pkg@v1.7.x`
// refuses it (its go.mod has an exclude directive), but the module's own
// source builds: `go mod download` it, copy the directory out of the read-only
// module cache and `go build` there, as containerd's Makefile does (the shim
// static, CGO_ENABLED=0). test/e2e/install-tools.sh does the same.
func buildContainerd1(ctx context.Context, dir, version string, t *Tools) error {
	bins := []string{"containerd", "containerd-shim-runc-v2", "ctr"}
	missing := false
	for _, b := range bins {
		missing = missing || !isExecutable(filepath.Join(dir, b))
	}
	if missing {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		Logf("building %s@%s from its module source -> %s", containerd1Module, version, dir)
		start := time.Now()
		src, err := os.MkdirTemp(dir, ".src-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(src)
		modDir, err := downloadModule(ctx, containerd1Module+"@"+version)
		if err != nil {
			return err
		}
		if out, err := exec.CommandContext(ctx, "cp", "-r", modDir+"/.", src+"/").CombinedOutput(); err != nil {
			return fmt.Errorf("copying %s: %w\n%s", modDir, err, out)
		}
		if out, err := exec.CommandContext(ctx, "chmod", "-R", "u+w", src).CombinedOutput(); err != nil {
			return fmt.Errorf("chmod %s: %w\n%s", src, err, out)
		}
		for _, b := range bins {
			if isExecutable(filepath.Join(dir, b)) {
				continue
			}
			env := []string{"GOWORK=off", "GOFLAGS=-mod=mod"}
			if b == "containerd-shim-runc-v2" {
				env = append(env, "CGO_ENABLED=0")
			}
			tmp := filepath.Join(dir, "."+b+".tmp")
			cmd := exec.CommandContext(ctx, goBinary(), "build", "-trimpath", "-tags", "urfave_cli_no_docs",
				"-ldflags", "-X "+containerd1Module+"/version.Version="+version, "-o", tmp, "./cmd/"+b)
			cmd.Dir = src
			cmd.Env = append(os.Environ(), env...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("go build %s@%s ./cmd/%s: %w\n%s", containerd1Module, version, b, err, tail(out.String(), 4000))
			}
			if err := os.Rename(tmp, filepath.Join(dir, b)); err != nil {
				return err
			}
		}
		Logf("built containerd %s in %s", version, time.Since(start).Round(100*time.Millisecond))
	}
	t.Containerd, t.Shim, t.Ctr = filepath.Join(dir, "containerd"), filepath.Join(dir, "containerd-shim-runc-v2"), filepath.Join(dir, "ctr")
	return nil
}

// downloadModule runs `go mod download -json mod@version` and returns the
// module's directory in the module cache.
func downloadModule(ctx context.Context, modVersion string) (string, error) {
	cmd := exec.CommandContext(ctx, goBinary(), "mod", "download", "-json", modVersion)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	_ = json.Unmarshal(out, &m)
	if err != nil || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s\n%s", modVersion, err, m.Error, tail(stderr.String(), 2000))
	}
	return m.Dir, nil
}
