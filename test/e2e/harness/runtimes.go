package harness

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// Runtime names StartRuntimeForTest knows.
const (
	RuntimeContainerd24 = "containerd-2.4.2"
	RuntimeContainerd22 = "containerd-2.2.9"
	RuntimeContainerd17 = "containerd-1.7.36"
	RuntimeCRIO         = "crio-1.34.0" // "crio-" + CRIOVersion without its v
)

// Runtimes are the runtime names StartRuntimeForTest and StartRuntime know.
var Runtimes = []string{RuntimeContainerd24, RuntimeContainerd22, RuntimeContainerd17, RuntimeCRIO}

// CRIEndpointer is a runtime whose CRI endpoint other clients (a kubelet) can
// use, e.g. "unix:///tmp/nrie2e-1/c.sock".
type CRIEndpointer interface {
	CRIEndpoint() string
}

var (
	_ CRIEndpointer = (*Containerd)(nil)
	_ CRIEndpointer = (*CRIO)(nil)
)

// RuntimeOptions are the settings every runtime of StartRuntimeForTest takes.
type RuntimeOptions struct {
	// DefaultValidator enables NRI's default validator, which can require named
	// plugins per pod (annotation required-plugins.noderesource.dev/...). A
	// runtime whose NRI has none skips the test, saying so.
	DefaultValidator bool
	// NRIRegistrationTimeout and NRIRequestTimeout override the runtime's
	// defaults when non-zero.
	NRIRegistrationTimeout time.Duration
	NRIRequestTimeout      time.Duration
	// ExtraImages are imported next to the standard images.
	ExtraImages []*Image
	// Debug raises the runtime's log level.
	Debug bool
}

// RuntimeFromEnv is the runtime the suite runs on: $NRI_GPU_E2E_RUNTIME, else
// containerd-<$NRI_GPU_E2E_CONTAINERD_VERSION> (the older variable, kept as an
// alias), else containerd-2.4.2.
func RuntimeFromEnv() string {
	if r := os.Getenv("NRI_GPU_E2E_RUNTIME"); r != "" {
		return r
	}
	if v := os.Getenv("NRI_GPU_E2E_CONTAINERD_VERSION"); v != "" {
		return "containerd-" + strings.TrimPrefix(v, "v")
	}
	return RuntimeContainerd24
}

// ContainerdVersionOf returns the containerd version ("v1.7.36") of a runtime
// name, or "" when name is not a containerd.
func ContainerdVersionOf(name string) string {
	if v, ok := strings.CutPrefix(name, "containerd-"); ok && v != "" {
		return "v" + v
	}
	return ""
}

// StartRuntimeForTest starts the runtime called name ("" = RuntimeFromEnv())
// for a test and stops it when the test ends (printing its log tail if the test
// failed). It skips the test when not root, or when opts ask for what the
// runtime lacks, saying why.
func StartRuntimeForTest(t testing.TB, name string, opts RuntimeOptions) Runtime {
	t.Helper()
	if name == "" {
		name = RuntimeFromEnv()
	}
	switch name {
	case RuntimeContainerd24, RuntimeContainerd22, RuntimeContainerd17:
		v := ContainerdVersionOf(name)
		if opts.DefaultValidator {
			if major, _ := parseVersion(v); major < 2 {
				t.Skipf("%s has no NRI default validator (its NRI is v0.8.0; validators and required-plugins came with NRI v0.10): nothing can refuse a container whose required plugin is absent", name)
			}
		}
		tools, imgs := SetupForTest(t, v)
		return StartForTest(t, ContainerdOptions{
			Tools: tools, Images: imgs, ExtraImages: opts.ExtraImages,
			DefaultValidator:       opts.DefaultValidator,
			NRIRegistrationTimeout: opts.NRIRegistrationTimeout,
			NRIRequestTimeout:      opts.NRIRequestTimeout,
			Debug:                  opts.Debug,
		})
	case RuntimeCRIO:
		if opts.DefaultValidator {
			t.Skipf("%s has no NRI default validator (its NRI is a v0.9 pre-release; validators and required-plugins came with NRI v0.10): nothing can refuse a container whose required plugin is absent", name)
		}
		return StartCRIOForTest(t, crioOptions(opts))
	default:
		t.Fatalf("unknown runtime %q (NRI_GPU_E2E_RUNTIME): want one of %s", name, strings.Join(Runtimes, ", "))
		return nil
	}
}

// StartRuntime starts the runtime called name outside a test (the demo, the
// benchmark); the caller stops it.
func StartRuntime(ctx context.Context, name string, opts RuntimeOptions) (Runtime, error) {
	switch name {
	case RuntimeContainerd24, RuntimeContainerd22, RuntimeContainerd17:
		tools, err := InstallTools(ctx, "", ContainerdVersionOf(name))
		if err != nil {
			return nil, err
		}
		imgs, err := BuildImages(ctx, "")
		if err != nil {
			return nil, err
		}
		return StartContainerd(ctx, ContainerdOptions{
			Tools: tools, Images: imgs, ExtraImages: opts.ExtraImages,
			DefaultValidator:       opts.DefaultValidator,
			NRIRegistrationTimeout: opts.NRIRegistrationTimeout,
			NRIRequestTimeout:      opts.NRIRequestTimeout,
			Debug:                  opts.Debug,
		})
	case RuntimeCRIO:
		tools, err := InstallTools(ctx, "", "")
		if err != nil {
			return nil, err
		}
		crio, err := InstallCRIO(ctx, "")
		if err != nil {
			return nil, err
		}
		imgs, err := BuildImages(ctx, "")
		if err != nil {
			return nil, err
		}
		o := crioOptions(opts)
		o.Tools, o.CRIO, o.Images = tools, crio, imgs
		return StartCRIO(ctx, o)
	default:
		return nil, fmt.Errorf("unknown runtime %q: want one of %s", name, strings.Join(Runtimes, ", "))
	}
}

// crioOptions are the CRIOOptions of opts (CRI-O has no default validator).
func crioOptions(opts RuntimeOptions) CRIOOptions {
	return CRIOOptions{
		ExtraImages:            opts.ExtraImages,
		NRIRegistrationTimeout: opts.NRIRegistrationTimeout,
		NRIRequestTimeout:      opts.NRIRequestTimeout,
		Debug:                  opts.Debug,
	}
}
