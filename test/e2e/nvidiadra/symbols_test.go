package nvidiadra

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// moduleDir downloads mod@version with the go command and returns its
// directory in the module cache.
func moduleDir(t *testing.T, modVersion string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", modVersion)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	_ = json.Unmarshal(out, &m)
	if err != nil || m.Dir == "" {
		t.Fatalf("go mod download %s: %v %s\n%s", modVersion, err, m.Error, stderr.String())
	}
	return m.Dir
}

// goNVMLVersion is the version of github.com/NVIDIA/go-nvml that NVIDIA's
// DRA driver harness.NVIDIADRAVersion requires.
func goNVMLVersion(t *testing.T) string {
	t.Helper()
	dir := moduleDir(t, harness.NVIDIADRAModule+"@"+harness.NVIDIADRAVersion)
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if m := goNVMLRequire.FindSubmatch(data); m != nil {
		return string(m[1])
	}
	t.Fatalf("%s@%s requires no github.com/NVIDIA/go-nvml", harness.NVIDIADRAModule, harness.NVIDIADRAVersion)
	return ""
}

// goNVMLRequire finds go-nvml's version in a go.mod's require block.
var goNVMLRequire = regexp.MustCompile(`(?m)^\s*github\.com/NVIDIA/go-nvml (v\S+)`)

// cCall is a call of an NVML function in go-nvml's cgo bindings.
var cCall = regexp.MustCompile(`C\.(nvml\w+)\(`)

// TestSimulatedNVMLBindsAsGoNVML reads the functions go-nvml's cgo
// bindings call (its pkg/nvml sources, at the version NVIDIA's DRA driver
// requires, from the Go module proxy) and checks that simnode lists
// exactly those and that the simulated libnvidia-ml.so.1 exports each:
// go-nvml loads the library lazily, and the first call of a function it
// lacks kills NVIDIA's driver with "symbol lookup error".
func TestSimulatedNVMLBindsAsGoNVML(t *testing.T) {
	v := goNVMLVersion(t)
	dir := filepath.Join(moduleDir(t, "github.com/NVIDIA/go-nvml@"+v), "pkg", "nvml")
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range cCall.FindAllSubmatch(data, -1) {
			set[string(m[1])] = true
		}
	}
	var bound []string
	for s := range set {
		bound = append(bound, s)
	}
	sort.Strings(bound)
	t.Logf("go-nvml %s binds %d NVML functions", v, len(bound))
	if len(bound) < 100 {
		t.Fatalf("found only %d C.nvml* calls in %s", len(bound), dir)
	}
	listed := simnode.NVMLSymbols()
	sort.Strings(listed)
	if !slices.Equal(listed, bound) {
		for _, s := range bound {
			if !slices.Contains(listed, s) {
				t.Errorf("go-nvml %s binds %s, which test/simnode/nvml_symbols.txt does not list", v, s)
			}
		}
		for _, s := range listed {
			if !slices.Contains(bound, s) {
				t.Errorf("test/simnode/nvml_symbols.txt lists %s, which go-nvml %s does not bind", s, v)
			}
		}
	}

	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	lib, err := elf.Open(n.HostPath(filepath.Join(n.LibDir, "libnvidia-ml.so.1")))
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	syms, err := lib.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			defined[s.Name] = true
		}
	}
	missing := 0
	for _, s := range bound {
		if !defined[s] {
			missing++
			t.Errorf("the simulated libnvidia-ml.so.1 does not export %s, which go-nvml %s binds", s, v)
		}
	}
	t.Logf("the simulated library exports %d of them (%d implemented, the rest NOT_SUPPORTED)", len(bound)-missing, len(simnode.NVMLImplemented()))
}
