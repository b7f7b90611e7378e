package harness

import (
	"context"
	"path/filepath"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// GPUNodes are the two worker nodes of the suite's cluster phase and of
// make demo-cluster: gpu-a on containerd 2.4 with four H100 80GB GPUs
// (RHEL layout; GPUs 0 and 1 on NUMA node 0, 2 and 3 on 1), gpu-b on
// CRI-O with three A100 40GB GPUs of which the driver excludes the
// second (Debian layout): two usable. The models and
// their memory (NVML's) differ, so that DRA selectors can tell the nodes
// apart.
func GPUNodes() []NodeOptions {
	return []NodeOptions{
		// gpu-a's GPUs are simnode's four defaults, on two NUMA nodes.
		{Name: "gpu-a", Runtime: RuntimeContainerd24, GPUs: &simnode.Options{Layout: simnode.LayoutRHEL, GPUs: []simnode.GPU{
			{BusID: simnode.DefaultBusID(0), NUMANode: "0"}, {BusID: simnode.DefaultBusID(1), NUMANode: "0"},
			{BusID: simnode.DefaultBusID(2), NUMANode: "1"}, {BusID: simnode.DefaultBusID(3), NUMANode: "1"},
		}}},
		{Name: "gpu-b", Runtime: RuntimeCRIO, GPUs: &simnode.Options{Layout: simnode.LayoutDebian, GPUs: []simnode.GPU{
			// Bus ids after gpu-a's: GPU UUIDs (derived from them) are unique
			// in the cluster, as real ones are.
			{BusID: simnode.DefaultBusID(4), Model: GPUBModel}, {BusID: simnode.DefaultBusID(5), Model: GPUBModel, Excluded: true},
			{BusID: simnode.DefaultBusID(6), Model: GPUBModel},
		}}, Prepare: func(n *Node, _ *NodeOptions) error {
			st := simnode.NVMLState{}
			for range n.GPU.GPUs {
				st.GPUs = append(st.GPUs, simnode.NVMLGPU{MemoryMiB: GPUBMemoryMiB})
			}
			return n.GPU.WriteNVMLState(st)
		}},
	}
}

// GPUBModel and GPUBMemoryMiB are the model and memory of gpu-b's GPUs
// (GPUNodes); gpu-a's are simnode's defaults (an H100 80GB, 81559 MiB).
const (
	GPUBModel     = "NVIDIA A100-SXM4-40GB"
	GPUBMemoryMiB = 40960
)

// ClusterImages are the images a cluster of nri-gpu tests imports on every
// node: nri-gpu's release image at each version (ReleaseImage: make
// image's archive from the checkout at repo; "" is the chart's
// appVersion, the one deploy/kubernetes and the chart deploy), in that
// order, then GlibcCUDAImage.
func ClusterImages(ctx context.Context, repo string, versions ...string) ([]*Image, error) {
	var images []*Image
	for _, v := range versions {
		img, err := ReleaseImage(ctx, repo, v)
		if err != nil {
			return nil, err
		}
		images = append(images, img)
	}
	std, err := BuildImages(ctx, "")
	if err != nil {
		return nil, err
	}
	return append(images, std.GlibcCUDA), nil
}

// KustomizeOverlay is the test overlay of deploy/kubernetes in the
// checkout at repo (image and host paths for the cluster's nodes).
func KustomizeOverlay(repo string) string {
	return filepath.Join(repo, "test", "e2e", "cluster", "kustomize")
}

// HelmValues is the values file for deploy/helm/nri-gpu on the cluster.
func HelmValues(repo string) string {
	return filepath.Join(repo, "test", "e2e", "cluster", "helm-values.yaml")
}
