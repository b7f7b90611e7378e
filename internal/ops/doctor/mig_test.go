package doctor

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// resultOf returns the verdict of the check named name.
func resultOf(t *testing.T, results []Result, name string) Result {
	t.Helper()
	for _, r := range results {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no check %q in\n%s", name, report(results))
	return Result{}
}

// TestNVMLMIG: on the simulated node, the NVML/MIG check says where NVML
// was loaded from and its version, each GPU's MIG mode, and how many of
// the MIG devices NVML reports mig-minors numbers under the nvidia-caps
// major; it fails when mig-minors is gone (no MIG device is offered then)
// and warns when NVML cannot be loaded.
func TestNVMLMIG(t *testing.T) {
	needNodes(t)
	f := newFixture(t, simnode.Options{NumGPUs: 3})

	// No MIG: NVML and the modes.
	results := Run(f.o)
	r := resultOf(t, results, "NVML/MIG")
	if r.Layer != UserSpace || r.Status != Pass || !strings.Contains(r.Verdict, "NVML 12.580.126.09 (driver 580.126.09) from ") ||
		!strings.Contains(r.Verdict, "libnvidia-ml.so") || !strings.Contains(r.Verdict, "GPU 0 MIG off, GPU 1 MIG off, GPU 2 MIG off; XID health available") {
		t.Errorf("without MIG: %s %q", r.Status, r.Verdict)
	}

	// MIG on GPUs 0 and 1: 11 MIG devices, all numbered.
	if err := f.n.SetMIG(simnode.MixedMIG()); err != nil {
		t.Fatal(err)
	}
	major, err := f.n.CapsMajor()
	if err != nil {
		t.Fatal(err)
	}
	results = Run(f.o)
	expect(t, results, "NVML/MIG", Pass, fmt.Sprintf("GPU 0 MIG on, 7 MIG devices, GPU 1 MIG on, 4 MIG devices, GPU 2 MIG off; 11 of 11 MIG devices numbered (mig-minors numbers 480 GPU and 3840 compute instances, nvidia-caps major %d)", major))
	if !OK(results) {
		t.Errorf("a MIG node fails:\n%s", report(results))
	}

	// mig-minors gone: NVML's MIG devices cannot be numbered.
	f.remove(t, "/proc/driver/nvidia-caps/mig-minors")
	expect(t, Run(f.o), "NVML/MIG", Fail, "0 of 11 MIG devices numbered (mig-minors missing, nvidia-caps major")

	// NVML that cannot be loaded: a warning, whole GPUs.
	openNVML = func(string) (nvmlLib, error) { return nil, fmt.Errorf("nvmlInit_v2: Driver Not Loaded (9)") }
	t.Cleanup(func() { openNVML = realOpenNVML })
	expect(t, Run(f.o), "NVML/MIG", Warn, "nvmlInit_v2: Driver Not Loaded (9): nri-gpu serves whole GPUs, no MIG devices, no XID health")
}
