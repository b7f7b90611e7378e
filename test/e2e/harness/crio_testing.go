package harness

import (
	"context"
	"sync"
	"testing"
	"time"
)

var (
	crioOnce  sync.Once
	crioTools *CRIOTools
	crioErr   error
)

// SetupCRIOForTest installs what a harness CRI-O needs (the tools of
// SetupForTest and the CRI-O binaries), once per test process.
func SetupCRIOForTest(t testing.TB) (*Tools, *CRIOTools, *Images) {
	t.Helper()
	tools, imgs := SetupForTest(t, "")
	crioOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		start := time.Now()
		crioTools, crioErr = InstallCRIO(ctx, "")
		if crioErr == nil {
			t.Logf("InstallCRIO: %s", time.Since(start).Round(time.Millisecond))
		}
	})
	if crioErr != nil {
		t.Fatal(crioErr)
	}
	return tools, crioTools, imgs
}

// StartCRIOForTest starts a harness CRI-O for a test and stops it when the test
// ends, printing the tail of its log if the test failed. Missing Tools, CRIO
// and Images in opts are filled in by SetupCRIOForTest.
func StartCRIOForTest(t testing.TB, opts CRIOOptions) *CRIO {
	t.Helper()
	if opts.Tools == nil || opts.CRIO == nil || opts.Images == nil {
		tl, ct, im := SetupCRIOForTest(t)
		if opts.Tools == nil {
			opts.Tools = tl
		}
		if opts.CRIO == nil {
			opts.CRIO = ct
		}
		if opts.Images == nil {
			opts.Images = im
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartCRIO(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("crio %s in %s: images copied in %s, ready in %s", opts.CRIO.Version, c.Dir,
		c.ImportDuration.Round(time.Millisecond), c.StartupDuration.Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- tail of %s ---\n%s", c.LogPath, c.LogTail(8000))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping crio: %v", err)
		}
	})
	return c
}
