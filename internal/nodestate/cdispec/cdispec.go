// Package cdispec exports nri-gpu's view of a node as a Container Device
// Interface spec, so that runtimes that resolve CDI devices themselves
// (containerd, CRI-O, Podman, Docker 25+) give a container the same view as
// an nri-gpu request.
package cdispec

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Kind is the CDI kind of the exported GPUs.
const Kind = inventory.KindNVIDIA

// Generate returns a CDI spec with one device per GPU, named both by index
// and by UUID, one per MIG device, named as the toolkit names them
// (<gpu>:<mig> and MIG-<uuid>), and a device "all". A GPU with MIG enabled
// has no device of its own: nri-gpu never hands it out whole. Each GPU device holds its device node;
// the spec's own edits hold what every request gets with caps: control
// nodes, driver file mounts (the same sources and options as nri-gpu's
// adjustments, including a prepared library directory) and LD_LIBRARY_PATH.
//
// Two things CDI cannot express the way nri-gpu does them: environment
// edits replace a variable, so LD_LIBRARY_PATH is set rather than appended
// to the image's own value; and a list-valued NVIDIA_VISIBLE_DEVICES cannot
// be merged from several devices, so only the device "all" sets it.
func Generate(src adjust.Source, caps inventory.Capabilities) (*specs.Spec, error) {
	if src.Kind() != Kind {
		return nil, fmt.Errorf("the node serves %s devices (cdiImport), which come from CDI specs already; a spec is generated for %s only", src.Kind(), Kind)
	}
	snap := src.Snapshot()
	if snap.DriverVersion == "" {
		return nil, fmt.Errorf("the node has no usable NVIDIA driver (see nri-gpu inventory)")
	}
	common := src.Edits(nil, caps)
	if len(common.BinaryDirs) > 0 {
		return nil, fmt.Errorf("layout nvidia (binaries in binaryDir %s, appended to PATH) cannot be expressed in a CDI spec: its environment edits replace PATH instead of appending to it; generate the spec with layout: toolkit (binaries at /usr/bin), as nri-gpu cdi generate does", strings.Join(common.BinaryDirs, ":"))
	}
	spec := &specs.Spec{Kind: Kind}
	spec.ContainerEdits = specs.ContainerEdits{
		DeviceNodes: deviceNodes(common.Devices),
		Mounts:      mounts(common.Mounts),
	}
	if len(common.LibraryDirs) > 0 {
		spec.ContainerEdits.Env = []string{adjust.EnvLibraryPath + "=" + strings.Join(common.LibraryDirs, ":")}
	}
	// What nri-gpu sets only where the image does not (GBM_BACKENDS_PATH,
	// CUDA_MPS_PIPE_DIRECTORY): a CDI spec can only set it.
	spec.ContainerEdits.Env = append(spec.ContainerEdits.Env, common.DefaultEnv...)

	var all []inventory.DeviceNode
	var uuids []string
	graphics := caps.Has(inventory.Graphics) || caps.Has(inventory.Display)
	for _, g := range snap.Units() {
		name, nodes := unitDevice(g, graphics)
		edits := specs.ContainerEdits{DeviceNodes: deviceNodes(nodes)}
		spec.Devices = append(spec.Devices,
			specs.Device{Name: name, ContainerEdits: edits},
			specs.Device{Name: g.UUID, ContainerEdits: edits})
		all = appendNew(all, nodes...)
		uuids = append(uuids, g.UUID)
	}
	if len(all) > 0 {
		spec.Devices = append(spec.Devices, allDevice(src, caps, all, uuids, graphics))
	}
	version, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = version
	return spec, nil
}

// unitDevice returns the name (besides its UUID) and the device nodes of
// the CDI device of a GPU or MIG device. A MIG device is named as the
// toolkit names it (<gpu>:<mig>), with its parent's node and its GPU and
// compute instances' capability nodes; MIG has no graphics. A GPU is named
// by its index, with its node and, for graphics or display, its DRM nodes.
func unitDevice(g inventory.GPU, graphics bool) (string, []inventory.DeviceNode) {
	if g.MIG != nil {
		return g.MIG.Name(), []inventory.DeviceNode{g.Node, g.MIG.GINode, g.MIG.CINode}
	}
	nodes := []inventory.DeviceNode{g.Node}
	if graphics {
		// The GPU's DRM nodes, as a request with graphics or display gets
		// them. The application profile and by-path links are prepared
		// per set of GPUs: a runtime appends the mounts of every device a
		// container names, and two devices' mounts at one path would
		// shadow each other, so only the device "all" carries them
		// (allDevice).
		for _, n := range []inventory.DeviceNode{g.Card(), g.Render()} {
			if n.Path != "" {
				nodes = append(nodes, n)
			}
		}
	}
	return strconv.Itoa(g.Index), nodes
}

