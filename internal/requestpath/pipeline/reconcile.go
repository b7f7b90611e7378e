package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Bounds on what reconcile reads of the runtime's side of a container
// (see request.MaxEnvEntries for the request's own): over one, the
// container is refused with an error that says which, never read in part.
const (
	// maxCDIAnnotation bounds a cdi.k8s.io/ annotation value that is read
	// for device names.
	maxCDIAnnotation = 4096
	// maxAnnotations bounds the container's annotations that are looked
	// through for cdi.k8s.io/ ones: the runtime's own dozen, and the
	// pod's that it passes on.
	maxAnnotations = 4096
	// maxCDINames bounds the CDI device names, NRI's list and those of
	// the cdi.k8s.io/ annotations together; a container gets a few.
	maxCDINames = 256
	// maxDevices bounds the device nodes the runtime gives a container
	// (a privileged one gets the host's /dev, a few hundred): each is
	// compared with the node's few GPU and control nodes.
	maxDevices = 4096
)

// DevicePluginCDIKind is the vendor/class of the CDI devices that NVIDIA's
// k8s-device-plugin hands the kubelet with DEVICE_LIST_STRATEGY
// cdi-annotations or cdi-cri (k8s.device-plugin.nvidia.com/gpu=<ID>, from
// a spec it writes itself): NVIDIA GPUs like nvidia.com/gpu's.
const DevicePluginCDIKind = "k8s.device-plugin.nvidia.com/gpu"

// nvidiaCDIKind reports whether a CDI vendor/class names NVIDIA GPUs for
// a source of the given kind: the source's own, and NVIDIA's device
// plugin's for an NVIDIA source.
func nvidiaCDIKind(kind, sourceKind string) bool {
	return kind == sourceKind || sourceKind == inventory.KindNVIDIA && kind == DevicePluginCDIKind
}

