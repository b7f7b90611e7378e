// Package cdisource is the device source (adjust.Source) of another
// vendor's CDI specs (amd.com/gpu, intel.com/gpu, ...), read through the
// CDI library's cache, so that their devices get nri-gpu's request
// handling and are injected as NRI adjustments. It shows what a new kind
// of device takes: one implementation of adjust.Source, and no branch in
// the request path.
//
// Nothing from a spec is trusted blindly: a spec directory or spec file
// that anyone but root can write (see Trusted), a spec the CDI library
// refuses, a device node or mount source that does not exist on the host,
// a read-write mount or a hook the configuration does not allow, removes
// that device (or, for the spec's own edits or a spec nri-gpu does not
// trust, every device of the spec) with a warning.
package cdisource

import (
	"errors"
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

	"github.com/nri-gpu/nri-gpu/adjust"
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
	// AllowWritableMounts lets devices whose specs mount host paths
	// read-write (without "ro" in the mount's options) be served.
	AllowWritableMounts bool
}

// HookEnv is the environment a hook from a spec gets when the spec gives
// none: never the container's.
var HookEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// Source is the adjust.Source of another vendor's CDI devices. Each device
// brings the spec's own edits and its own, as CDI applies them; NVIDIA's
// capabilities and requirement variables do not apply.
type Source struct {
	kind string
	snap *inventory.Snapshot
	// common are the spec's own edits, nil when it has none; edits[i] are
	// device i's besides its main node.
	common *edits
	edits  []*edits
}

var _ adjust.Source = (*Source)(nil)

// edits are container edits taken from a CDI spec. Paths of mounts are
// host paths as the runtime sees them, checked to exist at discovery.
type edits struct {
	nodes  []inventory.DeviceNode
	mounts []inventory.Mount
	// env entries are KEY=VALUE; they set (replace) the variable.
	env   []string
	hooks []inventory.Hook
}

// Discover reads the specs and returns the source of Kind's devices.
func Discover(o Options) (*Source, error) {
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

	snap := &inventory.Snapshot{HostRoot: o.HostRoot}
	src := &Source{kind: o.Kind, snap: snap}
	warnf := func(format string, args ...any) {
		snap.Warnings = append(snap.Warnings, fmt.Sprintf(format, args...))
	}
	specs, err := vendorSpecs(o.SpecDirs, vendor, warnf)
	if err != nil {
		return nil, err
	}
	c := checker{host: host, allowHooks: o.AllowHooks, allowWritableMounts: o.AllowWritableMounts}
	var devices []cdiDevice
	devices, src.common = c.devices(specs, o.Kind, class, warnf)
	sortDevices(devices)
	for i, d := range devices {
		main := d.edits.nodes[0]
		rest := *d.edits
		rest.nodes = slices.Clone(d.edits.nodes[1:])
		snap.GPUs = append(snap.GPUs, inventory.GPU{
			Index: i, Minor: int(main.Minor), Name: d.name, Node: main, NUMANode: inventory.NoNUMANode,
		})
		src.edits = append(src.edits, &rest)
	}
	if len(snap.GPUs) == 0 {
		warnf("no usable CDI device of kind %s in %v", o.Kind, o.SpecDirs)
	}
	return src, nil
}

// vendorSpecs reads the CDI specs of vendor in the trusted ones of dirs;
// a directory or spec refused is a warning.
func vendorSpecs(dirs []string, vendor string, warnf func(string, ...any)) ([]*cdi.Spec, error) {
	var trusted []string
	for _, d := range dirs {
		if why := Trusted(d); why != "" {
			warnf("CDI spec directory %s refused: %s: none of its specs is read", d, why)
			continue
		}
		trusted = append(trusted, d)
	}
	if len(trusted) == 0 { // none would be the CDI library's default directories
		return nil, nil
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(trusted...), cdi.WithAutoRefresh(false))
	if cache == nil {
		return nil, fmt.Errorf("reading CDI specs: %w", err)
	}
	for p, errs := range cache.GetErrors() {
		for _, e := range errs {
			warnf("CDI spec %s refused: %v", p, e)
		}
	}
	return cache.GetVendorSpecs(vendor), nil
}

// cdiDevice is a device of a spec, with its checked edits.
type cdiDevice struct {
	name  string
	edits *edits
}

// devices returns the usable devices of the specs of class (kind is
// vendor/class, for messages) and the edits common to them: at most one
// spec may have edits of its own. A spec or device that cannot be used is
// left out with a warning.
func (c checker) devices(specs []*cdi.Spec, kind, class string, warnf func(string, ...any)) ([]cdiDevice, *edits) {
	var devices []cdiDevice
	var common *edits
	for _, spec := range specs {
		if spec.GetClass() != class {
			continue
		}
		if why := Trusted(spec.GetPath()); why != "" {
			warnf("CDI spec %s refused: %s: none of its devices is offered", spec.GetPath(), why)
			continue
		}
		specEdits, err := c.edits(spec.ContainerEdits)
		if err != nil {
			warnf("CDI spec %s: its own edits are unusable (%v): none of its devices is offered", spec.GetPath(), err)
			continue
		}
		if common != nil && !isEmpty(specEdits) {
			warnf("CDI spec %s: a second spec of %s with edits of its own: its devices are not offered", spec.GetPath(), kind)
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
				warnf("CDI device %s=%s: not offered: %v", kind, d.Name, err)
				continue
			}
			if len(e.nodes) == 0 {
				warnf("CDI device %s=%s: not offered: it has no device node", kind, d.Name)
				continue
			}
			devices = append(devices, cdiDevice{name: d.Name, edits: e})
		}
	}
	return devices, common
}

