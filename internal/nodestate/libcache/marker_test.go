package libcache_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/devchar"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/libcache"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// TestForeignCacheDirLeftAlone points the cache at a directory of the
// system (libraryCache: /usr/lib, which holds systemd/): Build refuses it
// naming what it holds, and Clean removes nothing from it.
func TestForeignCacheDirLeftAlone(t *testing.T) {
	n, snap, o := setup(t)
	o.Dir = "usr/lib"
	systemd := filepath.Join(n.Root, "usr/lib/systemd/system")
	if err := os.MkdirAll(systemd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(systemd, "ssh.service"), []byte("[Unit]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := libcache.Build(snap, o)
	var fe *libcache.ForeignError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), `"systemd"`) || !strings.Contains(err.Error(), "which nri-gpu did not make") {
		t.Fatalf("Build in /usr/lib: %v, want a refusal naming systemd", err)
	}
	if _, err := os.Stat(filepath.Join(n.Root, "usr/lib", libcache.RootMarker)); !os.IsNotExist(err) {
		t.Errorf("Build marked a directory it refused: %v", err)
	}
	removed, err := libcache.Clean(o, snap.DriverVersion, func(string) bool { return false })
	if len(removed) != 0 || err == nil {
		t.Errorf("Clean of /usr/lib removed %q (%v), want nothing and an error", removed, err)
	}
	if _, err := os.Stat(filepath.Join(systemd, "ssh.service")); err != nil {
		t.Fatalf("Clean removed /usr/lib/systemd: %v", err)
	}
}

// TestCleanKeepsUnmarked checks that, in nri-gpu's own (marked) cache,
// Clean removes an old driver version's directory it made, and leaves a
// directory without the version marker, and a marked one holding what
// nri-gpu did not put there; Build then refuses the cache, naming the
// foreign directory.
func TestCleanKeepsUnmarked(t *testing.T) {
	n, snap, o := setup(t)
	if _, err := libcache.Build(snap, o); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(n.Root, o.Dir)
	for _, f := range []string{libcache.RootMarker, filepath.Join(snap.DriverVersion, libcache.VersionMarker)} {
		if _, err := os.Stat(filepath.Join(cache, f)); err != nil {
			t.Fatalf("no marker: %v", err)
		}
	}
	// An old version nri-gpu made, one it made that someone added a
	// file to, and a directory it did not make.
	old := buildVersion(t, snap, o, "570.1.2")
	touched := buildVersion(t, snap, o, "570.1.3")
	if err := os.WriteFile(filepath.Join(touched, "notes.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(cache, "570.1.4", "compute-library-0123456789abcdef")
	if err := os.MkdirAll(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	removed, err := libcache.Clean(o, snap.DriverVersion, func(string) bool { return false })
	if err != nil || len(removed) != 1 || removed[0] != old {
		t.Fatalf("Clean removed %q (%v), want only %s", removed, err, old)
	}
	for _, d := range []string{touched, foreign, filepath.Join(cache, snap.DriverVersion)} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("Clean removed %s: %v", d, err)
		}
	}
	_, err = libcache.Build(snap, o)
	if err == nil || !strings.Contains(err.Error(), `holds "570.1.4"`) {
		t.Errorf("Build with a foreign directory in the cache: %v, want a refusal naming 570.1.4", err)
	}
}

// buildVersion builds the cache as for driver version v and returns that
// version's directory (runtime view).
func buildVersion(t *testing.T, snap *inventory.Snapshot, o libcache.Options, v string) string {
	t.Helper()
	s := *snap
	s.DriverVersion = v
	c, err := libcache.Build(&s, o)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(c.Dirs[inventory.DefaultCapabilities])
}

// TestAdoptUnmarkedCache checks that a cache an nri-gpu without markers
// made (version directories of set directories only) is taken over:
// marked, and its unused versions cleaned.
func TestAdoptUnmarkedCache(t *testing.T) {
	n, snap, o := setup(t)
	old := buildVersion(t, snap, o, "570.1.2")
	cache := filepath.Join(n.Root, o.Dir)
	for _, f := range []string{libcache.RootMarker, filepath.Join("570.1.2", libcache.VersionMarker)} {
		if err := os.Remove(filepath.Join(cache, f)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := libcache.Build(snap, o); err != nil {
		t.Fatalf("Build over an older nri-gpu's cache: %v", err)
	}
	removed, err := libcache.Clean(o, snap.DriverVersion, func(string) bool { return false })
	if err != nil || len(removed) != 1 || removed[0] != old {
		t.Fatalf("Clean removed %q (%v), want %s", removed, err, old)
	}
}

// TestBuildRefusesBadVersion checks that a driver version that is not a
// plain name cannot make a directory outside the cache.
func TestBuildRefusesBadVersion(t *testing.T) {
	_, snap, o := setup(t)
	s := *snap
	s.DriverVersion = "../../etc"
	if _, err := libcache.Build(&s, o); err == nil || !strings.Contains(err.Error(), "cannot name a directory") {
		t.Fatalf("Build with version %q: %v", s.DriverVersion, err)
	}
}

// TestCacheSharesDirWithDevCharRecord: the record of /dev/char links (and
// a temporary file of its writing) in the cache directory, as in the
// DaemonSet where both are the host's /var/lib/nri-gpu, is nri-gpu's own:
// Build uses the directory, Build and Clean leave the files as they are;
// a directory of that name is still foreign.
func TestCacheSharesDirWithDevCharRecord(t *testing.T) {
	n, snap, o := setup(t)
	cache := filepath.Join(n.Root, o.Dir)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	own := map[string]string{devchar.RecordName: `{"bootID":"b","links":[]}`, ".devchar-123": "partial"}
	for name, data := range own {
		if err := os.WriteFile(filepath.Join(cache, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := libcache.Build(snap, o); err != nil {
		t.Fatalf("Build beside the /dev/char record: %v", err)
	}
	if _, err := libcache.Clean(o, snap.DriverVersion, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	for name, data := range own {
		if got, err := os.ReadFile(filepath.Join(cache, name)); err != nil || string(got) != data {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}
	os.Remove(filepath.Join(cache, devchar.RecordName))
	if err := os.Mkdir(filepath.Join(cache, devchar.RecordName), 0o755); err != nil {
		t.Fatal(err)
	}
	var fe *libcache.ForeignError
	if _, err := libcache.Build(snap, o); !errors.As(err, &fe) {
		t.Errorf("a directory named as the record: %v, want a ForeignError", err)
	}
}