// runtimeCDIDevices returns the NVIDIA CDI devices the runtime injects
// into the container itself: those NRI lists (containerd 2.4), and those
// named by the container's CDI annotations (cdi.k8s.io/...), the form in
// which the CRI plugin passes a container's CDI devices (older runtimes do
// not list them in NRI). Sorted, without duplicates.
func runtimeCDIDevices(ctr *api.Container) ([]string, error) {
	var out []string
	names := 0
	add := func(name, from string) error {
		if names++; names > maxCDINames {
			return errors.New("nri-gpu: " + from + ": the container has more than " + strconv.Itoa(maxCDINames) + " CDI devices")
		}
		name = strings.TrimSpace(name)
		vendor, class, _, err := parser.ParseQualifiedName(name)
		if err != nil {
			return nil
		}
		if kind := vendor + "/" + class; kind == request.CDIKindGPU || kind == request.CDIKindManagement || kind == DevicePluginCDIKind {
			out = append(out, name)
		}
		return nil
	}
	for _, d := range ctr.GetCDIDevices() {
		if err := add(d.GetName(), "the runtime's CDI devices"); err != nil {
			return nil, err
		}
	}
	ann := ctr.GetAnnotations()
	if len(ann) > maxAnnotations {
		return nil, fmt.Errorf("nri-gpu: container annotations: %d annotations (at most %d)", len(ann), maxAnnotations)
	}
	for key, val := range ann {
		if !strings.HasPrefix(key, cdi.AnnotationPrefix) {
			continue
		}
		if len(val) > maxCDIAnnotation {
			return nil, fmt.Errorf("nri-gpu: container annotation %s: value is %d bytes long (at most %d)", key, len(val), maxCDIAnnotation)
		}
		for name := range strings.SplitSeq(val, ",") {
			if err := add(name, "container annotation "+key); err != nil {
				return nil, err
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// isPrivileged reports whether the runtime gave the container every host
// device: a privileged container. containerd's CRI (checked with 2.4)
// gives one every device node of the host's /dev and one device cgroup
// rule, allow all: {allow: true, access: "rwm"}, no type, no numbers; a
// container given devices one by one (a device plugin's DeviceSpecs,
// --device) has a deny-all rule and one allow rule per device. So the
// rule tells them apart: a container whose device cgroup rules allow
// every device (an allow rule of type "a" or none, without major and
// minor, with read and write access), with no deny rule after it, is
// privileged, and its device nodes say nothing of which GPUs it was
// given. Kubernetes gives no unprivileged container such a rule, so a pod
// author cannot produce it without being privileged (and so root on the
// node already).
func isPrivileged(ctr *api.Container) bool {
	all := false
	for _, r := range ctr.GetLinux().GetResources().GetDevices() {
		every := (r.GetType() == "" || r.GetType() == "a") && anyNumber(r.GetMajor()) && anyNumber(r.GetMinor())
		switch {
		case r.GetAllow() && every && strings.Contains(r.GetAccess(), "r") && strings.Contains(r.GetAccess(), "w"):
			all = true
		case !r.GetAllow():
			all = false
		}
	}
	return all
}

// anyNumber reports whether a device cgroup rule's major or minor matches
// every number: unset, or -1 (the runtime spec's wildcard).
func anyNumber(n *api.OptionalInt64) bool { return n == nil || n.GetValue() == -1 }

// runtimeGPUs returns the devices whose nodes the container already has
// from the runtime, in index order.
func runtimeGPUs(devs []inventory.GPU, ctr *api.Container) ([]inventory.GPU, error) {
	have := ctr.GetLinux().GetDevices()
	if len(have) == 0 {
		return nil, nil
	}
	if len(have) > maxDevices {
		return nil, fmt.Errorf("nri-gpu: container devices: %d device nodes (at most %d)", len(have), maxDevices)
	}
	var out []inventory.GPU
	for _, g := range devs {
		if hasNode(have, g.Node) && (g.MIG == nil || hasNode(have, g.MIG.CINode)) {
			out = append(out, g)
		}
	}
	return out, nil
}

// hasNode reports whether the devices hold n, by path or by number.
func hasNode(have []*api.LinuxDevice, n inventory.DeviceNode) bool {
	for _, d := range have {
		if d.GetPath() == n.Path || d.GetType() == "c" && d.GetMajor() == n.Major && d.GetMinor() == n.Minor {
			return true
		}
	}
	return false
}

// addNodes adds the nodes that the edits lack (by path).
func addNodes(e *adjust.Edits, nodes []inventory.DeviceNode) {
	for _, n := range nodes {
		if !slices.ContainsFunc(e.Devices, func(d inventory.DeviceNode) bool { return d.Path == n.Path }) {
			e.Devices = append(e.Devices, n)
		}
	}
}

// dropExisting adjusts the edits to a container that already has NVIDIA
// device nodes from the runtime (a device plugin's --device, a runtime
// class, CDI resolved before NRI). When it has GPU nodes of the inventory
// (gv.gpus), the runtime decided its GPUs: no GPU node is added (an
// image's NVIDIA_VISIBLE_DEVICES=all must not widen them) and
// NVIDIA_VISIBLE_DEVICES names the GPUs it has. Device nodes (by path or
// number) and mount destinations it already has are dropped. It says which
// nodes it had ("/dev/nvidia0, /dev/nvidiactl"; empty when none) and how
// many were GPUs. A privileged container has every node of the host
// (gv.every, and no gv.gpus): its GPU nodes decide nothing, and
// NVIDIA_VISIBLE_DEVICES stays as the request made it.
func dropExisting(e *adjust.Edits, devs []inventory.GPU, ctr *api.Container, gv given) (string, int) {
	have := ctr.GetLinux().GetDevices()
	var nv []string
	for _, d := range have {
		if strings.HasPrefix(d.GetPath(), "/dev/nvidia") {
			nv = append(nv, d.GetPath())
		}
	}
	if len(nv) == 0 {
		return "", 0
	}
	isGPU := map[string]bool{}
	for _, g := range devs {
		isGPU[g.Node.Path] = true
		if g.MIG != nil {
			isGPU[g.MIG.GINode.Path], isGPU[g.MIG.CINode.Path] = true, true
		}
	}
	kept := e.Devices[:0:0]
	for _, n := range e.Devices {
		if !hasNode(have, n) && (len(gv.gpus) == 0 || !isGPU[n.Path]) {
			kept = append(kept, n)
		}
	}
	e.Devices = kept
	if len(gv.gpus) > 0 && e.VisibleDevices != "void" {
		e.VisibleDevices = strings.Join(uuids(gv.gpus), ",")
	}
	// One pass over the container's mounts (bounded by
	// request.MaxMounts), against the edits' few dozen destinations.
	dst := make(map[string]bool, len(e.Mounts))
	for _, m := range e.Mounts {
		dst[m.Destination] = false
	}
	// Binaries the runtime put at /usr/bin (a CDI spec of layout:
	// toolkit, as nri-gpu cdi generate writes) need no binary directory.
	usrBin := e.UsrBin()
	for _, m := range usrBin {
		dst[m.Destination] = false
	}
	for _, cm := range ctr.GetMounts() {
		if _, ok := dst[cm.GetDestination()]; ok {
			dst[cm.GetDestination()] = true
		}
	}
	haveBin := len(usrBin) > 0
	for _, m := range usrBin {
		haveBin = haveBin && dst[m.Destination]
	}
	n := len(e.Mounts)
	if haveBin {
		e.DropBinaryDirs()
	}
	ms := e.Mounts[:0:0]
	for _, m := range e.Mounts {
		if !dst[m.Destination] {
			ms = append(ms, m)
		}
	}
	// Files counts for logging; a dropped mount is one file or one
	// directory of them, so the count is a lower bound then.
	e.Files = max(0, e.Files-(n-len(ms)))
	e.Mounts = ms
	return strings.Join(nv, ", "), len(gv.gpus)
}
