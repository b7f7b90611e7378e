package libcache

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// ProfileFile is the file of a profile directory, named as the NVIDIA
// Container Toolkit's update-application-profile hook names the one it
// writes in /etc/nvidia/nvidia-application-profiles-rc.d (where
// adjust.ProfileDestination mounts it).
const ProfileFile = "10-container.conf"

// MaxAllSetsGPUs is the most GPUs for which every set of GPUs gets its
// directories (2^8-1 = 255 sets). A node with more gets them for each GPU
// alone and for all its GPUs; other sets go without.
const MaxAllSetsGPUs = 8

// GPUSet are the prepared files of one set of GPUs, as the runtime sees
// them: empty where the set gets none.
type GPUSet struct {
	// Profile is the application profile that limits EGL and Vulkan to
	// the set's GPUs (EGLVisibleDGPUDevices), to be mounted at
	// ProfileDestination.
	Profile string
	// ByPath is a directory of the /dev/dri/by-path links of the set's
	// DRM nodes, to be mounted at /dev/dri/by-path.
	ByPath string
}

// ProfileContent is the application profile of the GPUs whose device
// minors are the bits of mask, byte for byte as the NVIDIA Container
// Toolkit's update-application-profile hook writes it.
func ProfileContent(mask uint64) []byte {
	return fmt.Appendf(nil, `{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x%x]}],"rules":[{"pattern":[],"profile":"_container_"}]}`, mask)
}

// MinorMask returns the set of gpus as a mask of their device minors, and
// false when a minor does not fit in the 64 bits of EGLVisibleDGPUDevices.
func MinorMask(gpus []inventory.GPU) (uint64, bool) {
	var mask uint64
	for _, g := range gpus {
		if g.Minor < 0 || g.Minor > 63 {
			return 0, false
		}
		mask |= 1 << uint(g.Minor)
	}
	return mask, true
}

// gpuSets makes the directories of the sets of the snapshot's GPUs: the
// application profile where the driver has graphics libraries, the
// by-path links where the GPUs have DRM nodes.
func (p *placer) gpuSets(snap *inventory.Snapshot, o Options) (map[uint64]GPUSet, error) {
	var gpus []inventory.GPU
	drm := false
	for _, g := range snap.GPUs {
		if g.Minor >= 0 && g.Minor <= 63 {
			gpus = append(gpus, g)
			drm = drm || g.DRM != nil
		}
	}
	graphics := false
	for _, f := range snap.Files {
		graphics = graphics || f.Kind == inventory.Library && f.Capability == inventory.Graphics
	}
	if len(gpus) == 0 || !graphics && !drm {
		return nil, nil
	}
	var sets [][]inventory.GPU
	if len(gpus) <= MaxAllSetsGPUs {
		for m := 1; m < 1<<len(gpus); m++ {
			var set []inventory.GPU
			for i, g := range gpus {
				if m&(1<<i) != 0 {
					set = append(set, g)
				}
			}
			sets = append(sets, set)
		}
	} else {
		for _, g := range gpus {
			sets = append(sets, []inventory.GPU{g})
		}
		sets = append(sets, gpus)
	}
	out := make(map[uint64]GPUSet, len(sets))
	for _, set := range sets {
		mask, _ := MinorMask(set)
		var s GPUSet
		if graphics {
			rel, err := p.makeSetDir(fmt.Sprintf("gpus%x", mask), "profile", map[string]string{ProfileFile: string(ProfileContent(mask))}, nil)
			if err != nil {
				return nil, err
			}
			s.Profile = filepath.Join(o.DriverRoot, o.Dir, rel, ProfileFile)
		}
		if drm {
			links := map[string]string{}
			for _, g := range set {
				for _, n := range []struct {
					node inventory.DeviceNode
					kind string
				}{{g.Card(), "card"}, {g.Render(), "render"}} {
					if n.node.Path != "" && strings.HasPrefix(n.node.Path, "/dev/dri/") {
						links["pci-"+g.BusID+"-"+n.kind] = "../" + path.Base(n.node.Path)
					}
				}
			}
			rel, err := p.makeSetDir(fmt.Sprintf("gpus%x", mask), "bypath", nil, links)
			if err != nil {
				return nil, err
			}
			s.ByPath = filepath.Join(o.DriverRoot, o.Dir, rel)
		}
		out[mask] = s
	}
	return out, nil
}

// makeSetDir makes (or reuses) the directory named for set and kind that
// holds files (name to content, read-only) and links (name to target),
// content-addressed and made by renaming like makeDir.
func (p *placer) makeSetDir(set, kind string, files, links map[string]string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", kind, set)
	for _, name := range sortedKeys(files) {
		fmt.Fprintf(h, "f %s %q\n", name, files[name])
	}
	for _, name := range sortedKeys(links) {
		fmt.Fprintf(h, "l %s %s\n", name, links[name])
	}
	name := set + "-" + kind + "-" + hex.EncodeToString(h.Sum(nil))[:16]
	final := path.Join(p.version, name)
	if fi, err := p.cache.Lstat(final); err == nil && fi.IsDir() {
		return final, nil
	}
	if err := p.makeVersionDir(); err != nil {
		return "", err
	}
	tmp := path.Join(p.version, ".tmp-"+name+fmt.Sprintf("-%d", os.Getpid()))
	_ = p.cache.RemoveAll(tmp)
	if err := p.cache.Mkdir(tmp, 0o755); err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		_ = p.cache.RemoveAll(tmp)
		return "", err
	}
	for _, n := range sortedKeys(files) {
		if err := p.cache.WriteFile(path.Join(tmp, n), []byte(files[n]), 0o444); err != nil {
			return fail(err)
		}
		// WriteFile's mode is masked by the umask; the profile is
		// read by every container user.
		if err := p.cache.Chmod(path.Join(tmp, n), 0o444); err != nil {
			return fail(err)
		}
	}
	for _, n := range sortedKeys(links) {
		if err := p.cache.Symlink(links[n], path.Join(tmp, n)); err != nil {
			return fail(err)
		}
	}
	if err := p.cache.Rename(tmp, final); err != nil {
		_ = p.cache.RemoveAll(tmp)
		if fi, err2 := p.cache.Lstat(final); err2 == nil && fi.IsDir() {
			return final, nil
		}
		return "", err
	}
	return final, nil
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
