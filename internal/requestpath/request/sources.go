package request

import (
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

// Request sources besides nri-gpu's own annotations and the environment.
const (
	// AnnotationCDIContainerPrefix and AnnotationCDIPod are the NVIDIA
	// toolkit's CDI annotations: a comma list of CDI device names, read by
	// the toolkit's own NRI plugin.
	AnnotationCDIDomain          = "nvidia.cdi.k8s.io"
	AnnotationCDIContainerPrefix = AnnotationCDIDomain + "/container."
	AnnotationCDIPod             = AnnotationCDIDomain + "/pod"
	// DeviceListRoot is where the Kubernetes device plugin's
	// volume-mounts strategy mounts /dev/null once per device ID; it then
	// sets NVIDIA_VISIBLE_DEVICES to this directory.
	DeviceListRoot = "/var/run/nvidia-container-devices"
	// CDI kinds nri-gpu serves.
	CDIKindGPU        = inventory.KindNVIDIA
	CDIKindManagement = "management.nvidia.com/gpu"
)

// maxDeviceList bounds the device IDs taken from mounts or a CDI list; a
// node has at most a few dozen GPUs.
const maxDeviceList = 256

// Input is everything of a container that may carry a GPU request.
type Input struct {
	// Annotations are the pod's annotations.
	Annotations map[string]string
	// Name is the container's name.
	Name string
	// Env is the container's environment, "KEY=value" entries.
	Env []string
	// Mounts are the container's mounts.
	Mounts []inventory.Mount
}

// ParseInput finds and parses the container's request. Sources, the first
// present wins:
//
//  1. annotation gpus.nri-gpu.dev/container.<name>, then gpus.nri-gpu.dev/pod;
//  2. annotation nvidia.cdi.k8s.io/container.<name>, then nvidia.cdi.k8s.io/pod;
//  3. the device plugin's /dev/null mounts under /var/run/nvidia-container-devices;
//  4. env NVIDIA_VISIBLE_DEVICES.
//
// The request's Source says which one it was. It is Find then Parse; the
// request path calls them apart, to decide on the policy in between.
func ParseInput(in Input) (Request, error) {
	f, err := Find(in)
	if err != nil {
		return Request{}, err
	}
	return f.Parse()
}

// parseCDI parses a comma list of CDI device names. nvidia.com/gpu=<ID>
// names a GPU by index, UUID or bus id as NVIDIA_VISIBLE_DEVICES does, and
// nvidia.com/gpu=all every GPU; management.nvidia.com/gpu=all is every GPU
// and every control node, for management tools.
func parseCDI(src Source, val string, capsEnv envValue) (Request, error) {
	const valid = "valid: " + CDIKindGPU + "=<index|GPU-uuid|bus id|all>, " + CDIKindManagement + "=all"
	r := Request{Source: src}
	if len(val) > maxAnnotation {
		return r, errorf(src, "value is %d bytes long (at most %d)", len(val), maxAnnotation)
	}
	var all bool
	for _, name := range strings.Split(val, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		vendor, class, dev, err := parser.ParseQualifiedName(name)
		if err != nil {
			return r, errorf(src, "malformed CDI device name %s: %v (%s)", quote(name), err, valid)
		}
		switch kind := vendor + "/" + class; {
		case kind == CDIKindManagement && dev == "all":
			r.Management = true
		case kind == CDIKindManagement:
			return r, errorf(src, "unknown CDI device %s (%s)", quote(name), valid)
		case kind == CDIKindGPU && dev == "all":
			all = true
		case kind == CDIKindGPU:
			if len(r.IDs) >= maxDeviceList {
				return r, errorf(src, "more than %d devices", maxDeviceList)
			}
			r.IDs = append(r.IDs, dev)
		default:
			return r, errorf(src, "unknown CDI device %s: nri-gpu serves only the kinds %s and %s (%s)", quote(name), CDIKindGPU, CDIKindManagement, valid)
		}
	}
	switch {
	case r.Management:
		r.Kind, r.IDs = All, nil
	case all:
		r.Kind, r.IDs = All, nil
	case len(r.IDs) > 0:
		r.Kind = Devices
	default:
		return r, errorf(src, "no CDI device named (%s)", valid)
	}
	caps, capsSrc, err := envCapabilities(capsEnv)
	if err != nil {
		return r, err
	}
	r.Caps, r.CapsSource = caps, capsSrc
	return r, nil
}

// effectiveAnnotation finds the annotation of domain that applies to the
// container named name, by NRI's convention for effective annotations
// (github.com/containerd/nri/pkg/plugin.GetEffectiveAnnotation): the
// container's, <domain>/container.<name>, before the pod's, <domain>/pod.
// NRI also reads a bare <domain> as the pod's; nri-gpu does not, as that
// would be one more way to ask for GPUs. The key is built again when
// found: one built up front would be allocated for every container.
func effectiveAnnotation(ann map[string]string, domain, name string) (key, val string, ok bool) {
	if val, ok := ann[domain+"/container."+name]; ok {
		return domain + "/container." + name, val, true
	}
	if val, ok := ann[domain+"/pod"]; ok {
		return domain + "/pod", val, true
	}
	return "", "", false
}

// deviceListFromMounts returns the device IDs that the device plugin's
// volume-mounts strategy lists (see deviceListID), duplicates dropped, in
// their order; more than maxDeviceList is an error.
func deviceListFromMounts(mounts []inventory.Mount) ([]string, error) {
	var ids []string
	seen := map[string]bool{}
	for i := range mounts {
		id, ok, err := deviceListID(&mounts[i])
		if err != nil {
			return nil, err
		}
		if !ok || seen[id] {
			continue
		}
		if len(ids) == maxDeviceList {
			src := Source{DeviceList, DeviceListRoot}
			return nil, errorf(src, "more than %d devices", maxDeviceList)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	return ids, nil
}

// parseDeviceList turns the device IDs of the mount list into a request:
// "all", "none" and "void" as in NVIDIA_VISIBLE_DEVICES, "cdi/<vendor>/<class>/<name>"
// or "cdi/<vendor>/<class>=<name>" as a CDI name.
func parseDeviceList(ids []string, caps envValue) (Request, error) {
	src := Source{DeviceList, DeviceListRoot}
	var names []string
	for _, id := range ids {
		if cdi, ok := strings.CutPrefix(id, "cdi/"); ok {
			if !parser.IsQualifiedName(cdi) {
				if parts := strings.SplitN(cdi, "/", 3); len(parts) == 3 {
					cdi = parts[0] + "/" + parts[1] + "=" + parts[2]
				}
			}
			names = append(names, cdi)
		}
	}
	if len(names) > 0 {
		if len(names) != len(ids) {
			return Request{Source: src}, errorf(src, "mixes CDI names and device IDs")
		}
		return parseCDI(src, strings.Join(names, ","), caps)
	}
	return visibleDevices(src, ids, caps)
}
