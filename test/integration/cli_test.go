package integration

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// TestInventoryCommand checks `nri-gpu inventory` against a simulated node
// in both output formats.
func TestInventoryCommand(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	n, cfg := simNode(t, dir, simnode.LayoutDebian)

	out, err := exec.Command(binary, "inventory", "--config", cfg, "-o", "json").Output()
	if err != nil {
		t.Fatalf("inventory -o json: %v", err)
	}
	var v struct {
		DriverVersion string `json:"driverVersion"`
		KernelRelease string `json:"kernelRelease"`
		GPUs          []struct {
			Index int    `json:"index"`
			Minor int    `json:"minor"`
			UUID  string `json:"uuid"`
			BusID string `json:"busId"`
			Model string `json:"model"`
			DRM   []struct {
				Path string `json:"path"`
			} `json:"drm"`
		} `json:"gpus"`
		ControlNodes []struct {
			Path  string `json:"path"`
			Major int    `json:"major"`
		} `json:"controlNodes"`
		Files []struct {
			Kind, Capability, Name, HostPath string
		} `json:"files"`
		Warnings []string `json:"warnings"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if v.DriverVersion != n.DriverVersion || len(v.GPUs) != len(n.GPUs) || len(v.Warnings) != 0 {
		t.Fatalf("inventory = %+v", v)
	}
	for i, g := range v.GPUs {
		w := n.GPUs[i]
		if g.Index != w.Index || g.Minor != w.Minor || g.UUID != w.UUID || g.BusID != w.BusID || g.Model != w.Model {
			t.Errorf("GPU %d = %+v, want %+v", i, g, w)
		}
		if len(g.DRM) != 2 || g.DRM[0].Path != simnode.CardPath(i) || g.DRM[1].Path != simnode.RenderPath(i) {
			t.Errorf("GPU %d DRM nodes %+v, want %s and %s", i, g.DRM, simnode.CardPath(i), simnode.RenderPath(i))
		}
	}
	// A file is listed once per place a container finds it (the X.Org
	// GLX module twice), the firmware as one directory for two files.
	want := -1
	for _, f := range n.Files {
		want += max(1, len(f.Container))
	}
	if len(v.ControlNodes) != 4 || len(v.Files) != want {
		t.Errorf("%d control nodes, %d files (want %d)", len(v.ControlNodes), len(v.Files), want)
	}

	out, err = exec.Command(binary, "inventory", "--config", cfg).Output()
	if err != nil {
		t.Fatal(err)
	}
	if v.KernelRelease != simnode.DefaultKernelRelease {
		t.Errorf("kernelRelease %q, want %q", v.KernelRelease, simnode.DefaultKernelRelease)
	}
	for _, want := range []string{"Driver version: " + n.DriverVersion, "Kernel: " + simnode.DefaultKernelRelease, n.GPUs[0].UUID, "/dev/nvidia-uvm", "libcuda.so.1", "nvidia-smi", simnode.RenderPath(0), "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"version"}, 0, "nri-gpu "},
		{[]string{}, 2, "Usage:"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"inventory", "-o", "yaml"}, 2, `unknown format "yaml" (valid: table, json)`},
		{[]string{"run", "--log-level", "loud"}, 2, "--log-level"},
		{[]string{"run", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"run", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"status", "-o", "yaml"}, 2, `unknown format "yaml" (valid: table, json)`},
		{[]string{"status", "--status-socket", "/nonexistent/status.sock"}, 1, "cannot reach the plugin on /nonexistent/status.sock"},
		{[]string{"status", "--ready", "--status-socket", "/nonexistent/status.sock"}, 1, "cannot reach the plugin"},
		{[]string{"cleanup", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"cleanup", "--config", "/nonexistent/config.yaml"}, 1, "/nonexistent/config.yaml"},
	} {
		out, err := exec.Command(binary, tc.args...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("nri-gpu %q: exit %d, output %q; want exit %d and %q", tc.args, code, out, tc.code, tc.want)
		}
	}
}
