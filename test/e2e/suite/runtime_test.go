package suite

import (
	"testing"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// onCRIO reports whether the suite runs on CRI-O (NRI_GPU_E2E_RUNTIME=crio-1.34.0).
func onCRIO() bool { return runtimeName() == harness.RuntimeCRIO }

// skipOnCRIO skips a test that needs what CRI-O 1.34 lacks, saying what.
func skipOnCRIO(t *testing.T, why string) {
	t.Helper()
	if onCRIO() {
		t.Skipf("not on %s: %s", harness.RuntimeCRIO, why)
	}
}
