package alloc

// KubeletAnnotation is the container annotation in which nri-gpu's kubelet
// device plugin hands the kubelet's assignment to the NRI side: the GPUs'
// UUIDs, comma-separated. Its Allocate answer puts it in the CRI container
// config, beside the GPUs' device nodes; the request path trusts it only
// when the container has the device nodes of exactly those GPUs, which a
// non-privileged pod cannot add itself (a pod author can write the
// annotation where the runtime passes pod annotations on).
const KubeletAnnotation = "gpus.nri-gpu.dev/kubelet"
