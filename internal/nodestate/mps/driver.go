package mps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/config"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Driver is what the supervisor runs the daemons from: the driver's
// nvidia-cuda-mps-control and a directory holding, by SONAME, links to the
// driver's compute and utility libraries (and nothing else: on Debian the
// driver's libraries share a directory with the host's C library, which
// must not reach a daemon run in a container with its own).
type Driver struct {
	// Binary is nvidia-cuda-mps-control as this process runs it.
	Binary string
	// LibraryDir is <mpsRoot>/lib-<driver version>.
	LibraryDir string
}

// driverVersion matches a driver version fit for a directory name.
var driverVersion = regexp.MustCompile(`^[0-9]+(\.[0-9]+){1,3}$`)

// PrepareDriver finds the driver's files in a discovery of the node with
// cfg, as this process reads them (under driverRootMount), and makes the
// library directory of links in cfg's mpsRoot, replacing one whose links
// differ (a driver upgrade). Only files that discovery found are linked;
// nothing that a request could name.
func PrepareDriver(cfg config.Config, snap *inventory.Snapshot) (Driver, error) {
	if !driverVersion.MatchString(snap.DriverVersion) {
		return Driver{}, fmt.Errorf("no usable driver (version %q)", snap.DriverVersion)
	}
	mount := cfg.DriverRootMount
	if mount == "" {
		mount = cfg.DriverRoot
	}
	local := func(host string) (string, bool) {
		rel, err := filepath.Rel(cfg.DriverRoot, host)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", false
		}
		return filepath.Join(mount, rel), true
	}
	var d Driver
	links := map[string]string{}
	for _, f := range snap.Files {
		p, ok := local(f.HostPath)
		switch {
		case !ok:
		case f.Kind == inventory.Binary && f.Name == ControlBinary:
			d.Binary = p
		case f.Kind == inventory.Library && (f.Capability == inventory.Compute || f.Capability == inventory.Utility) &&
			f.Name != "" && !strings.ContainsRune(f.Name, '/'):
			links[f.Name] = p
		}
	}
	if d.Binary == "" {
		return Driver{}, fmt.Errorf("discovery found no %s under driverRoot %s (the driver's compute binaries)", ControlBinary, cfg.DriverRoot)
	}
	d.LibraryDir = filepath.Join(cfg.DevicePlugin.MPSRoot, "lib-"+snap.DriverVersion)
	if err := linkDir(d.LibraryDir, links); err != nil {
		return Driver{}, err
	}
	return d, nil
}

// linkDir makes dir hold exactly links (name -> target), keeping a dir
// that already does: an adopted daemon's servers load from it.
func linkDir(dir string, links map[string]string) error {
	if same(dir, links) {
		return nil
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("preparing %s: %w", dir, err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return fmt.Errorf("preparing %s: %w", dir, err)
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(tmp, name)); err != nil {
			return fmt.Errorf("preparing %s: %w", dir, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("preparing %s: %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("preparing %s: %w", dir, err)
	}
	return nil
}

// same reports whether dir holds exactly links.
func same(dir string, links map[string]string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != len(links) {
		return false
	}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || links[e.Name()] != target {
			return false
		}
	}
	return true
}
