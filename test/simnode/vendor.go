package simnode

import (
	"fmt"
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
}

// GenerateVendor lays out n AMD-style GPUs under root: real character
// devices (root only), a runtime library directory the spec mounts, and
// the CDI spec. extraDevices are appended verbatim to the spec's device
// list (YAML list items, indented by two spaces), for tests of refused
// devices.
func GenerateVendor(root string, n int, extraDevices ...string) (*VendorNode, error) {
	v := &VendorNode{Root: root, SpecPath: filepath.Join(root, "etc/cdi/amd.yaml")}
	for _, d := range []string{"dev/dri", "etc/cdi", "opt/rocm/lib"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, err
		}
	}
	mk := func(p string, major, minor uint32) error {
		full := filepath.Join(root, p)
		os.Remove(full)
		if err := syscall.Mknod(full, syscall.S_IFCHR|0o666, int(Makedev(major, minor))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		return os.Chmod(full, 0o666)
	}
	if err := mk("dev/kfd", KFDMajor, 0); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(root, "opt/rocm/lib/librocm-sim.so.1"), []byte("sim"), 0o644); err != nil {
		return nil, err
	}
	var devs strings.Builder
	for i := 0; i < n; i++ {
		name := fmt.Sprint(i)
		if err := mk(fmt.Sprintf("dev/dri/renderD%d", RenderMinor+i), DRIMajor, uint32(RenderMinor+i)); err != nil {
			return nil, err
		}
		v.Devices = append(v.Devices, name)
		fmt.Fprintf(&devs, "  - name: %q\n    containerEdits:\n      deviceNodes:\n        - path: /dev/dri/renderD%d\n          hostPath: %s\n",
			name, RenderMinor+i, filepath.Join(root, fmt.Sprintf("dev/dri/renderD%d", RenderMinor+i)))
	}
	for _, d := range extraDevices {
		devs.WriteString(d)
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
%s  - name: all
    containerEdits:
      deviceNodes:
        - path: /dev/dri/renderD%d
          hostPath: %s
`, filepath.Join(root, "dev/kfd"), filepath.Join(root, "opt/rocm/lib"), devs.String(),
		RenderMinor, filepath.Join(root, fmt.Sprintf("dev/dri/renderD%d", RenderMinor)))
	if err := os.WriteFile(v.SpecPath, []byte(spec), 0o644); err != nil {
		return nil, err
	}
	return v, nil
}
