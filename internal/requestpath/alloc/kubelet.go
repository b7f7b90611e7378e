package alloc

import "strings"

// KubeletAnnotation is the container annotation in which nri-gpu's kubelet
// device plugin handed the kubelet's assignment to the NRI side before it
// wrote one annotation per resource (KubeletAnnotationFor): the GPUs'
// UUIDs, comma-separated. Containers created then still carry it, and it
// is read as one of the assignment's annotations. It also names the
// assignment in messages. The request path trusts the assignment only
// when the container has the device nodes of exactly its GPUs, which a
// non-privileged pod cannot add itself (a pod author can write the
// annotation where the runtime passes pod annotations on).
const KubeletAnnotation = "gpus.nri-gpu.dev/kubelet"

// KubeletAnnotationPrefix starts the annotation of each resource of the
// kubelet's assignment (KubeletAnnotationFor).
const KubeletAnnotationPrefix = KubeletAnnotation + "."

// KubeletAnnotationFor is the container annotation in which nri-gpu's
// device plugin for resource hands its part of the kubelet's assignment to
// the NRI side (Allocate): gpus.nri-gpu.dev/kubelet.<resource, with / as
// _>, e.g. gpus.nri-gpu.dev/kubelet.nvidia.com_gpu. One key per resource,
// because the kubelet merges the annotations of a container's resources
// keeping the first value of each key: a container given nvidia.com/gpu
// and a MIG profile's resource keeps both. (A domain has no "_", so the
// key names one resource.)
func KubeletAnnotationFor(resource string) string {
	return KubeletAnnotationPrefix + strings.ReplaceAll(resource, "/", "_")
}
