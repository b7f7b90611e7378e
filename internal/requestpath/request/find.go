package request

import (
	"path"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Bounds on what the request path reads of one container. The runtime
// bounds a whole CreateContainer message at 4 MiB (ttrpc's
// messageLengthMax, which NRI uses), and gives a plugin 2 s (NRI's
// DefaultPluginRequestTimeout) under a lock that every container start of
// the node waits on; these bounds keep one request's work to well under a
// millisecond whatever a pod author writes. An input over a bound is an
// error naming its source, never cut short.
const (
	// MaxEnvEntries bounds the environment entries of a container that
	// are looked at. Images set a few dozen; Kubernetes adds 7 per
	// service of the namespace (service links): 16384 entries are a
	// namespace of over 2000 services. (Linux's exec limit, a quarter of the 8 MiB
	// stack, allows about 190 000 of the shortest.)
	MaxEnvEntries = 1 << 14
	// MaxMounts bounds the mounts of a container that are looked at for
	// the device plugin's device list: one per volume mount of the pod,
	// plus the runtime's own dozen.
	MaxMounts = 4096
	// maxEnvValue bounds NVIDIA_VISIBLE_DEVICES and
	// NVIDIA_DRIVER_CAPABILITIES: maxDeviceList IDs of up to about 60
	// bytes (a MIG device's UUID) fit.
	maxEnvValue = 16 << 10
	// maxPath bounds a device-list mount's source and destination:
	// PATH_MAX, as the kernel would refuse a longer path anyway.
	maxPath = 4096
)

// DeviceListName is the directory name of DeviceListRoot. A mount
// destination that cleans to a path under DeviceListRoot has it in one of
// its elements (cleaning only drops and joins elements), so a destination
// without it is passed over without being cleaned.
const DeviceListName = "nvidia-container-devices"

// Found is a container's request carrier, found by its key but not yet
// parsed: what the policy decides on before any value is read. Parse
// turns it into the Request.
type Found struct {
	// Source is the carrier; NoSource when the container asks for
	// nothing.
	Source Source
	// Management is set when the carrier names the management kind
	// (management.nvidia.com/gpu): a CDI annotation, or a device-list
	// entry in CDI form (cdi/...), that holds its name. Parse then makes
	// a management request of it or fails, and makes none of any other
	// carrier (FuzzParseCDI and FuzzParseEnv check it), so the policy
	// decides on the request's class before its value is read.
	Management bool

	val    string // the annotation's value, or NVIDIA_VISIBLE_DEVICES
	caps   envValue
	mounts []inventory.Mount
}

// envValue is an environment variable's value and whether it is set.
type envValue struct {
	val string
	ok  bool
}

// PolicySource is the class of the carrier for the policy, as
// Request.PolicySource.
func (f Found) PolicySource() policy.Source {
	return Request{Source: f.Source, Management: f.Management}.PolicySource()
}

// Find finds the container's request carrier, the first present of (as
// ParseInput lists them): nri-gpu's annotations, the toolkit's CDI
// annotations, the device plugin's device-list mounts,
// NVIDIA_VISIBLE_DEVICES. It looks annotations up by key and makes one
// pass over at most MaxEnvEntries environment entries and MaxMounts
// mounts; it reads no value beyond what says whether the carrier is there
// (and, for CDI names, whether one is of the management kind). A
// container with more entries or mounts than the bounds is an error.
func Find(in Input) (Found, error) {
	var f Found
	vis, caps, err := scanEnv(in.Env)
	if err != nil {
		return f, err
	}
	f.caps = caps
	if in.Name == "" {
		if err := unnamed(in.Annotations); err != nil {
			return f, err
		}
	}
	if key, val, ok := effectiveAnnotation(in.Annotations, AnnotationDomain, in.Name); ok {
		kind := PodAnnotation
		if key != AnnotationPod {
			kind = ContainerAnnotation
		}
		f.Source, f.val = Source{kind, key}, val
		return f, nil
	}
	if key, val, ok := effectiveAnnotation(in.Annotations, AnnotationCDIDomain, in.Name); ok {
		f.Source, f.val = Source{CDIAnnotation, key}, val
		// Bounded: a longer value is refused when parsed.
		f.Management = len(val) <= maxAnnotation && strings.Contains(val, CDIKindManagement)
		return f, nil
	}
	found, mgmt, err := findDeviceList(in.Mounts)
	if err != nil {
		return f, err
	}
	if found {
		f.Source, f.Management, f.mounts = Source{DeviceList, DeviceListRoot}, mgmt, in.Mounts
		return f, nil
	}
	if !vis.ok || noDevices(vis.val) {
		return f, nil
	}
	f.Source, f.val = envSource(EnvVisibleDevices), vis.val
	return f, nil
}

// noDevices reports whether an NVIDIA_VISIBLE_DEVICES value asks for
// nothing as a whole: empty, blank or void. (A list that holds void among
// other entries asks for nothing too; Parse finds that.)
func noDevices(val string) bool {
	if len(val) > maxEnvValue {
		return false
	}
	val = strings.TrimSpace(val)
	return val == "" || val == "void"
}

// Parse parses the value of the carrier Find found, with the container's
// NVIDIA_DRIVER_CAPABILITIES.
func (f Found) Parse() (Request, error) {
	switch f.Source.Kind {
	case ContainerAnnotation, PodAnnotation:
		return parseAnnotation(f.Source, f.val, f.caps)
	case CDIAnnotation:
		return parseCDI(f.Source, f.val, f.caps)
	case DeviceList:
		ids, err := deviceListFromMounts(f.mounts)
		if err != nil {
			return Request{}, err
		}
		return parseDeviceList(ids, f.caps)
	case Env:
		return parseEnv(f.val, f.caps)
	}
	return Request{}, nil
}

// scanEnv finds NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES in
// one pass (the first entry of a key wins, as with getenv(3)).
func scanEnv(env []string) (vis, caps envValue, err error) {
	if len(env) > MaxEnvEntries {
		return vis, caps, errorf(Source{Kind: Env}, "%d entries (at most %d)", len(env), MaxEnvEntries)
	}
	const prefix = "NVIDIA_"
	for _, e := range env {
		if len(e) < len(prefix) || e[0] != 'N' || e[:len(prefix)] != prefix {
			continue
		}
		if v, ok := strings.CutPrefix(e, EnvVisibleDevices+"="); ok && !vis.ok {
			vis = envValue{v, true}
		} else if v, ok := strings.CutPrefix(e, EnvDriverCapabilities+"="); ok && !caps.ok {
			caps = envValue{v, true}
		}
	}
	return vis, caps, nil
}

// CheckMounts returns the error for a container of n mounts when n is
// over MaxMounts, for a caller that would have to convert the mounts to
// call Find.
func CheckMounts(n int) error {
	if n > MaxMounts {
		return errorf(Source{Kind: DeviceList}, "%d mounts (at most %d)", n, MaxMounts)
	}
	return nil
}

// cleanPath is path.Clean, without its cost for a path that is clean
// already (no empty, "." or ".." element, no trailing slash), as the
// device plugin writes them.
func cleanPath(p string) string {
	if len(p) > 1 && p[0] == '/' && p[len(p)-1] != '/' && !strings.Contains(p, "//") && !strings.Contains(p, "/.") {
		return p
	}
	return path.Clean(p)
}

// findDeviceList reports whether the mounts hold a device-list entry
// (see deviceListFromMounts), and whether one is a CDI name that holds the
// management kind's (only CDI names can be management requests,
// parseDeviceList).
func findDeviceList(mounts []inventory.Mount) (found, mgmt bool, err error) {
	if err := CheckMounts(len(mounts)); err != nil {
		return false, false, err
	}
	for i := range mounts {
		id, ok, err := deviceListID(&mounts[i])
		if err != nil {
			return false, false, err
		}
		if ok {
			found = true
			mgmt = mgmt || strings.HasPrefix(id, "cdi/") && strings.Contains(id, CDIKindManagement)
		}
	}
	return found, mgmt, nil
}

// deviceListID returns the device ID a mount lists, if it is a device
// plugin's device-list entry: /dev/null at
// /var/run/nvidia-container-devices/<ID>, as the NVIDIA toolkit reads them
// (paths cleaned, the bare directory dropped, IMEX channels ignored).
func deviceListID(m *inventory.Mount) (string, bool, error) {
	if !strings.Contains(m.Destination, DeviceListName) {
		return "", false, nil
	}
	if len(m.Destination) > maxPath || len(m.Source) > maxPath {
		return "", false, errorf(Source{DeviceList, DeviceListRoot}, "mount of %s at %s: path is longer than %d bytes", quote(m.Source), quote(m.Destination), maxPath)
	}
	dst := cleanPath(m.Destination)
	if !strings.HasPrefix(dst, DeviceListRoot+"/") || m.Source != "/dev/null" && cleanPath(m.Source) != "/dev/null" {
		return "", false, nil
	}
	id := strings.Trim(dst[len(DeviceListRoot):], "/")
	if id == "" || strings.HasPrefix(id, "imex/") {
		return "", false, nil
	}
	return id, true, nil
}

// unnamed refuses a container without a name (the runtime gave none: CRI-O
// names a container to NRI only from the CRI label
// io.kubernetes.container.name, which the kubelet sets and other CRI
// clients may not) in a pod that has per-container annotations: they cannot
// be matched to it, and applying the pod's annotation or the next carrier
// instead would give it what was meant for none of its containers, or for
// another. A pod without per-container annotations is not affected: its
// pod-level annotation applies to every container, named or not. One pass
// over the pod's annotations, only for unnamed containers.
func unnamed(ann map[string]string) error {
	for k := range ann {
		kind := ContainerAnnotation
		if strings.HasPrefix(k, AnnotationCDIContainerPrefix) {
			kind = CDIAnnotation
		} else if !strings.HasPrefix(k, AnnotationContainerPrefix) {
			continue
		}
		return errorf(Source{kind, k}, "the runtime gave the container no name, so no per-container annotation can be matched to it "+
			"(CRI-O takes the name from the CRI label %s, which the kubelet sets); refused rather than falling back to the pod's request: "+
			"set that label, or use %s or %s for every container of the pod", ContainerNameLabel, AnnotationPod, AnnotationCDIPod)
	}
	return nil
}

// ContainerNameLabel is the CRI label with the container's name that the
// kubelet sets on every container; CRI-O's NRI takes the name from it.
const ContainerNameLabel = "io.kubernetes.container.name"
