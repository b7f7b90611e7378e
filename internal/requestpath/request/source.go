package request

import "github.com/nri-gpu/nri-gpu/internal/nodestate/policy"

// Source says where a request came from: the kind of carrier and its key.
// It is what messages name, what the policy decides on and what metrics
// count, so that none of them reads it back from a string.
type Source struct {
	Kind SourceKind
	// Key is the annotation key, the environment variable or the mount
	// directory.
	Key string
}

// SourceKind is a kind of request carrier.
type SourceKind uint8

// Kinds of request carriers.
const (
	// NoSource: no request.
	NoSource SourceKind = iota
	// ContainerAnnotation is gpus.nri-gpu.dev/container.<name>.
	ContainerAnnotation
	// PodAnnotation is gpus.nri-gpu.dev/pod.
	PodAnnotation
	// CDIAnnotation is the NVIDIA toolkit's nvidia.cdi.k8s.io/container.<name>
	// or nvidia.cdi.k8s.io/pod.
	CDIAnnotation
	// DeviceList is the device plugin's /dev/null mounts under
	// /var/run/nvidia-container-devices.
	DeviceList
	// Env is an environment variable of the container.
	Env
	// Kubelet is the kubelet's assignment, from nri-gpu's device plugin:
	// the container annotation gpus.nri-gpu.dev/kubelet, trusted only
	// beside the GPUs' device nodes (see KubeletRequest).
	Kubelet
	// Claim is a Dynamic Resource Allocation claim that nri-gpu's DRA
	// driver prepared: Key is the claim's namespace/name, trusted only
	// beside the devices' nodes (see ClaimRequest).
	Claim
)

// Label names the kind in metrics: container-annotation, pod-annotation,
// cdi-annotation, device-list, env, kubelet, claim or none.
func (k SourceKind) Label() string {
	switch k {
	case ContainerAnnotation:
		return "container-annotation"
	case PodAnnotation:
		return "pod-annotation"
	case CDIAnnotation:
		return "cdi-annotation"
	case DeviceList:
		return "device-list"
	case Env:
		return "env"
	case Kubelet:
		return "kubelet"
	case Claim:
		return "claim"
	}
	return "none"
}

// SourceLabels are the labels of every kind, for metrics that list them
// up front.
var SourceLabels = []string{
	ContainerAnnotation.Label(), PodAnnotation.Label(), CDIAnnotation.Label(),
	DeviceList.Label(), Env.Label(), Kubelet.Label(), Claim.Label(), NoSource.Label(),
}

// String names the source in messages: "annotation
// gpus.nri-gpu.dev/container.train", "env NVIDIA_VISIBLE_DEVICES" or
// "mounts /var/run/nvidia-container-devices".
func (s Source) String() string {
	// The sources whose key is fixed print without an allocation.
	switch {
	case s.Kind == Env && s.Key == EnvVisibleDevices:
		return "env " + EnvVisibleDevices
	case s.Kind == DeviceList && s.Key == DeviceListRoot:
		return "mounts " + DeviceListRoot
	case s.Kind == PodAnnotation && s.Key == AnnotationPod:
		return "annotation " + AnnotationPod
	}
	switch {
	case s.Kind == Env && s.Key == "":
		return "env" // the environment as a whole
	case s.Kind == DeviceList && s.Key == "":
		return "mounts" // the container's mounts as a whole
	}
	switch s.Kind {
	case ContainerAnnotation, PodAnnotation, CDIAnnotation:
		return "annotation " + s.Key
	case Kubelet:
		return "the kubelet's assignment (annotation " + s.Key + ")"
	case Claim:
		return "claim " + s.Key
	case DeviceList:
		return "mounts " + s.Key
	case Env:
		return "env " + s.Key
	}
	return ""
}

// envSource is the source of an environment variable.
func envSource(key string) Source { return Source{Kind: Env, Key: key} }

// PolicySource is the class of the request for the policy: management
// requests are their own, whatever carries them.
func (r Request) PolicySource() policy.Source {
	if r.Management {
		return policy.Management
	}
	switch r.Source.Kind {
	case ContainerAnnotation, PodAnnotation:
		return policy.Annotation
	case CDIAnnotation:
		return policy.CDI
	case DeviceList:
		return policy.DeviceList
	case Env:
		return policy.Env
	}
	return 0
}

// DeviceKind is the CDI kind of the devices the request names, when its
// carrier is one kind's own: NVIDIA_VISIBLE_DEVICES names nvidia.com/gpu
// devices. Empty when the request names whatever devices the node serves.
func (r Request) DeviceKind() string {
	if r.Source.Kind == Env {
		return CDIKindGPU
	}
	return ""
}
