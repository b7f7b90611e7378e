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

	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// Bounds on what the request path reads of the runtime's side of a
// container (see request.MaxEnvEntries for the request's own): over one,
// the container is refused with an error that says which, never read in
// part.
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

// reconcile looks at what the runtime already gives the container. CDI
// devices of NVIDIA's kinds are the runtime's answer: nothing is added,
// and the note returned ends the path. A device plugin's mount list that
// the policy does not trust alone is refused unless the runtime gave GPU
// device nodes (deviceListBacked).
func (p *Path) reconcile(c *call, r request.Request, g given) (note string, err error) {
	cdi, err := runtimeCDIDevices(c.ctr)
	if err != nil {
		return "", err
	}
	if len(cdi) > 0 {
		return fmt.Sprintf("%s: the runtime already gives the container the CDI devices %s: nothing injected", r.Source, strings.Join(cdi, ", ")), nil
	}
	return "", p.deviceListBacked(c, r, g)
}

// deviceListBacked refuses a device plugin's mount list that the policy
// does not trust on its own in the pod's namespace (policy.TrustsDeviceList)
// unless the runtime gave the container GPU device nodes: a pod allowed
// hostPath volumes can mount /dev/null at
// /var/run/nvidia-container-devices/<ID> itself, but cannot add device
// nodes to its spec. With the nodes, they decide the container's GPUs
// (given.gets), whatever the list names. A privileged container's list is
// taken as it is: it reaches every device of the node anyway.
func (p *Path) deviceListBacked(c *call, r request.Request, g given) error {
	ns := c.pod.GetNamespace()
	if r.PolicySource() != policy.DeviceList || len(g.nodes) > 0 || g.privileged || p.Policy.TrustsDeviceList(ns) {
		return nil
	}
	return &request.Error{Source: r.Source, Msg: fmt.Sprintf("not allowed in namespace %q without the GPUs' device nodes from the runtime "+
		"(%s; the NVIDIA device plugin passes them with PASS_DEVICE_SPECS=true)", ns, p.Policy.Setting(policy.DeviceList))}
}
