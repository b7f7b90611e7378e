package request

// KubeletRequest is the request of a container whose GPUs the kubelet
// assigned (its device plugin's Allocate): the GPUs of the given UUIDs,
// with the driver capabilities of the container's
// NVIDIA_DRIVER_CAPABILITIES (the default set when unset), as for any
// request. key is the annotation that carried the assignment. The
// caller has checked the assignment against the container's device nodes;
// the pod's own request carriers are not read.
func KubeletRequest(key string, uuids []string, env []string) (Request, error) {
	return assigned(Source{Kind: Kubelet, Key: key}, uuids, env)
}

// ClaimRequest is the request of a container whose devices prepared
// Dynamic Resource Allocation claims gave it: the GPUs and MIG devices of
// the given UUIDs, with the driver capabilities of the container's
// NVIDIA_DRIVER_CAPABILITIES, as for any request. claims names them
// ("ml/train", or "ml/train, ml/probe"). The caller has checked the
// devices against the container's device nodes (claims.Prepared); the
// pod's own request carriers are not read.
func ClaimRequest(claims string, uuids []string, env []string) (Request, error) {
	return assigned(Source{Kind: Claim, Key: claims}, uuids, env)
}

// assigned is the request for devices that someone else assigned the
// container (the kubelet, a claim), from src.
func assigned(src Source, uuids []string, env []string) (Request, error) {
	_, caps, err := scanEnv(env)
	if err != nil {
		return Request{}, err
	}
	r := Request{Kind: Devices, Source: src, IDs: uuids}
	r.Caps, r.CapsSource, err = envCapabilities(caps)
	if err != nil {
		return Request{}, err
	}
	return r, nil
}
