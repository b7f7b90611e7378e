package adjust_test

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// extrasNode discovers a simulated node's driver files (no device nodes:
// no root needed).
func extrasNode(t *testing.T) *inventory.Snapshot {
	t.Helper()
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func hostFile(t *testing.T, snap *inventory.Snapshot, name string) string {
	t.Helper()
	for _, f := range snap.Files {
		if f.Name == name || filepath.Base(f.Name) == name && f.Kind == inventory.Config {
			return f.HostPath
		}
	}
	t.Fatalf("the node has no %s", name)
	return ""
}

// TestLibraryExtras checks that graphics brings the GBM backend (the
// discovered libnvidia-allocator.so.1) at libraryDir/gbm/nvidia-drm_gbm.so
// with GBM_BACKENDS_PATH where the image sets none, and that ngx brings the
// Wine DLLs at libraryDir/nvidia/wine as well, where Proton looks beside
// libGLX_nvidia.so.0; one mount per file without prepared directories,
// inside the directory's own mount with them.
func TestLibraryExtras(t *testing.T) {
	snap := extrasNode(t)
	alloc := hostFile(t, snap, "libnvidia-allocator.so.1")
	dll := hostFile(t, snap, "nvngx.dll")
	dll2 := hostFile(t, snap, "_nvngx.dll")
	const lib = "/usr/local/nvidia/lib64"
	files := adjust.Prepare(snap, adjust.Layout{LibraryDir: lib, Library32Dir: "/usr/local/nvidia/lib"})
	graphics := inventory.Capabilities(inventory.Graphics)
	ngx := inventory.Capabilities(inventory.NGX)
	for _, tc := range []struct {
		caps    inventory.Capabilities
		mounts  map[string]string // destination -> source
		gbmPath bool
	}{
		{inventory.DefaultCapabilities, nil, false},
		{inventory.Capabilities(inventory.Display), nil, false},
		{graphics, map[string]string{lib + "/gbm/nvidia-drm_gbm.so": alloc}, true},
		{ngx, map[string]string{lib + "/nvidia/wine/nvngx.dll": dll, lib + "/nvidia/wine/_nvngx.dll": dll2}, false},
		{graphics.With(inventory.NGX).With(inventory.Compute), map[string]string{lib + "/gbm/nvidia-drm_gbm.so": alloc,
			lib + "/nvidia/wine/nvngx.dll": dll, lib + "/nvidia/wine/_nvngx.dll": dll2}, true},
	} {
		e := files.Edits(nil, tc.caps)
		got := map[string]string{}
		for _, m := range e.Mounts {
			if filepath.Dir(m.Destination) != lib && len(m.Destination) > len(lib) && m.Destination[:len(lib)] == lib {
				got[m.Destination] = m.Source
			}
		}
		if len(got) != len(tc.mounts) {
			t.Errorf("%s: mounts below %s: %v, want %v", tc.caps, lib, got, tc.mounts)
		}
		for d, s := range tc.mounts {
			if got[d] != s {
				t.Errorf("%s: %s mounted from %q, want the discovered %s", tc.caps, d, got[d], s)
			}
		}
		// The Debian path of the DLLs stays.
		if tc.caps.Has(inventory.NGX) && !slices.ContainsFunc(e.Mounts, func(m inventory.Mount) bool {
			return m.Destination == "/usr/lib/x86_64-linux-gnu/nvidia/wine/nvngx.dll"
		}) {
			t.Errorf("%s: nvngx.dll no longer at the driver's path", tc.caps)
		}
		env := envOf(e, nil)
		want := "GBM_BACKENDS_PATH=" + lib + "/gbm"
		if slices.Contains(env, want) != tc.gbmPath {
			t.Errorf("%s: environment %q, want %s: %v", tc.caps, env, want, tc.gbmPath)
		}
		// The image's own value wins, even empty.
		for _, own := range []string{"GBM_BACKENDS_PATH=/opt/gbm", "GBM_BACKENDS_PATH="} {
			for _, kv := range envOf(e, []string{own}) {
				if kv[:len("GBM_BACKENDS_PATH=")] == "GBM_BACKENDS_PATH=" {
					t.Errorf("%s: image sets %s, adjustment sets %s", tc.caps, own, kv)
				}
			}
		}
	}

	// With prepared directories, the directory holds them: no mount of
	// their own (which a read-only directory mount could not take).
	dirs := map[inventory.Capabilities]string{}
	for c := inventory.Capabilities(1); c <= inventory.AllCapabilities; c++ {
		dirs[c] = "/cache/" + c.String()
	}
	whole := adjust.Prepare(snap, adjust.Layout{LibraryDir: lib, Library32Dir: "/usr/local/nvidia/lib", HostLibraryDirs: dirs})
	e := whole.Edits(nil, graphics.With(inventory.NGX))
	for _, m := range e.Mounts {
		if filepath.Dir(m.Destination) != lib && len(m.Destination) > len(lib) && m.Destination[:len(lib)] == lib {
			t.Errorf("prepared directory: extra mount %s", m.Destination)
		}
	}
	if env := envOf(e, nil); !slices.Contains(env, "GBM_BACKENDS_PATH="+lib+"/gbm") {
		t.Errorf("prepared directory: environment %q lacks GBM_BACKENDS_PATH", env)
	}
}

func envOf(e adjust.Edits, env []string) []string {
	var out []string
	for _, kv := range e.Adjustment(env).Env {
		out = append(out, kv.Key+"="+kv.Value)
	}
	return out
}

// TestMPSPipeDirEnv checks that an MPS pipe directory found elsewhere than
// the default (the host's CUDA_MPS_PIPE_DIRECTORY) is mounted at its path
// and named to compute containers whose environment lacks the variable,
// and that the default directory sets nothing.
func TestMPSPipeDirEnv(t *testing.T) {
	n, err := simnode.Generate(t.TempDir(), simnode.Options{NumGPUs: 1, IPC: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ dir, env string }{
		{"", ""},
		{"/run/mps", "CUDA_MPS_PIPE_DIRECTORY=/run/mps"},
	} {
		if tc.dir != "" {
			if err := os.MkdirAll(n.HostPath(tc.dir), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		snap, err := discover.Discover(discover.Options{HostRoot: n.Root, DriverRoot: n.Root, MPSPipeDir: tc.dir})
		if err != nil {
			t.Fatal(err)
		}
		p := adjust.Prepare(snap, adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib"})
		e := p.Edits(nil, inventory.Capabilities(inventory.Compute))
		want := cmp.Or(tc.dir, simnode.MPSPipeDir)
		if !slices.ContainsFunc(e.Mounts, func(m inventory.Mount) bool { return m.Destination == want && m.Source == n.HostPath(want) }) {
			t.Errorf("%q: no mount of the MPS directory at %s: %+v", tc.dir, want, e.Mounts)
		}
		got := slices.DeleteFunc(envOf(e, nil), func(kv string) bool { return !strings.HasPrefix(kv, "CUDA_MPS_PIPE_DIRECTORY=") })
		if tc.env == "" && len(got) != 0 || tc.env != "" && !slices.Equal(got, []string{tc.env}) {
			t.Errorf("%q: environment %q, want %q", tc.dir, got, tc.env)
		}
		if got := envOf(e, []string{"CUDA_MPS_PIPE_DIRECTORY=/mine"}); slices.ContainsFunc(got, func(kv string) bool { return strings.HasPrefix(kv, "CUDA_MPS_PIPE_DIRECTORY=") }) {
			t.Errorf("%q: the image's own CUDA_MPS_PIPE_DIRECTORY overridden: %q", tc.dir, got)
		}
		if got := envOf(p.Edits(nil, inventory.Capabilities(inventory.Utility)), nil); slices.ContainsFunc(got, func(kv string) bool { return strings.HasPrefix(kv, "CUDA_MPS_PIPE_DIRECTORY=") }) {
			t.Errorf("%q: utility gets %q", tc.dir, got)
		}
	}
}
