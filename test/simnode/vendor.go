package simnode

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// AMD-style device numbers of the simulated vendor node.
const (
	KFDMajor    = 240 // /dev/kfd (dynamic on real nodes)
	DRIMajor    = 226 // /dev/dri/*
	RenderMinor = 128 // /dev/dri/renderD128 is the first render node
)

// VendorNode is a simulated node of another vendor, described by a CDI
// spec in the style of AMD's (amd.com/gpu): a shared /dev/kfd in the
// spec's own edits and one render node per GPU.
type VendorNode struct {
	Root string
	// SpecPath is the spec, at <root>/etc/cdi/amd.yaml.
	SpecPath string
	// Devices are the spec's device names, "0".."N-1".
	Devices []string
	// KFD is the shared /dev/kfd node, Render[i] the render node of
	// device i, as the spec names them and as the host has them.
	KFD    VendorDevice
	Render []VendorDevice
}

// VendorDevice is one device node of a VendorNode.
type VendorDevice struct {
	Path         string // in the container: /dev/kfd, /dev/dri/renderD128, ...
	HostPath     string // the character device on the host
	Major, Minor int64  // its numbers on the host
}

// hostCharDevices are character devices every Linux host (and container)
// has, mode 0666, that GenerateVendorHostNodes points the spec at: the
// first for /dev/kfd, the others for the render nodes.
var hostCharDevices = []VendorDevice{
	{HostPath: "/dev/null", Major: 1, Minor: 3},
	{HostPath: "/dev/zero", Major: 1, Minor: 5},
	{HostPath: "/dev/full", Major: 1, Minor: 7},
	{HostPath: "/dev/random", Major: 1, Minor: 8},
	{HostPath: "/dev/urandom", Major: 1, Minor: 9},
}

// GenerateVendor lays out n AMD-style GPUs under root: real character
// devices (root only, see CanMknod), a runtime library directory the spec
// mounts, and the CDI spec. extraDevices are appended verbatim to the
// spec's device list (YAML list items, indented by two spaces), for tests
// of refused devices. Generating into the same root again replaces the
// spec and the nodes.
func GenerateVendor(root string, n int, extraDevices ...string) (*VendorNode, error) {
	return generateVendor(root, n, false, extraDevices)
}

// GenerateVendorHostNodes is GenerateVendor without mknod, for a user
// without root: the spec's device nodes name character devices the host
// already has (/dev/kfd is the host's /dev/null, the render nodes /dev/zero,
// /dev/full, /dev/random and /dev/urandom), so at most 4 GPUs. The
// VendorNode's KFD and Render say which, with their numbers. Whatever
// reads the spec only reads those nodes' metadata; nothing opens them.
func GenerateVendorHostNodes(root string, n int, extraDevices ...string) (*VendorNode, error) {
	if n > len(hostCharDevices)-1 {
		return nil, fmt.Errorf("simnode: GenerateVendorHostNodes: at most %d GPUs, not %d", len(hostCharDevices)-1, n)
	}
	return generateVendor(root, n, true, extraDevices)
}

func generateVendor(root string, n int, hostNodes bool, extraDevices []string) (*VendorNode, error) {
	v := &VendorNode{Root: root, SpecPath: filepath.Join(root, "etc/cdi/amd.yaml")}
	for _, d := range []string{"dev/dri", "etc/cdi", "opt/rocm/lib"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, err
		}
	}
	// mk returns the i-th node (0: /dev/kfd) at path p in the container.
	mk := func(i int, p string, major, minor int64) (VendorDevice, error) {
		if hostNodes {
			d := hostCharDevices[i]
			d.Path = p
			fi, err := os.Lstat(d.HostPath)
			if err != nil {
				return d, err
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			if fi.Mode()&fs.ModeCharDevice == 0 || !ok || int64(Major(uint64(st.Rdev))) != d.Major || int64(Minor(uint64(st.Rdev))) != d.Minor {
				return d, fmt.Errorf("simnode: the host's %s is not the character device %d:%d", d.HostPath, d.Major, d.Minor)
			}
			return d, nil
		}
		d := VendorDevice{Path: p, HostPath: filepath.Join(root, p), Major: major, Minor: minor}
		os.Remove(d.HostPath)
		if err := syscall.Mknod(d.HostPath, syscall.S_IFCHR|0o666, int(Makedev(uint32(major), uint32(minor)))); err != nil {
			return d, fmt.Errorf("mknod %s: %w", p, err)
		}
		return d, os.Chmod(d.HostPath, 0o666)
	}
	var err error
	if v.KFD, err = mk(0, "/dev/kfd", KFDMajor, 0); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(root, "opt/rocm/lib/librocm-sim.so.1"), []byte("sim"), 0o644); err != nil {
		return nil, err
	}
	var devs strings.Builder
	for i := 0; i < n; i++ {
		name := fmt.Sprint(i)
		d, err := mk(1+i, fmt.Sprintf("/dev/dri/renderD%d", RenderMinor+i), DRIMajor, int64(RenderMinor+i))
		if err != nil {
			return nil, err
		}
		v.Devices = append(v.Devices, name)
		v.Render = append(v.Render, d)
		fmt.Fprintf(&devs, "  - name: %q\n    containerEdits:\n      deviceNodes:\n        - path: %s\n          hostPath: %s\n",
			name, d.Path, d.HostPath)
	}
	for _, d := range extraDevices {
		devs.WriteString(d)
	}
	all := ""
	if n > 0 {
		all = fmt.Sprintf(`  - name: all
    containerEdits:
      deviceNodes:
        - path: %s
          hostPath: %s
`, v.Render[0].Path, v.Render[0].HostPath)
	}
	spec := fmt.Sprintf(`cdiVersion: 0.6.0
kind: amd.com/gpu
containerEdits:
  deviceNodes:
    - path: /dev/kfd
      hostPath: %s
  env:
    - HSA_SIM=1
  mounts:
    - hostPath: %s
      containerPath: /opt/rocm/lib
      options: [ro, nosuid, nodev, rbind, rprivate]
devices:
%s%s`, v.KFD.HostPath, filepath.Join(root, "opt/rocm/lib"), devs.String(), all)
	if err := os.WriteFile(v.SpecPath, []byte(spec), 0o644); err != nil {
		return nil, err
	}
	return v, nil
}
