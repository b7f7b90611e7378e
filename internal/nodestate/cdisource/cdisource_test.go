package cdisource_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdisource"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// vendorNode lays out a 2-GPU AMD-style node under root (a new temporary
// directory when empty): with its own device nodes where this process can
// mknod them (root), otherwise with its spec naming character devices the
// host has (/dev/null, /dev/zero, ...). Discovery checks either the same
// way: the nodes exist as character devices with the numbers the spec says.
func vendorNode(t *testing.T, root string, extra ...string) *simnode.VendorNode {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	generate := simnode.GenerateVendor
	if err := simnode.CanMknod(); err != nil {
		t.Logf("the spec names the host's character devices: %v", err)
		generate = simnode.GenerateVendorHostNodes
	}
	v, err := generate(root, 2, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestDiscover(t *testing.T) {
	v := vendorNode(t, "")
	src, err := cdisource.Discover(cdisource.Options{Kind: "amd.com/gpu", SpecDirs: []string{filepath.Dir(v.SpecPath)}, HostRoot: "/"})
	if err != nil {
		t.Fatal(err)
	}
	snap := src.Snapshot()
	if len(snap.Warnings) > 0 {
		t.Errorf("warnings: %q", snap.Warnings)
	}
	if src.Kind() != "amd.com/gpu" || len(snap.GPUs) != 2 {
		t.Fatalf("snapshot %+v", snap)
	}
	for i, g := range snap.GPUs {
		want := v.Render[i] // simnode.DRIMajor:128+i with mknod
		if g.Name != fmt.Sprint(i) || g.Index != i || g.Node.Path != fmt.Sprintf("/dev/dri/renderD%d", 128+i) ||
			g.Node.Major != want.Major || g.Node.Minor != want.Minor || g.Node.Mode != 0o666 {
			t.Errorf("device %d = %+v, want node %+v", i, g, want)
		}
	}
	// The spec's own edits are what every device brings.
	c := src.Edits(nil, 0)
	if len(c.Devices) != 1 || c.Devices[0].Path != "/dev/kfd" || c.Devices[0].Major != v.KFD.Major ||
		!slices.Equal(c.Env, []string{"HSA_SIM=1"}) || len(c.Mounts) != 1 || c.Mounts[0].Destination != "/opt/rocm/lib" {
		t.Errorf("common edits %+v", c)
	}
}

// TestDiscoverRefuses checks that devices whose nodes do not exist, whose
// numbers disagree with the host, or that need hooks (when hooks are not
// allowed) are left out with a warning; and that hooks, when allowed, get
// an explicit environment.
func TestDiscoverRefuses(t *testing.T) {
	hook := `  - name: hooked
    containerEdits:
      deviceNodes:
        - path: /dev/dri/renderD128
          hostPath: %s
      hooks:
        - hookName: createContainer
          path: /bin/true
`
	missing := `  - name: ghost
    containerEdits:
      deviceNodes:
        - path: /dev/dri/renderD200
          hostPath: /nonexistent/renderD200
`
	wrong := `  - name: liar
    containerEdits:
      deviceNodes:
        - path: /dev/dri/renderD129
          hostPath: %s
          major: 226
          minor: 7
`
	// Generated twice: the extra devices name the first one's nodes.
	v := vendorNode(t, "")
	v2 := vendorNode(t, v.Root, fmt.Sprintf(hook, v.Render[0].HostPath), missing, fmt.Sprintf(wrong, v.Render[1].HostPath))
	opts := cdisource.Options{Kind: "amd.com/gpu", SpecDirs: []string{filepath.Dir(v2.SpecPath)}, HostRoot: "/"}
	src, err := cdisource.Discover(opts)
	if err != nil {
		t.Fatal(err)
	}
	snap := src.Snapshot()
	var names []string
	for _, g := range snap.GPUs {
		names = append(names, g.Name)
	}
	if !slices.Equal(names, []string{"0", "1"}) {
		t.Errorf("offered %q, want only 0 and 1", names)
	}
	for _, want := range []string{"hooked: not offered: needs OCI hook /bin/true", "ghost: not offered: device node /nonexistent/renderD200", "liar: not offered: device node", "the spec says 226:7"} {
		if !slices.ContainsFunc(snap.Warnings, func(w string) bool { return strings.Contains(w, want) }) {
			t.Errorf("no warning containing %q in %q", want, snap.Warnings)
		}
	}

	opts.AllowHooks = true
	src, err = cdisource.Discover(opts)
	if err != nil {
		t.Fatal(err)
	}
	snap = src.Snapshot()
	i := slices.IndexFunc(snap.GPUs, func(g inventory.GPU) bool { return g.Name == "hooked" })
	if i < 0 {
		t.Fatalf("hooked device not offered with allowHooks: %q", snap.Warnings)
	}
	h := src.Edits(snap.GPUs[i:i+1], 0).Hooks
	if len(h) != 1 || h[0].Path != "/bin/true" || !slices.Equal(h[0].Env, cdisource.HookEnv) || h[0].Stage != "createContainer" {
		t.Errorf("hook %+v: want an explicit environment", h)
	}
}

func TestDiscoverBadSpecs(t *testing.T) {
	v := vendorNode(t, "")
	// A spec the CDI library refuses (bad device name), beside the good one.
	bad := filepath.Join(filepath.Dir(v.SpecPath), "bad.yaml")
	os.WriteFile(bad, []byte("cdiVersion: 0.6.0\nkind: amd.com/gpu\ndevices:\n  - name: \"bad name!\"\n    containerEdits:\n      env: [A=1]\n"), 0o644)
	src, err := cdisource.Discover(cdisource.Options{Kind: "amd.com/gpu", SpecDirs: []string{filepath.Dir(v.SpecPath)}, HostRoot: "/"})
	if err != nil {
		t.Fatal(err)
	}
	snap := src.Snapshot()
	if len(snap.GPUs) != 2 || !slices.ContainsFunc(snap.Warnings, func(w string) bool { return strings.Contains(w, "bad.yaml refused") }) {
		t.Errorf("GPUs %d, warnings %q", len(snap.GPUs), snap.Warnings)
	}
	if _, err := cdisource.Discover(cdisource.Options{Kind: "amd", HostRoot: "/"}); err == nil {
		t.Error("a bad kind was accepted")
	}
	empty, err := cdisource.Discover(cdisource.Options{Kind: "intel.com/gpu", SpecDirs: []string{filepath.Dir(v.SpecPath)}, HostRoot: "/"})
	if err != nil || len(empty.Devices()) != 0 || len(empty.Snapshot().Warnings) == 0 {
		t.Errorf("another kind: %+v, %v", empty, err)
	}
}
