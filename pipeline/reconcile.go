package pipeline

import (
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/inventory"
	"github.com/nri-gpu/nri-gpu/request"
)

// maxCDIAnnotation bounds a cdi.k8s.io/ annotation value that is read for
// device names.
const maxCDIAnnotation = 4096

// runtimeCDIDevices returns the NVIDIA CDI devices the runtime injects
// into the container itself: those NRI lists (containerd 2.4), and those
// named by the container's CDI annotations (cdi.k8s.io/...), the form in
// which the CRI plugin passes a container's CDI devices (older runtimes do
// not list them in NRI).
func runtimeCDIDevices(ctr *api.Container) []string {
	var out []string
	add := func(name string) {
		name = strings.TrimSpace(name)
		vendor, class, _, err := parser.ParseQualifiedName(name)
		if err != nil {
			return
		}
		if kind := vendor + "/" + class; (kind == request.CDIKindGPU || kind == request.CDIKindManagement) && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for _, d := range ctr.GetCDIDevices() {
		add(d.GetName())
	}
	for key, val := range ctr.GetAnnotations() {
		if strings.HasPrefix(key, cdi.AnnotationPrefix) && len(val) <= maxCDIAnnotation {
			for _, name := range strings.Split(val, ",") {
				add(name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// runtimeGPUs returns the devices whose nodes the container already has
// from the runtime, in index order.
func runtimeGPUs(devs []inventory.GPU, ctr *api.Container) []inventory.GPU {
	have := ctr.GetLinux().GetDevices()
	if len(have) == 0 {
		return nil
	}
	var out []inventory.GPU
	for _, g := range devs {
		if hasNode(have, g.Node) {
			out = append(out, g)
		}
	}
	return out
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
// class, CDI resolved before NRI). When it has GPU nodes of the inventory,
// the runtime decided its GPUs: no GPU node is added (an image's
// NVIDIA_VISIBLE_DEVICES=all must not widen them) and
// NVIDIA_VISIBLE_DEVICES names the GPUs it has. Device nodes (by path or
// number) and mount destinations it already has are dropped. It says which
// nodes it had ("/dev/nvidia0, /dev/nvidiactl"; empty when none) and how
// many were GPUs.
func dropExisting(e *adjust.Edits, devs []inventory.GPU, ctr *api.Container) (string, int) {
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
	present := func(n inventory.DeviceNode) bool { return hasNode(have, n) }
	var uuids []string
	isGPU := map[string]bool{}
	for _, g := range devs {
		isGPU[g.Node.Path] = true
		if present(g.Node) {
			uuids = append(uuids, g.UUID)
		}
	}
	kept := e.Devices[:0:0]
	for _, n := range e.Devices {
		if !present(n) && (len(uuids) == 0 || !isGPU[n.Path]) {
			kept = append(kept, n)
		}
	}
	e.Devices = kept
	if len(uuids) > 0 && e.VisibleDevices != "void" {
		e.VisibleDevices = strings.Join(uuids, ",")
	}
	ms := e.Mounts[:0:0]
	for _, m := range e.Mounts {
		dup := false
		for _, cm := range ctr.GetMounts() {
			dup = dup || cm.GetDestination() == m.Destination
		}
		if !dup {
			ms = append(ms, m)
		}
	}
	// Files counts for logging; a dropped mount is one file or one
	// directory of them, so the count is a lower bound then.
	e.Files = max(0, e.Files-(len(e.Mounts)-len(ms)))
	e.Mounts = ms
	return strings.Join(nv, ", "), len(uuids)
}
