package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Pinned versions of the cluster's binaries (keep in sync with
// test/e2e/install-cluster.sh).
const (
	// KubernetesVersion is the newest Kubernetes release the module proxy
	// serves; KubernetesOldVersion the oldest with resource.k8s.io/v1
	// (the kubelet phase's KubeletVersion).
	KubernetesVersion    = "v1.37.2"
	KubernetesOldVersion = "v1.34.4"
	// EtcdVersion is the etcd server (go.etcd.io/etcd/server/v3).
	EtcdVersion = "v3.6.16"
	// HelmVersion is the Helm CLI (helm.sh/helm/v4).
	HelmVersion = "v4.3.1"
)

// kubernetesCommands are the commands of k8s.io/kubernetes a cluster runs.
var kubernetesCommands = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet"}

// KubeTools are the absolute paths of one Kubernetes version's binaries,
// etcd's and Helm's.
type KubeTools struct {
	Version           string
	APIServer         string
	ControllerManager string
	Scheduler         string
	Kubectl           string
	Kubelet           string
	Etcd              string
	Helm              string
}

// InstallKubeTools returns the binaries of Kubernetes version ("" =
// KubernetesVersion), etcd and Helm, building what is missing into
// cacheDir ("" = DefaultCacheDir()): <cache>/kubernetes-<version>/ (one go
// build of the five commands, so that their shared packages compile once:
// about 12 min on 2 cores with empty caches), <cache>/etcd-<version>/etcd,
// <cache>/helm-<version>/helm.
func InstallKubeTools(ctx context.Context, cacheDir, version string) (*KubeTools, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	if version == "" {
		version = KubernetesVersion
	}
	kdir := filepath.Join(cacheDir, "kubernetes-"+version)
	if err := buildKubernetes(ctx, cacheDir, kdir, version, kubernetesCommands...); err != nil {
		return nil, err
	}
	etcd, err := installEtcd(ctx, cacheDir)
	if err != nil {
		return nil, err
	}
	helm, err := GoInstall(ctx, filepath.Join(cacheDir, "helm-"+HelmVersion), "helm.sh/helm/v4/cmd/helm@"+HelmVersion, "helm",
		[]string{"-ldflags", "-s -w -X helm.sh/helm/v4/internal/version.version=" + HelmVersion}, nil)
	if err != nil {
		return nil, err
	}
	j := func(c string) string { return filepath.Join(kdir, c) }
	return &KubeTools{Version: version, APIServer: j("kube-apiserver"), ControllerManager: j("kube-controller-manager"),
		Scheduler: j("kube-scheduler"), Kubectl: j("kubectl"), Kubelet: j("kubelet"), Etcd: etcd, Helm: helm}, nil
}

// gocmd runs go with args in dir (GOWORK off, env added) and returns its
// stdout.
func gocmd(ctx context.Context, dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, goBinary(), args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "GOWORK=off"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tail(errb.String()+out.String(), 4000))
	}
	return out.Bytes(), nil
}

// buildKubernetes builds cmds of k8s.io/kubernetes at version into dir,
// unless all are there. The module zip lacks staging/, which its go.mod
// replaces point to: the source is copied out of the module cache, each
// ./staging replace swapped for the published k8s.io/* v0.<minor>.<patch>
// module, the two test-only requires the proxy refuses dropped, and the
// commands built by ONE go build (shared packages compile once; -s -w: no
// debug information to link). The install lock of cacheDir is held.
func buildKubernetes(ctx context.Context, cacheDir, dir, version string, cmds ...string) error {
	have := func() bool {
		for _, c := range cmds {
			if !isExecutable(filepath.Join(dir, c)) {
				return false
			}
		}
		return true
	}
	if have() {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, ".install.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if have() {
		return nil
	}
	Logf("building %s of k8s.io/kubernetes@%s -> %s (about 4 min on 2 cores for the kubelet alone, 12 for all)", strings.Join(cmds, " "), version, dir)
	start := time.Now()
	src, err := os.MkdirTemp(dir, ".src-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	modDir, err := downloadModule(ctx, "k8s.io/kubernetes@"+version)
	if err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cp", "-r", modDir+"/.", src).CombinedOutput(); err != nil {
		return fmt.Errorf("copying %s: %w\n%s", modDir, err, out)
	}
	if err := exec.CommandContext(ctx, "chmod", "-R", "u+w", src).Run(); err != nil {
		return err
	}
	out, err := gocmd(ctx, src, nil, "mod", "edit", "-json")
	if err != nil {
		return err
	}
	var gomod struct {
		Replace []struct {
			Old struct{ Path string }
			New struct{ Path string }
		}
	}
	if err := json.Unmarshal(out, &gomod); err != nil {
		return err
	}
	staging := "v0." + strings.TrimPrefix(version, "v1.")
	edit := []string{"mod", "edit", "-droprequire=k8s.io/sample-cli-plugin", "-droprequire=k8s.io/sample-controller"}
	for _, r := range gomod.Replace {
		if strings.HasPrefix(r.New.Path, "./staging/") {
			edit = append(edit, "-dropreplace="+r.Old.Path, "-require="+r.Old.Path+"@"+staging)
		}
	}
	if _, err := gocmd(ctx, src, nil, edit...); err != nil {
		return err
	}
	outDir, err := os.MkdirTemp(dir, ".out-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(outDir)
	args := []string{"build", "-trimpath", "-o", outDir + "/", "-ldflags",
		"-s -w -X k8s.io/component-base/version.gitVersion=" + version + " -X k8s.io/client-go/pkg/version.gitVersion=" + version}
	for _, c := range cmds {
		args = append(args, "./cmd/"+c)
	}
	if _, err := gocmd(ctx, src, []string{"GOFLAGS=-mod=mod"}, args...); err != nil {
		return err
	}
	for _, c := range cmds {
		if err := os.Rename(filepath.Join(outDir, c), filepath.Join(dir, c)); err != nil {
			return err
		}
	}
	Logf("built %s in %s", dir, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// etcdMain is the etcd server's main: the proxy has no installable etcd
// command, but go.etcd.io/etcd/server/v3 has etcdmain.
const etcdMain = `package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
`

// installEtcd builds etcd at EtcdVersion into <cacheDir>/etcd-<version>/
// from a module of its own (go.mod, main.go) unless it is there.
func installEtcd(ctx context.Context, cacheDir string) (string, error) {
	dir := filepath.Join(cacheDir, "etcd-"+EtcdVersion)
	dst := filepath.Join(dir, "etcd")
	if isExecutable(dst) {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, ".install.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if isExecutable(dst) {
		return dst, nil
	}
	Logf("building etcd %s -> %s", EtcdVersion, dir)
	start := time.Now()
	src, err := os.MkdirTemp(dir, ".src-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module nri-gpu-e2e/etcd\n\ngo 1.26.0\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(etcdMain), 0o644); err != nil {
		return "", err
	}
	env := []string{"GOFLAGS=-mod=mod"}
	for _, args := range [][]string{{"get", "go.etcd.io/etcd/server/v3@" + EtcdVersion}, {"mod", "tidy"},
		{"build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, ".etcd.tmp"), "."}} {
		if _, err := gocmd(ctx, src, env, args...); err != nil {
			return "", err
		}
	}
	if err := os.Rename(filepath.Join(dir, ".etcd.tmp"), dst); err != nil {
		return "", err
	}
	Logf("built %s in %s", dst, time.Since(start).Round(100*time.Millisecond))
	return dst, nil
}
