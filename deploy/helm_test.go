package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// helmVersion is the Helm CLI the chart's tests run, the cluster phase's
// (harness.HelmVersion, install-cluster.sh, the Makefile's HELM_VERSION;
// TestHelmVersionPinned keeps them equal), so that one build serves both.
const helmVersion = "v4.3.1"

// chartDir is the chart, relative to this module.
const chartDir = "helm/nri-gpu"

var helmOnce struct {
	sync.Once
	path string
	err  error
}

// helmBinary is the Helm CLI: $NRI_GPU_HELM, else the e2e tool cache's
// <cache>/helm-<helmVersion>/helm ($NRI_GPU_E2E_CACHE, else
// ~/.cache/nri-gpu-e2e), built there with go install from the Go module
// proxy when missing (a few minutes, once), as install-cluster.sh does.
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		if p := os.Getenv("NRI_GPU_HELM"); p != "" {
			helmOnce.path = p
			return
		}
		cache := os.Getenv("NRI_GPU_E2E_CACHE")
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				helmOnce.err = err
				return
			}
			cache = filepath.Join(home, ".cache", "nri-gpu-e2e")
		}
		dir := filepath.Join(cache, "helm-"+helmVersion)
		helmOnce.path = filepath.Join(dir, "helm")
		if _, err := os.Stat(helmOnce.path); err == nil {
			return
		}
		helmOnce.err = goInstallHelm(t, dir)
	})
	if helmOnce.err != nil {
		t.Fatalf("the Helm CLI (set NRI_GPU_HELM, or let the test build it into the e2e tool cache): %v", helmOnce.err)
	}
	return helmOnce.path
}

// goInstallHelm builds helm.sh/helm/v4/cmd/helm@helmVersion into dir,
// with install-cluster.sh's flags.
func goInstallHelm(t *testing.T, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	scratch, err := os.MkdirTemp(dir, ".gobin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	start := time.Now()
	cmd := exec.Command("go", "install", "-trimpath", "-ldflags", "-s -w -X helm.sh/helm/v4/internal/version.version="+helmVersion,
		"helm.sh/helm/v4/cmd/helm@"+helmVersion)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOBIN="+scratch, "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go install helm.sh/helm/v4/cmd/helm@%s: %v\n%s", helmVersion, err, out)
	}
	t.Logf("built helm %s into %s in %s", helmVersion, dir, time.Since(start).Round(time.Second))
	return os.Rename(filepath.Join(scratch, "helm"), filepath.Join(dir, "helm"))
}

// runHelm runs the Helm CLI with args in this module's directory, with
// its own empty configuration and cache (no repositories, no
// kubeconfig), and returns stdout and, on failure, an error with stderr.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config",
		"HELM_DATA_HOME="+home+"/data", "KUBECONFIG="+home+"/none")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), &helmError{args: args, err: err, stderr: errb.String() + out.String()}
	}
	return out.String(), nil
}

type helmError struct {
	args   []string
	err    error
	stderr string
}

func (e *helmError) Error() string {
	return "helm " + strings.Join(e.args, " ") + ": " + e.err.Error() + "\n" + e.stderr
}

// helmTemplate renders the chart as release nri-gpu in namespace
// nri-gpu with the values files of values (maps, written as YAML) and
// the further args.
func helmTemplate(t *testing.T, values []map[string]any, args ...string) (string, error) {
	t.Helper()
	argv := []string{"template", "nri-gpu", chartDir, "--namespace", "nri-gpu"}
	for _, v := range values {
		argv = append(argv, "-f", valuesFile(t, v))
	}
	return runHelm(t, append(argv, args...)...)
}

// valuesFile writes v as a values file, in a directory of its own whose
// name holds no comma (helm splits -f at commas; t.TempDir is named
// after the test).
func valuesFile(t *testing.T, v map[string]any) string {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "nri-gpu-values-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestHelmVersionPinned: the chart tests' Helm is the cluster phase's, so
// that the e2e tool cache holds one build.
func TestHelmVersionPinned(t *testing.T) {
	for file, re := range map[string]string{
		"../test/e2e/harness/kubetools.go": `HelmVersion = "([^"]+)"`,
		"../test/e2e/install-cluster.sh":   `helm_version="([^"]+)"`,
		"../Makefile":                      `HELM_VERSION := (\S+)`,
	} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(re).FindSubmatch(data)
		if m == nil || string(m[1]) != helmVersion {
			t.Errorf("%s pins Helm %q, the chart tests %s", file, m, helmVersion)
		}
	}
}
