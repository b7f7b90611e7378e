package request

// KubeletRequest is the request of a container whose GPUs the kubelet
// assigned (its device plugin's Allocate): the GPUs of the given UUIDs,
// with the driver capabilities of the container's
// NVIDIA_DRIVER_CAPABILITIES (the default set when unset), as for any
// request. key is the annotation that carried the assignment. The
// caller has checked the assignment against the container's device nodes;
// the pod's own request carriers are not read.
func KubeletRequest(key string, uuids []string, env []string) (Request, error) {
	_, caps, err := scanEnv(env)
	if err != nil {
		return Request{}, err
	}
	r := Request{Kind: Devices, Source: Source{Kind: Kubelet, Key: key}, IDs: uuids}
	r.Caps, r.CapsSource, err = envCapabilities(caps)
	if err != nil {
		return Request{}, err
	}
	return r, nil
}
