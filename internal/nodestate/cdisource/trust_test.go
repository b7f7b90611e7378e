package cdisource_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/cdisource"
)

// otherUID is a user that is not root and not the test's (no account is
// needed to own a file).
const otherUID = 1001

func discover(t *testing.T, o cdisource.Options) ([]string, []string) {
	t.Helper()
	if o.Kind == "" {
		o.Kind = "amd.com/gpu"
	}
	o.HostRoot = "/"
	src, err := cdisource.Discover(o)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range src.Devices() {
		names = append(names, g.Name)
	}
	return names, src.Snapshot().Warnings
}

func hasWarning(warnings []string, parts ...string) bool {
	return slices.ContainsFunc(warnings, func(w string) bool {
		for _, p := range parts {
			if !strings.Contains(w, p) {
				return false
			}
		}
		return true
	})
}

// TestDiscoverRefusesUntrustedSpecs checks that a spec directory or a spec
// file that anyone but root (or this process's user) can write, or that
// another user owns, offers no device, with a warning that names it and
// says why; the code before offered their devices.
func TestDiscoverRefusesUntrustedSpecs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		root  bool // needs root (chown)
		spoil func(dir, spec string) error
		path  func(dir, spec string) string
		want  string
	}{
		{"directory writable by others", false, func(dir, _ string) error { return os.Chmod(dir, 0o777) },
			func(dir, _ string) string { return "spec directory " + dir }, "mode 0777: writable by its group or others"},
		{"directory writable by its group", false, func(dir, _ string) error { return os.Chmod(dir, 0o775) },
			func(dir, _ string) string { return "spec directory " + dir }, "mode 0775"},
		{"sticky directory writable by others", false, func(dir, _ string) error { return os.Chmod(dir, 0o777|os.ModeSticky) },
			func(dir, _ string) string { return "spec directory " + dir }, "mode 0777"},
		{"spec writable by others", false, func(_, spec string) error { return os.Chmod(spec, 0o646) },
			func(_, spec string) string { return "spec " + spec }, "mode 0646: writable by its group or others"},
		{"spec writable by its group", false, func(_, spec string) error { return os.Chmod(spec, 0o664) },
			func(_, spec string) string { return "spec " + spec }, "mode 0664"},
		{"directory of another user", true, func(dir, _ string) error { return os.Chown(dir, otherUID, otherUID) },
			func(dir, _ string) string { return "spec directory " + dir }, "owned by uid 1001, not root"},
		{"spec of another user", true, func(_, spec string) error { return os.Chown(spec, otherUID, otherUID) },
			func(_, spec string) string { return "spec " + spec }, "owned by uid 1001, not root"},
		{"link to a spec of another user", true, func(_, spec string) error {
			other := filepath.Join(filepath.Dir(filepath.Dir(spec)), "elsewhere.yaml")
			if err := os.Rename(spec, other); err != nil {
				return err
			}
			if err := os.Chown(other, otherUID, otherUID); err != nil {
				return err
			}
			return os.Symlink(other, spec)
		}, func(_, spec string) string { return "spec " + spec }, "owned by uid 1001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root: chowns the spec to another user")
			}
			v := vendorNode(t, "")
			dir := filepath.Dir(v.SpecPath)
			if names, warnings := discover(t, cdisource.Options{SpecDirs: []string{dir}}); len(names) != 2 {
				t.Fatalf("before spoiling: devices %q, warnings %q", names, warnings)
			}
			if err := tc.spoil(dir, v.SpecPath); err != nil {
				t.Fatal(err)
			}
			names, warnings := discover(t, cdisource.Options{SpecDirs: []string{dir}})
			if len(names) != 0 {
				t.Errorf("devices %q offered from an untrusted spec", names)
			}
			if !hasWarning(warnings, "CDI "+tc.path(dir, v.SpecPath)+" refused: ", tc.want) {
				t.Errorf("no warning naming %s and %q in %q", tc.path(dir, v.SpecPath), tc.want, warnings)
			}
		})
	}

	// An untrusted directory does not hide a trusted one, and no
	// directory at all reads nothing (not the CDI library's defaults).
	v := vendorNode(t, "")
	bad := t.TempDir()
	os.Chmod(bad, 0o777)
	if names, warnings := discover(t, cdisource.Options{SpecDirs: []string{bad, filepath.Dir(v.SpecPath)}}); len(names) != 2 || !hasWarning(warnings, bad, "refused") {
		t.Errorf("a trusted directory after an untrusted one: devices %q, warnings %q", names, warnings)
	}
	if names, _ := discover(t, cdisource.Options{SpecDirs: []string{bad}}); len(names) != 0 {
		t.Errorf("devices %q from no trusted directory", names)
	}
}

// TestDiscoverRefusesWritableMounts checks that a device whose spec mounts
// a host path read-write (no "ro" among the mount's options, or "ro"
// undone by a later "rw") is not offered unless allowWritableMounts is
// set; the code before offered it.
func TestDiscoverRefusesWritableMounts(t *testing.T) {
	mount := func(name, options string) string {
		return fmt.Sprintf(`  - name: %s
    containerEdits:
      deviceNodes:
        - path: /dev/dri/renderD128
          hostPath: %%[1]s
      mounts:
        - hostPath: %%[2]s
          containerPath: /data
          options: %s
`, name, options)
	}
	v := vendorNode(t, "")
	extra := fmt.Sprintf(mount("writable", "[rbind, nosuid]")+mount("undone", "[ro, rbind, rw]")+mount("readonly", "[rbind, ro]"),
		v.Render[0].HostPath, filepath.Join(v.Root, "opt/rocm/lib"))
	v = vendorNode(t, v.Root, extra)
	o := cdisource.Options{SpecDirs: []string{filepath.Dir(v.SpecPath)}}
	names, warnings := discover(t, o)
	if !slices.Equal(names, []string{"0", "1", "readonly"}) {
		t.Errorf("offered %q, want 0, 1 and readonly", names)
	}
	for _, name := range []string{"writable", "undone"} {
		if !hasWarning(warnings, "amd.com/gpu="+name+": not offered: mount", "-> /data is read-write", "cdiImport.allowWritableMounts") {
			t.Errorf("no warning for %s in %q", name, warnings)
		}
	}
	o.AllowWritableMounts = true
	if names, warnings := discover(t, o); !slices.Equal(names, []string{"0", "1", "readonly", "undone", "writable"}) {
		t.Errorf("with allowWritableMounts: offered %q, warnings %q", names, warnings)
	}
}
