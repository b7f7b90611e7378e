package require

import (
	"runtime"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/inventory"
)

func TestCheck(t *testing.T) {
	node := NodeFacts{CUDA: "13.0", Driver: "580.126.09"}
	h100 := []inventory.GPU{{Index: 0, Model: "NVIDIA H100 80GB HBM3"}}
	t4 := []inventory.GPU{{Index: 0, Model: "Tesla T4"}}
	mixed := []inventory.GPU{{Index: 0, Model: "NVIDIA H100 80GB HBM3"}, {Index: 1, Model: "Tesla T4"}}
	for _, tc := range []struct {
		name string
		env  []string
		gpus []inventory.GPU
		fail string // empty: holds
	}{
		{"no requirement", nil, h100, ""},
		{"cuda met", []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.8"}, h100, ""},
		{"cuda equal", []string{"NVIDIA_REQUIRE_CUDA=cuda>=13.0"}, h100, ""},
		{"cuda unmet", []string{"NVIDIA_REQUIRE_CUDA=cuda>=13.1"}, h100,
			"nri-gpu: env NVIDIA_REQUIRE_CUDA: requirement error: unsatisfied condition: cuda>=13.1, please update your driver to a newer version, or use an earlier cuda container"},
		// nvidia/cuda:12.8 images: the first term holds on a 13.0 driver.
		{"nvidia/cuda image", []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=unknown,driver>=470,driver<471 brand=tesla,driver>=535,driver<536"}, h100, ""},
		{"OR: second term holds", []string{"NVIDIA_REQUIRE_CUDA=cuda>=14.0 brand=tesla,driver>=535"}, t4, ""},
		{"OR: no term holds", []string{"NVIDIA_REQUIRE_CUDA=cuda>=14.0 brand=tesla,driver>=535"}, h100, "unsatisfied condition: cuda>=14.0 brand=tesla,driver>=535"},
		{"AND within a term", []string{"NVIDIA_REQUIRE_X=driver>=580,driver<581"}, h100, ""},
		{"AND within a term fails", []string{"NVIDIA_REQUIRE_X=driver>=570,driver<580"}, h100, "env NVIDIA_REQUIRE_X"},
		{"variables AND", []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_ARCH=arch>=9.0"}, h100, ""},
		{"variables AND fails", []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_ARCH=arch>=9.0"}, t4, "env NVIDIA_REQUIRE_ARCH"},
		{"arch holds for every GPU", []string{"NVIDIA_REQUIRE_ARCH=arch>=7.5"}, mixed, ""},
		{"arch must hold for every GPU", []string{"NVIDIA_REQUIRE_ARCH=arch>=8.0"}, mixed, "arch>=8.0"},
		{"unknown model has no arch", []string{"NVIDIA_REQUIRE_ARCH=arch>=1.0"}, []inventory.GPU{{Model: "Mystery"}}, "arch>=1.0"},
		{"brand", []string{"NVIDIA_REQUIRE_BRAND=brand=tesla"}, t4, ""},
		{"brand !=", []string{"NVIDIA_REQUIRE_BRAND=brand!=tesla"}, t4, "brand!=tesla"},
		{"no GPU: arch and brand hold", []string{"NVIDIA_REQUIRE_BRAND=brand=tesla,arch>=99"}, nil, ""},
		{"disabled", []string{"NVIDIA_DISABLE_REQUIRE=true", "NVIDIA_REQUIRE_CUDA=cuda>=99"}, h100, ""},
		{"disable=false checks", []string{"NVIDIA_DISABLE_REQUIRE=false", "NVIDIA_REQUIRE_CUDA=cuda>=99"}, h100, "cuda>=99"},
		{"jetpack ignored", []string{"NVIDIA_REQUIRE_JETPACK=csv-mounts=all"}, h100, ""},
		{"legacy CUDA_VERSION", []string{"CUDA_VERSION=13.1.0"}, h100, "env CUDA_VERSION: requirement error: unsatisfied condition: cuda>=13.1"},
		{"legacy CUDA_VERSION met", []string{"CUDA_VERSION=12.4.1"}, h100, ""},
		{"CUDA_VERSION ignored with NVIDIA_REQUIRE_CUDA", []string{"CUDA_VERSION=99.0", "NVIDIA_REQUIRE_CUDA=cuda>=12"}, h100, ""},
		{"empty requirement holds", []string{"NVIDIA_REQUIRE_CUDA= "}, h100, ""},
		{"unknown property", []string{"NVIDIA_REQUIRE_CUDA=cudnn>=9"}, h100, `requirement error: invalid expression "cudnn>=9": unknown property "cudnn"`},
		{"bad operator", []string{"NVIDIA_REQUIRE_CUDA=cuda=>12"}, h100, `invalid expression "cuda=>12"`},
		{"bad version", []string{"NVIDIA_REQUIRE_CUDA=cuda>=twelve"}, h100, `"twelve" is not a version`},
		{"unknown CUDA version", []string{"NVIDIA_REQUIRE_CUDA=cuda>=1.0"}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := node
			if tc.name == "unknown CUDA version" {
				n.CUDA = ""
				tc.fail = "cuda>=1.0"
			}
			err := Check(tc.env, n, tc.gpus)
			switch {
			case tc.fail == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.fail != "" && (err == nil || !strings.Contains(err.Error(), tc.fail)):
				t.Errorf("error %v, want one containing %q", err, tc.fail)
			}
		})
	}
}

func TestGPUArchAndBrand(t *testing.T) {
	for _, tc := range []struct{ model, arch, brand string }{
		{"NVIDIA H100 80GB HBM3", "9.0", "nvidia"},
		{"NVIDIA H200", "9.0", "nvidia"},
		{"NVIDIA A100-SXM4-80GB", "8.0", "nvidia"},
		{"NVIDIA A10", "8.6", "nvidia"},
		{"NVIDIA L40S", "8.9", "nvidia"},
		{"Tesla T4", "7.5", "tesla"},
		{"Tesla V100-SXM2-16GB", "7.0", "tesla"},
		{"NVIDIA GeForce RTX 4090", "8.9", "geforcertx"},
		{"Quadro RTX 6000", "7.5", "quadrortx"},
		{"NVIDIA RTX A6000", "8.6", "nvidiartx"},
		{"NVIDIA B200", "10.0", "nvidia"},
		{"Something new", "", "nvidia"},
	} {
		if a, b := GPUArch(tc.model), GPUBrand(tc.model); a != tc.arch || b != tc.brand {
			t.Errorf("%q: arch %q brand %q, want %q %q", tc.model, a, b, tc.arch, tc.brand)
		}
	}
}

// FuzzRequirement fuzzes NVIDIA_REQUIRE_* expressions.
func FuzzRequirement(f *testing.F) {
	for _, s := range []string{"cuda>=12.8", "cuda>=12.8 brand=tesla,driver>=470,driver<471", "arch>=9.0", "brand!=geforce",
		"cudnn>=9", "cuda=>12", "driver>=1.2.3.4.5", ",,, ,", "cuda>=99999999999"} {
		f.Add(s)
	}
	gpus := []inventory.GPU{{Index: 0, Model: "NVIDIA H100 80GB HBM3"}, {Index: 1, Model: "Tesla T4"}}
	f.Fuzz(func(t *testing.T, expr string) {
		_, perr := ParseRequirement(expr)
		err := Check([]string{"NVIDIA_REQUIRE_CUDA=" + expr}, NodeFacts{CUDA: "13.0", Driver: "580.126.09"}, gpus)
		if perr != nil && err == nil {
			t.Fatalf("ParseRequirement(%q) failed (%v) but the check passed", expr, perr)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "nri-gpu: env NVIDIA_REQUIRE_CUDA: requirement error: ") {
			t.Fatalf("error %q", err)
		}
	})
}

// FuzzCheckEnv fuzzes a whole environment, one entry a line, with
// adversarial shapes: many requirement variables, repeated ones, long
// expressions, entries sharing their prefix. One call allocates at most a
// bounded multiple of its input, and an error names a variable.
func FuzzCheckEnv(f *testing.F) {
	f.Add("NVIDIA_REQUIRE_CUDA=cuda>=12.0\nCUDA_VERSION=12.4.1")
	f.Add(strings.Repeat("NVIDIA_REQUIRE_X=cuda>=1.0\n", 40))
	f.Add(strings.Repeat("NVIDIA_REQUIRE_CUDA=cuda>=1.0\n", 20) + "NVIDIA_DISABLE_REQUIRE=true")
	f.Add("NVIDIA_REQUIRE_A=" + strings.Repeat("cuda>=1.0,driver>=1 ", 200) + "\nNVIDIA_REQUIRE_B=" + strings.Repeat("arch>=9.0 ", 400))
	f.Add(strings.Repeat("NVIDIA_REQUIREX=1\n", 3000) + "CUDA_VERSION=" + strings.Repeat("9", 5000))
	gpus := []inventory.GPU{{Index: 0, Model: "NVIDIA H100 80GB HBM3"}, {Index: 1, Model: "Tesla T4"}}
	f.Fuzz(func(t *testing.T, blob string) {
		env := strings.Split(blob, "\n")
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := Check(env, NodeFacts{CUDA: "13.0", Driver: "580.126.09"}, gpus)
		runtime.ReadMemStats(&after)
		if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(16*len(blob)+64<<10); got > limit {
			t.Fatalf("allocated %d bytes for %d bytes of input (limit %d)", got, len(blob), limit)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "nri-gpu: env") {
			t.Fatalf("error %q", err)
		}
	})
}
