// Package cdisource builds an inventory snapshot from another vendor's CDI
// specs (amd.com/gpu, intel.com/gpu, ...), read through the CDI library's
// cache, so that their devices get nri-gpu's request handling and are
// injected as NRI adjustments.
//
// Nothing from a spec is trusted blindly: a spec the CDI library refuses,
// a device node or mount source that does not exist on the host, or a hook
// the configuration does not allow, removes that device (or, for the
// spec's own edits, every device of the spec) with a warning.
package cdisource

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/inventory/discover"
)

// Options say which devices to serve and where to find them.
type Options struct {
	// Kind is the vendor/class to serve, "amd.com/gpu".
	Kind string
	// SpecDirs are the CDI spec directories, as this process reads them.
	SpecDirs []string
	// HostRoot is where the host's device nodes and mount sources are
	// checked (specs name host paths).
	HostRoot string
	// AllowHooks lets devices whose specs carry OCI hooks be served; the
	// hooks then run with an explicit environment.
	AllowHooks bool
}

// HookEnv is the environment a hook from a spec gets when the spec gives
// none: never the container's.
var HookEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// Discover reads the specs and returns the snapshot of Kind's devices.
func Discover(o Options) (*inventory.Snapshot, error) {
	vendor, class := parser.ParseQualifier(o.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return nil, fmt.Errorf("cdi kind %q: %w", o.Kind, err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return nil, fmt.Errorf("cdi kind %q: %w", o.Kind, err)
	}
	host, err := os.OpenRoot(o.HostRoot)
	if err != nil {
		return nil, fmt.Errorf("opening hostRoot: %w", err)
	}
	defer host.Close()

	snap := &inventory.Snapshot{HostRoot: o.HostRoot, Vendor: o.Kind}
	warnf := func(format string, args ...any) {
		snap.Warnings = append(snap.Warnings, fmt.Sprintf(format, args...))
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(o.SpecDirs...), cdi.WithAutoRefresh(false))
	if cache == nil {
		return nil, fmt.Errorf("reading CDI specs: %w", err)
	}
	for p, errs := range cache.GetErrors() {
		for _, e := range errs {
			warnf("CDI spec %s refused: %v", p, e)
		}
	}

	c := checker{host: host, allowHooks: o.AllowHooks}
	type found struct {
		name  string
		edits *inventory.Edits
	}
	var devices []found
	var common *inventory.Edits
	for _, spec := range cache.GetVendorSpecs(vendor) {
		if spec.GetClass() != class {
			continue
		}
		specEdits, err := c.edits(spec.ContainerEdits)
		if err != nil {
			warnf("CDI spec %s: its own edits are unusable (%v): none of its devices is offered", spec.GetPath(), err)
			continue
		}
		if common != nil && !isEmpty(specEdits) {
			warnf("CDI spec %s: a second spec of %s with edits of its own: its devices are not offered", spec.GetPath(), o.Kind)
			continue
		}
		if !isEmpty(specEdits) {
			common = specEdits
		}
		for _, d := range spec.Devices {
			if d.Name == "all" {
				continue // nri-gpu's own "all" covers it
			}
			e, err := c.edits(d.ContainerEdits)
			if err != nil {
				warnf("CDI device %s=%s: not offered: %v", o.Kind, d.Name, err)
				continue
			}
			if len(e.Nodes) == 0 {
				warnf("CDI device %s=%s: not offered: it has no device node", o.Kind, d.Name)
				continue
			}
			devices = append(devices, found{name: d.Name, edits: e})
		}
	}
	snap.Common = common

	// Numeric names first by value (as their vendors number devices),
	// then the others by name; the index is the position.
	sort.SliceStable(devices, func(i, j int) bool {
		a, errA := strconv.Atoi(devices[i].name)
		b, errB := strconv.Atoi(devices[j].name)
		switch {
		case errA == nil && errB == nil:
			return a < b
		case errA == nil:
			return true
		case errB == nil:
			return false
		}
		return devices[i].name < devices[j].name
	})
	for i, d := range devices {
		main := d.edits.Nodes[0]
		rest := *d.edits
		rest.Nodes = slices.Clone(d.edits.Nodes[1:])
		snap.GPUs = append(snap.GPUs, inventory.GPU{
			Index: i, Minor: int(main.Minor), Name: d.name, Node: main, Edits: &rest,
		})
	}
	if len(snap.GPUs) == 0 {
		warnf("no usable CDI device of kind %s in %v", o.Kind, o.SpecDirs)
	}
	return snap, nil
}

// checker turns a spec's edits into inventory edits, checking them
// against the host.
type checker struct {
	host       *os.Root
	allowHooks bool
}

func isEmpty(e *inventory.Edits) bool {
	return len(e.Nodes) == 0 && len(e.Mounts) == 0 && len(e.Env) == 0 && len(e.Hooks) == 0
}

func (c checker) edits(ce specs.ContainerEdits) (*inventory.Edits, error) {
	e := &inventory.Edits{}
	if len(ce.NetDevices) > 0 || ce.IntelRdt != nil || len(ce.AdditionalGIDs) > 0 {
		return nil, fmt.Errorf("edits nri-gpu does not inject (network devices, RDT, additional GIDs)")
	}
	for _, n := range ce.DeviceNodes {
		node, err := c.node(n)
		if err != nil {
			return nil, err
		}
		e.Nodes = append(e.Nodes, node)
	}
	for _, m := range ce.Mounts {
		if !filepath.IsAbs(m.HostPath) || !filepath.IsAbs(m.ContainerPath) {
			return nil, fmt.Errorf("mount %s -> %s: paths must be absolute", m.HostPath, m.ContainerPath)
		}
		if _, err := c.host.Stat(strings.TrimPrefix(path.Clean(m.HostPath), "/")); err != nil {
			return nil, fmt.Errorf("mount source %s: %w", m.HostPath, err)
		}
		typ := m.Type
		if typ == "" {
			typ = "bind"
		}
		e.Mounts = append(e.Mounts, inventory.Mount{Source: path.Clean(m.HostPath), Destination: path.Clean(m.ContainerPath), Type: typ, Options: slices.Clone(m.Options)})
	}
	for _, kv := range ce.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("env entry %q is not KEY=VALUE", kv)
		}
		e.Env = append(e.Env, kv)
	}
	for _, h := range ce.Hooks {
		if !c.allowHooks {
			return nil, fmt.Errorf("needs OCI hook %s (%s); set cdiImport.allowHooks to serve it", h.Path, h.HookName)
		}
		if !filepath.IsAbs(h.Path) {
			return nil, fmt.Errorf("hook path %q is not absolute", h.Path)
		}
		if _, err := c.host.Stat(strings.TrimPrefix(path.Clean(h.Path), "/")); err != nil {
			return nil, fmt.Errorf("hook %s: %w", h.Path, err)
		}
		env := slices.Clone(h.Env)
		if len(env) == 0 {
			env = slices.Clone(HookEnv)
		}
		e.Hooks = append(e.Hooks, inventory.Hook{Stage: h.HookName, Path: h.Path, Args: slices.Clone(h.Args), Env: env, Timeout: h.Timeout})
	}
	return e, nil
}

// node checks a spec's device node against the host: it must exist as a
// device there; its type and numbers are taken from the host node.
func (c checker) node(n *specs.DeviceNode) (inventory.DeviceNode, error) {
	hostPath := n.HostPath
	if hostPath == "" {
		hostPath = n.Path
	}
	if !filepath.IsAbs(n.Path) || !filepath.IsAbs(hostPath) {
		return inventory.DeviceNode{}, fmt.Errorf("device node %q: paths must be absolute", n.Path)
	}
	host, err := discover.CharDevice(c.host, hostPath)
	if err != nil {
		return inventory.DeviceNode{}, fmt.Errorf("device node %s: %w", hostPath, err)
	}
	major, minor := host.Major, host.Minor
	if n.Major != 0 && (n.Major != major || n.Minor != minor) {
		return inventory.DeviceNode{}, fmt.Errorf("device node %s is %d:%d on the host, the spec says %d:%d", hostPath, major, minor, n.Major, n.Minor)
	}
	mode := host.Mode
	if n.FileMode != nil {
		mode = uint32(n.FileMode.Perm())
	}
	return inventory.DeviceNode{Path: path.Clean(n.Path), Major: major, Minor: minor, Mode: mode}, nil
}
