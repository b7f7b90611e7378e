package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"
)

// NVIDIA's DRA driver for GPUs, built from its Go module for the
// compatibility tests and the pod-start bench (docs/dra.md, "NVIDIA's
// driver beside nri-gpu").
const (
	// NVIDIADRAModule is the module the Go module proxy serves it as; its
	// go.mod calls it sigs.k8s.io/dra-driver-nvidia-gpu, so it builds in
	// its own directory, not by import path.
	NVIDIADRAModule = "github.com/NVIDIA/k8s-dra-driver-gpu"
	// NVIDIADRAVersion is the one version the proxy serves.
	NVIDIADRAVersion = "v0.5.0"
	// nvidiaDRAKubernetes replaces its k8s.io/kubernetes v1.37.0-rc.0,
	// whose .mod and .info the proxy refuses.
	nvidiaDRAKubernetes = "v1.37.2"
)

// NVIDIAGoNVFM is our stand-in for github.com/NVIDIA/go-nvfm (which the
// proxy does not serve at all): test/e2e/nvidiadra/go-nvfm, a module of
// its own that the build's replace points at.
func NVIDIAGoNVFM() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(filepath.Dir(file)), "nvidiadra", "go-nvfm")
}

// InstallNVIDIADRA builds NVIDIA's gpu-kubelet-plugin NVIDIADRAVersion into
// <cacheDir>/nvidia-dra-driver-gpu-<version>/gpu-kubelet-plugin, only when
// missing, and returns its path: `go mod download` of the module, its
// directory copied out of the read-only module cache, two replaces (the
// proxy refuses k8s.io/kubernetes v1.37.0-rc.0, taken at v1.37.2, and
// go-nvfm, taken from NVIDIAGoNVFM), then `go build ./cmd/gpu-kubelet-plugin`
// with cgo (go-nvml). About 5 min on 2 cores with an empty build cache.
// test/e2e/install-tools.sh does the same (NRI_GPU_E2E_NVIDIA_DRA=1).
func InstallNVIDIADRA(ctx context.Context, cacheDir string) (string, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	dir := filepath.Join(cacheDir, "nvidia-dra-driver-gpu-"+NVIDIADRAVersion)
	bin := filepath.Join(dir, "gpu-kubelet-plugin")
	if isExecutable(bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, ".install.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if isExecutable(bin) {
		return bin, nil
	}
	Logf("building %s@%s cmd/gpu-kubelet-plugin from its module source -> %s", NVIDIADRAModule, NVIDIADRAVersion, dir)
	start := time.Now()
	src, err := os.MkdirTemp(dir, ".src-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	modDir, err := downloadModule(ctx, NVIDIADRAModule+"@"+NVIDIADRAVersion)
	if err != nil {
		return "", err
	}
	steps := [][]string{
		{"cp", "-r", modDir + "/.", src + "/"},
		{"chmod", "-R", "u+w", src},
		{goBinary(), "mod", "edit", "-replace", "k8s.io/kubernetes=k8s.io/kubernetes@" + nvidiaDRAKubernetes,
			"-replace", "github.com/NVIDIA/go-nvfm=" + NVIDIAGoNVFM()},
		{goBinary(), "build", "-trimpath", "-ldflags", "-s -w", "-o", bin + ".tmp", "./cmd/gpu-kubelet-plugin"},
	}
	for _, argv := range steps {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "CGO_ENABLED=1")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("%s@%s: %v: %w\n%s", NVIDIADRAModule, NVIDIADRAVersion, argv, err, tail(out.String(), 4000))
		}
	}
	if err := os.Rename(bin+".tmp", bin); err != nil {
		return "", err
	}
	Logf("built NVIDIA's gpu-kubelet-plugin %s in %s", NVIDIADRAVersion, time.Since(start).Round(100*time.Millisecond))
	return bin, nil
}
