package suite

import (
	"os"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// runtimeEnv names the runtime the suite runs on: "crio-1.34.0" for CRI-O;
// empty (or a containerd-* name) for containerd, whose version
// NRI_GPU_E2E_CONTAINERD_VERSION picks.
const runtimeEnv = "NRI_GPU_E2E_RUNTIME"

// crioName is the CRI-O the suite can run on.
var crioName = "crio-" + strings.TrimPrefix(harness.CRIOVersion, "v")

// onCRIO reports whether the suite runs on CRI-O; another name that is not
// containerd's fails the test.
func onCRIO(t testing.TB) bool {
	t.Helper()
	switch name := os.Getenv(runtimeEnv); {
	case name == crioName:
		return true
	case name == "" || strings.HasPrefix(name, "containerd-"):
		return false
	default:
		t.Fatalf("%s=%q: valid are %s and containerd-<version>", runtimeEnv, name, crioName)
		return false
	}
}

// startRuntime starts the runtime the suite runs on for a test: containerd
// with opts, or CRI-O with what of opts it has (NRI's timeouts).
func startRuntime(t *testing.T, opts harness.ContainerdOptions) harness.Runtime {
	t.Helper()
	if onCRIO(t) {
		return harness.StartCRIOForTest(t, harness.CRIOOptions{
			NRIRegistrationTimeout: opts.NRIRegistrationTimeout,
			NRIRequestTimeout:      opts.NRIRequestTimeout,
		})
	}
	return harness.StartForTest(t, opts)
}

// skipOnCRIO skips a test that needs what CRI-O 1.34 lacks.
func skipOnCRIO(t *testing.T, why string) {
	t.Helper()
	if onCRIO(t) {
		t.Skipf("not on %s: %s", crioName, why)
	}
}

// runtimeName is the name of the runtime the suite runs on, for messages.
func runtimeName(t testing.TB) string {
	if onCRIO(t) {
		return crioName
	}
	return "containerd " + harness.VersionFromEnv()
}
