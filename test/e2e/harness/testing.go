package harness

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

// VersionFromEnv is the containerd version tests should use: that of
// RuntimeFromEnv() when it is a containerd, else DefaultContainerdVersion.
func VersionFromEnv() string {
	if v := ContainerdVersionOf(RuntimeFromEnv()); v != "" {
		return v
	}
	return DefaultContainerdVersion
}

type setupResult struct {
	tools *Tools
	imgs  *Images
	err   error
}

var (
	setupMu    sync.Mutex
	setupCache = map[string]*setupResult{}
)

// SetupForTest installs the tools for version ("" = VersionFromEnv()) into the
// default cache and builds the standard images, once per test process and version.
// It skips the test when not running as root, and first reaps harness dirs left
// behind by killed test processes.
func SetupForTest(t testing.TB, version string) (*Tools, *Images) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a real containerd and runc (CI runs as root)")
	}
	if version == "" {
		version = VersionFromEnv()
	}
	setupMu.Lock()
	defer setupMu.Unlock()
	r := setupCache[version]
	if r == nil {
		r = &setupResult{}
		setupCache[version] = r
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		start := time.Now()
		r.tools, r.err = InstallTools(ctx, "", version)
		if r.err == nil {
			t.Logf("InstallTools(%s): %s (runc %s, seccomp=%v)", version, time.Since(start).Round(time.Millisecond), r.tools.Runc, r.tools.RuncSeccomp)
			if cleaned, err := ReapStale(r.tools.Runc); len(cleaned) > 0 || err != nil {
				t.Logf("reaped stale harness dirs %v (err %v)", cleaned, err)
			}
			start = time.Now()
			r.imgs, r.err = BuildImages(ctx, "")
			if r.err == nil {
				t.Logf("BuildImages: %s", time.Since(start).Round(time.Millisecond))
			}
		}
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.tools, r.imgs
}

// StartForTest starts a harness containerd for a test and stops it when the test
// ends, printing the tail of containerd's log if the test failed. Missing Tools and
// Images in opts are filled in by SetupForTest.
func StartForTest(t testing.TB, opts ContainerdOptions) *Containerd {
	t.Helper()
	if opts.Tools == nil || opts.Images == nil {
		tl, im := SetupForTest(t, "")
		if opts.Tools == nil {
			opts.Tools = tl
		}
		if opts.Images == nil {
			opts.Images = im
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartContainerd(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("containerd %s in %s: ready in %s, images imported in %s", opts.Tools.ContainerdVersion, c.Dir,
		c.StartupDuration.Round(time.Millisecond), c.ImportDuration.Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- tail of %s ---\n%s", c.LogPath, c.LogTail(8000))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping containerd: %v", err)
		}
	})
	return c
}