// sortDevices orders devices as they are indexed: numeric names first by
// value (as their vendors number devices), then the others by name.
func sortDevices(devices []cdiDevice) {
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
}

// checker turns a spec's edits into inventory edits, checking them
// against the host.
type checker struct {
	host                *os.Root
	allowHooks          bool
	allowWritableMounts bool
}

func isEmpty(e *edits) bool {
	return len(e.nodes) == 0 && len(e.mounts) == 0 && len(e.env) == 0 && len(e.hooks) == 0
}

func (c checker) edits(ce specs.ContainerEdits) (*edits, error) {
	e := &edits{}
	if len(ce.NetDevices) > 0 || ce.IntelRdt != nil || len(ce.AdditionalGIDs) > 0 {
		return nil, fmt.Errorf("edits nri-gpu does not inject (network devices, RDT, additional GIDs)")
	}
	for _, n := range ce.DeviceNodes {
		node, err := c.node(n)
		if err != nil {
			return nil, err
		}
		e.nodes = append(e.nodes, node)
	}
	for _, m := range ce.Mounts {
		if !filepath.IsAbs(m.HostPath) || !filepath.IsAbs(m.ContainerPath) {
			return nil, fmt.Errorf("mount %s -> %s: paths must be absolute", m.HostPath, m.ContainerPath)
		}
		if _, err := c.host.Stat(strings.TrimPrefix(path.Clean(m.HostPath), "/")); err != nil {
			return nil, fmt.Errorf("mount source %s: %w", m.HostPath, err)
		}
		if !c.allowWritableMounts && !readOnly(m.Options) {
			return nil, fmt.Errorf("mount %s -> %s is read-write (no \"ro\" in its options %q); set cdiImport.allowWritableMounts to serve it", m.HostPath, m.ContainerPath, m.Options)
		}
		typ := m.Type
		if typ == "" {
			typ = "bind"
		}
		e.mounts = append(e.mounts, inventory.Mount{Source: path.Clean(m.HostPath), Destination: path.Clean(m.ContainerPath), Type: typ, Options: slices.Clone(m.Options)})
	}
	for _, kv := range ce.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("env entry %q is not KEY=VALUE", kv)
		}
		e.env = append(e.env, kv)
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
		e.hooks = append(e.hooks, inventory.Hook{Stage: h.HookName, Path: h.Path, Args: slices.Clone(h.Args), Env: env, Timeout: h.Timeout})
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

// Snapshot returns the devices found, with the warnings of discovery.
func (s *Source) Snapshot() *inventory.Snapshot { return s.snap }

// Kind returns the CDI kind served, "amd.com/gpu".
func (s *Source) Kind() string { return s.kind }

// Devices returns the devices found, by index.
func (s *Source) Devices() []inventory.GPU { return s.snap.GPUs }

// Problem returns "": the devices found can always be served.
func (s *Source) Problem() string { return "" }

// Control returns nothing: the specs' node-wide nodes come with every
// device's edits.
func (s *Source) Control() []inventory.DeviceNode { return nil }

// Check returns nil: requirement variables are NVIDIA's and say nothing
// about other vendors' devices.
func (s *Source) Check([]string, []inventory.GPU) error { return nil }

// Lookup finds a device by its CDI name or, as for GPUs, by its index.
func (s *Source) Lookup(id string) (inventory.GPU, error) {
	names := make([]string, 0, len(s.snap.GPUs))
	for _, g := range s.snap.GPUs {
		if g.Name == id {
			return g, nil
		}
		names = append(names, g.Name)
	}
	if n, err := strconv.Atoi(id); err == nil && id != "" && strings.Trim(id, "0123456789") == "" {
		for _, g := range s.snap.GPUs {
			if g.Index == n {
				return g, nil
			}
		}
	}
	return inventory.GPU{}, errors.New("unknown device " + quote(id) + " (" + s.kind + " devices of the node: " + quote(strings.Join(names, ",")) + ")")
}

// Edits returns the spec's own edits, then each device's, as CDI applies
// them; a node named twice is created once.
func (s *Source) Edits(devs []inventory.GPU, _ inventory.Capabilities) adjust.Edits {
	var e adjust.Edits
	add := func(x *edits) {
		if x == nil {
			return
		}
		e.Devices = append(e.Devices, x.nodes...)
		e.Mounts = append(e.Mounts, x.mounts...)
		e.Env = append(e.Env, x.env...)
		e.Hooks = append(e.Hooks, x.hooks...)
	}
	add(s.common)
	for _, g := range devs {
		e.Devices = append(e.Devices, g.Node)
		if g.Index >= 0 && g.Index < len(s.edits) {
			add(s.edits[g.Index])
		}
	}
	e.Devices = dedupNodes(e.Devices)
	e.Files = len(e.Mounts)
	return e
}

// dedupNodes drops repeated nodes (a node both in a spec's edits and a
// device's), keeping the first.
func dedupNodes(nodes []inventory.DeviceNode) []inventory.DeviceNode {
	out := nodes[:0]
	seen := map[string]bool{}
	for _, n := range nodes {
		if !seen[n.Path] {
			seen[n.Path] = true
			out = append(out, n)
		}
	}
	return out
}

// quote quotes a user's token for a message, cutting very long ones.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.Quote(s)
}
