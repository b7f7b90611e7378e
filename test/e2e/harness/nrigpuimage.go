package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// NRIGPUImageRepository is the repository of nri-gpu's release image, as
// deploy/kubernetes and the chart name it.
const NRIGPUImageRepository = "ghcr.io/nri-gpu/nri-gpu"

// NRIGPUImage is nri-gpu's image for the cluster, NRIGPUImageRepository:tag,
// with nri-gpu built from the checkout at repo (-X main.Version=version,
// so that --version tells the images apart).
//
// It is a stand-in for `make image`'s archive (bin/nri-gpu-image.tar):
// the same files as deploy/Dockerfile's image, /usr/bin/nri-gpu as the
// entrypoint plus the build machine's glibc loader and libc.so.6 (nri-gpu
// loads NVML with purego, which needs them even with CGO_ENABLED=0), one
// layer, no shell. Once `make image` exists this function imports its
// archive instead; callers do not change.
func NRIGPUImage(ctx context.Context, repo, dir, tag, version string) (*Image, error) {
	if dir == "" {
		dir = filepath.Join(DefaultCacheDir(), "images")
	}
	bindir, err := os.MkdirTemp("", "nri-gpu-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(bindir)
	bin := filepath.Join(bindir, "nri-gpu")
	cmd := exec.CommandContext(ctx, goBinary(), "build", "-trimpath", "-ldflags", "-X main.Version="+version, "-o", bin, "./cmd/nri-gpu")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build nri-gpu for its image: %w\n%s", err, out)
	}
	glibc, err := glibcFiles(bin)
	if err != nil {
		return nil, err
	}
	// The base's directories (/etc, /tmp, ...) and merged /usr (/lib64 ->
	// usr/lib64: the loader's path in the ELF header), as distroless has.
	files := append(append(baseFiles(), mergedUsrFiles()...), File{Path: "/usr/bin/nri-gpu", Source: bin, Mode: 0o755})
	files = append(files, glibc...)
	return BuildImage(dir, ImageSpec{
		Name:       NRIGPUImageRepository + ":" + tag,
		Files:      files,
		Entrypoint: []string{"/usr/bin/nri-gpu"},
	})
}

// buildE2ECommand builds test/e2e/cmd/<name> of this module into dir and
// returns the binary's path.
func buildE2ECommand(ctx context.Context, name, dir string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	module := filepath.Dir(filepath.Dir(file)) // test/e2e
	bin := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, goBinary(), "build", "-o", bin, "./cmd/"+name)
	cmd.Dir = module
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", name, err, out)
	}
	return bin, nil
}
