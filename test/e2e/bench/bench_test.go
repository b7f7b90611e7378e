package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
)

// TestMain lets the test binary serve as the floor plugin too: the
// benchmark starts its own executable with FixedPluginEnv set.
func TestMain(m *testing.M) {
	RunFixedPluginIfAsked()
	os.Exit(m.Run())
}

// buildNRIGPU builds cmd/nri-gpu of this checkout into a temp dir.
func buildNRIGPU(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..", "..")
	bin := filepath.Join(t.TempDir(), "nri-gpu")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/nri-gpu")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building nri-gpu: %v\n%s", err, out)
	}
	return bin
}

// TestBenchSmoke runs the benchmark's every path for a few rounds, so that
// the benchmark cannot rot: each case's container must start and, checked
// from inside it once, have the GPU nodes it asked for and working driver
// libraries (and, for the toolkit paths, an ld.so.cache the
// update-ldcache hook rewrote). It asserts nothing about times.
func TestBenchSmoke(t *testing.T) {
	harness.SetupForTest(t, harness.DefaultContainerdVersion) // root, tools, images
	bin := buildNRIGPU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log bytes.Buffer
	env, err := Setup(ctx, Options{NRIGPU: bin, NVIDIARuntime: true, Log: &log})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		env.Close()
		if t.Failed() {
			t.Logf("--- benchmark log ---\n%s", log.String())
		}
	})
	main := MainCases(append(append([]string(nil), MainPaths[1:]...), DiagnosticPaths...))
	scaling := []*Case{{Name: Baseline, Path: Baseline}, {Name: scalingName(NRIGPU, 8, "all"), Path: NRIGPU, GPUs: 8, Caps: "all", Mode: "auto"},
		{Name: scalingName(Toolkit, 4, ""), Path: Toolkit, GPUs: 4, Mode: "auto"}}
	files := FilesCases()
	if err := env.Prepare(append(append(append([]*Case(nil), main...), scaling...), files...)); err != nil {
		t.Fatal(err)
	}

	const rounds = 3
	check := func(r *Result, err error) *Result {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range r.Cases {
			if n := len(r.Samples[c.Name]); n != rounds {
				t.Errorf("%s: %d samples, want %d", c.Name, n, rounds)
			}
			t.Logf("%-24s %s", c.Name, r.Info[c.Name])
		}
		return r
	}
	r := check(env.Run(ctx, main, rounds))
	for name, want := range map[string]string{
		Floor:               "1 GPU nodes, 4 devices, 12 mounts, 0 hooks, binaries on PATH",
		NRIGPU:              "1 GPU nodes, 4 devices, 12 mounts, 0 hooks, binaries on PATH",
		CDI:                 "1 GPU nodes, 4 devices",
		Toolkit:             "4 hooks, ld.so.cache updated by the hook",
		NVIDIARuntime:       "ld.so.cache updated by the hook",
		NRIGPUToolkitLayout: "1 GPU nodes, 4 devices, 16 mounts, 0 hooks, binaries at /usr/bin",
		CDIToolkitLayout:    "1 GPU nodes, 4 devices, 16 mounts, 0 hooks, binaries at /usr/bin",
		FloorDevices:        "1 GPU nodes, 4 devices, 10 mounts",
		FloorLibDir:         "1 GPU nodes, 4 devices, 11 mounts",
		FloorToolkitLayout:  "1 GPU nodes, 4 devices, 16 mounts, 0 hooks, binaries at /usr/bin",
		FloorFirmware:       "1 GPU nodes, 4 devices, 13 mounts, 0 hooks, binaries on PATH",
	} {
		if !strings.Contains(r.Info[name], want) {
			t.Errorf("%s got %q, want it to contain %q", name, r.Info[name], want)
		}
	}
	// nri-gpu, its floor and containerd's CDI of the same edits give the
	// container the same spec.
	if r.Info[NRIGPU] != r.Info[Floor] || r.Info[NRIGPU] != r.Info[CDI] {
		t.Errorf("nri-gpu %q, floor %q and cdi %q differ", r.Info[NRIGPU], r.Info[Floor], r.Info[CDI])
	}
	if r.Info[NRIGPUToolkitLayout] != r.Info[FloorToolkitLayout] || r.Info[NRIGPUToolkitLayout] != r.Info[CDIToolkitLayout] {
		t.Errorf("layout toolkit: nri-gpu %q, floor %q and cdi %q differ", r.Info[NRIGPUToolkitLayout], r.Info[FloorToolkitLayout], r.Info[CDIToolkitLayout])
	}
	// nri-gpu with its library cache through a second mount: the same
	// spec, its library directory mounted from the cache of copies
	// (checked from inside the container and on the cache's inodes).
	if got := r.Info[NRIGPUCopy]; !strings.HasPrefix(got, r.Info[NRIGPU]+", libraries from the copy cache (") {
		t.Errorf("%s got %q, want nri-gpu's %q with its libraries from the copy cache", NRIGPUCopy, got, r.Info[NRIGPU])
	}
	var out bytes.Buffer
	WriteTable(&out, r, Floor)
	WriteLayoutChoice(&out, r)
	WriteLayout(&out, r)
	WriteTargets(&out, r)
	if !strings.Contains(out.String(), pathLabels[NVIDIARuntime]) || !strings.Contains(out.String(), "Library cache of copies (nri-gpu-copy) over hard links") || !strings.Contains(out.String(), "target: nri-gpu <= 0.75x the toolkit path") ||
		!strings.Contains(out.String(), "layout: toolkit (nri-gpu-toolkit-layout) over the default layout (nri-gpu)") {
		t.Errorf("report lacks rows or targets:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())

	r = check(env.Run(ctx, scaling, rounds))
	if got := r.Info[scalingName(NRIGPU, 8, "all")]; !strings.HasPrefix(got, "8 GPU nodes") {
		t.Errorf("nri-gpu 8 GPUs: %q", got)
	}

	if err := env.StartNRIGPU("files"); err != nil {
		t.Fatal(err)
	}
	r = check(env.Run(ctx, files, rounds))
	if r.Info["nri-gpu (files)"] != r.Info["floor (files)"] {
		t.Errorf("nri-gpu (files) %q and its floor %q differ", r.Info["nri-gpu (files)"], r.Info["floor (files)"])
	}

	// emit: cdi: containerd resolves nri-gpu's CDI references from its
	// generated spec; the container gets what the edits give.
	if err := env.StartNRIGPU(EmitCDIMode); err != nil {
		t.Fatal(err)
	}
	r = check(env.Run(ctx, EmitCDICases(), rounds))
	if r.Info["nri-gpu (emit: cdi)"] != r.Info[EmitCDIFloor] {
		t.Errorf("nri-gpu (emit: cdi) %q and the floor %q differ", r.Info["nri-gpu (emit: cdi)"], r.Info[EmitCDIFloor])
	}
	if !strings.Contains(env.nriGPU.out.String(), "emit=cdi") {
		t.Errorf("nri-gpu did not answer with CDI references:\n%s", env.nriGPU.out.String())
	}
}
