package adjust

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// nvidiaLayout is the default layout (config layout: nvidia) with prepared
// directories: /usr/local/nvidia/{bin,lib64,lib}, one mount each.
var nvidiaLayout = Layout{
	LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib", BinaryDir: "/usr/local/nvidia/bin",
	HostLibraryDirs: map[inventory.Capabilities]string{
		inventory.Capabilities(inventory.Compute):                          "/cache/lib-compute",
		inventory.Capabilities(inventory.Utility):                          "/cache/lib-utility",
		inventory.DefaultCapabilities:                                      "/cache/lib-compute+utility",
		inventory.DefaultCapabilities.With(inventory.Graphics):             "/cache/lib-all",
		inventory.Capabilities(inventory.Compute).With(inventory.Graphics): "/cache/lib-compute+graphics",
	},
	HostLibrary32Dirs: map[inventory.Capabilities]string{inventory.Capabilities(inventory.Compute): "/cache/lib32-compute"},
	HostBinaryDirs: map[inventory.Capabilities]string{
		inventory.DefaultCapabilities:             "/cache/bin-compute+utility",
		inventory.Capabilities(inventory.Utility): "/cache/bin-utility",
		inventory.Capabilities(inventory.Compute): "/cache/bin-compute",
	},
	SkipFirmware: true,
}

// envOf returns the adjustment's environment as KEY=VALUE.
func envOf(e Edits, env []string) []string {
	var out []string
	for _, kv := range e.Adjustment(env).Env {
		out = append(out, kv.Key+"="+kv.Value)
	}
	return out
}

// TestNVIDIALayout checks the default layout: the libraries, the 32-bit
// libraries of compat32 and the binaries come as one directory mount
// each, at /usr/local/nvidia/lib64, /usr/local/nvidia/lib and
// /usr/local/nvidia/bin, and nothing is mounted at /usr/bin.
func TestNVIDIALayout(t *testing.T) {
	p := Prepare(snapshot(), nvidiaLayout)
	e := p.Edits(nil, inventory.DefaultCapabilities)
	if diff := cmp.Diff([]inventory.Mount{
		{Source: "/cache/lib-compute+utility", Destination: "/usr/local/nvidia/lib64"},
		{Source: "/cache/bin-compute+utility", Destination: "/usr/local/nvidia/bin"},
	}, e.Mounts); diff != "" {
		t.Errorf("compute,utility mounts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"/usr/local/nvidia/bin"}, e.BinaryDirs); diff != "" {
		t.Errorf("binary dirs (-want +got):\n%s", diff)
	}

	e32 := p.Edits(nil, inventory.Capabilities(inventory.Compute).With(inventory.Compat32))
	if diff := cmp.Diff([]inventory.Mount{
		{Source: "/cache/lib-compute", Destination: "/usr/local/nvidia/lib64"},
		{Source: "/cache/lib32-compute", Destination: "/usr/local/nvidia/lib"},
		{Source: "/cache/bin-compute", Destination: "/usr/local/nvidia/bin"},
	}, e32.Mounts); diff != "" {
		t.Errorf("compute,compat32 mounts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"}, e32.LibraryDirs); diff != "" {
		t.Errorf("compute,compat32 library dirs (-want +got):\n%s", diff)
	}
	for _, m := range append(e.Mounts, e32.Mounts...) {
		if strings.HasPrefix(m.Destination, "/usr/bin/") {
			t.Errorf("mount at /usr/bin in the nvidia layout: %+v", m)
		}
	}
}

// TestNVIDIALayoutEnv checks the environment the default layout gives
// each kind of image: PATH and LD_LIBRARY_PATH get the directories
// appended only where the image's (or the pod spec's) value lacks them,
// and an nvidia/cuda-like image, which lists both already, keeps its
// environment as it is.
func TestNVIDIALayoutEnv(t *testing.T) {
	p := Prepare(snapshot(), nvidiaLayout)
	e := p.Edits(snapshot().GPUs[:1], inventory.DefaultCapabilities)
	visible := "NVIDIA_VISIBLE_DEVICES=" + snapshot().GPUs[0].UUID
	for _, tc := range []struct {
		name string
		env  []string
		want []string
	}{
		{"no env (containerd's default PATH)", nil, []string{visible,
			"LD_LIBRARY_PATH=/usr/local/nvidia/lib64",
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/nvidia/bin"}},
		{"image PATH", []string{"PATH=/usr/bin:/bin"}, []string{visible,
			"LD_LIBRARY_PATH=/usr/local/nvidia/lib64", "PATH=/usr/bin:/bin:/usr/local/nvidia/bin"}},
		{"pod spec LD_LIBRARY_PATH", []string{"PATH=/bin", "LD_LIBRARY_PATH=/opt/app/lib"}, []string{visible,
			"LD_LIBRARY_PATH=/opt/app/lib:/usr/local/nvidia/lib64", "PATH=/bin:/usr/local/nvidia/bin"}},
		{"nvidia/cuda image", []string{
			"PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"NVIDIA_REQUIRE_CUDA=cuda>=12.4",
			"LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
			"NVIDIA_DRIVER_CAPABILITIES=compute,utility",
			"NVIDIA_VISIBLE_DEVICES=all",
		}, []string{visible}},
		{"directories listed with a trailing slash", []string{"PATH=/usr/local/nvidia/bin/:/bin", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64/"}, []string{visible}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := envOf(e, tc.env)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			for _, kv := range got {
				k, v, _ := strings.Cut(kv, "=")
				if k != "PATH" && k != "LD_LIBRARY_PATH" {
					continue
				}
				// Nothing the image had is removed, nothing listed twice.
				for _, old := range tc.env {
					if ok, ov, _ := strings.Cut(old, "="); ok == k && !strings.HasPrefix(v, ov) {
						t.Errorf("%s: %q does not keep the image's %q", k, v, ov)
					}
				}
				entries := strings.Split(v, ":")
				slices.Sort(entries)
				if len(slices.Compact(entries)) != len(strings.Split(v, ":")) {
					t.Errorf("%s: duplicate entries in %q", k, v)
				}
			}
		})
	}
}