// allDevice is the CDI device "all": every device node of the units, and
// NVIDIA_VISIBLE_DEVICES naming them all (uuids); with graphics, the
// application profile and by-path links of the set of every GPU, files
// nri-gpu prepared in its library cache (none with libraryMode: files).
func allDevice(src adjust.Source, caps inventory.Capabilities, all []inventory.DeviceNode, uuids []string, graphics bool) specs.Device {
	edits := specs.ContainerEdits{
		DeviceNodes: deviceNodes(all),
		Env:         []string{adjust.EnvVisibleDevices + "=" + strings.Join(uuids, ",")},
	}
	if graphics {
		var set []inventory.Mount
		for _, m := range src.Edits(src.Snapshot().GPUs, caps).Mounts {
			if m.Destination == adjust.ProfileDestination || m.Destination == adjust.ByPathDestination {
				set = append(set, m)
			}
		}
		edits.Mounts = mounts(set)
	}
	return specs.Device{Name: "all", ContainerEdits: edits}
}

// IMEXKind is the CDI kind of the exported IMEX channels, the NVIDIA
// Container Toolkit's.
const IMEXKind = "nvidia.com/imex-channel"

// GenerateIMEX returns a CDI spec of kind IMEXKind with one device per IMEX
// channel of the node, named by its number (nvidia.com/imex-channel=0), as
// the NVIDIA Container Toolkit names them; each holds the channel's node.
// A node without channels is an error: there is nothing to export.
func GenerateIMEX(src adjust.Source) (*specs.Spec, error) {
	if src.Kind() != Kind {
		return nil, fmt.Errorf("the node serves %s devices (cdiImport), which come from CDI specs already; a spec is generated for %s only", src.Kind(), Kind)
	}
	chans := src.Snapshot().IMEXChannels
	if len(chans) == 0 {
		return nil, fmt.Errorf("the node has no IMEX channels (%s; see nri-gpu inventory)", inventory.IMEXChannelDir)
	}
	spec := &specs.Spec{Kind: IMEXKind}
	for _, ch := range chans {
		spec.Devices = append(spec.Devices, specs.Device{
			Name:           strconv.Itoa(ch.Number),
			ContainerEdits: specs.ContainerEdits{DeviceNodes: deviceNodes([]inventory.DeviceNode{ch.Node})},
		})
	}
	version, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = version
	return spec, nil
}

// appendNew appends the nodes of add that list lacks (a MIG device's
// parent node is shared with its siblings).
func appendNew(list []inventory.DeviceNode, add ...inventory.DeviceNode) []inventory.DeviceNode {
	for _, n := range add {
		if !slices.Contains(list, n) {
			list = append(list, n)
		}
	}
	return list
}

func deviceNodes(nodes []inventory.DeviceNode) []*specs.DeviceNode {
	out := make([]*specs.DeviceNode, 0, len(nodes))
	for _, n := range nodes {
		mode := os.FileMode(n.Mode)
		d := &specs.DeviceNode{
			Path: n.Path, Type: "c", Major: n.Major, Minor: n.Minor,
			FileMode: &mode, Permissions: "rw",
		}
		if n.GID != 0 {
			gid := n.GID
			d.GID = &gid
		}
		out = append(out, d)
	}
	return out
}

func mounts(ms []inventory.Mount) []*specs.Mount {
	out := make([]*specs.Mount, 0, len(ms))
	for _, m := range ms {
		sm := &specs.Mount{
			HostPath: m.Source, ContainerPath: m.Destination, Type: "bind",
			Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate"},
		}
		if m.Type != "" {
			// The IPC endpoints' own options (writable, noexec).
			sm.Type, sm.Options = m.Type, m.Options
		}
		out = append(out, sm)
	}
	return out
}

// Marshal returns the spec as YAML after checking it with the CDI
// library's own validation (the same a runtime applies when it loads it).
func Marshal(spec *specs.Spec) ([]byte, error) {
	data, err := yaml.Marshal(spec)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "nri-gpu-cdi-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "nri-gpu.yaml")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return nil, err
	}
	if _, err := cdi.ReadSpec(p, 0); err != nil {
		return nil, fmt.Errorf("the generated CDI spec does not validate: %w", err)
	}
	return data, nil
}
