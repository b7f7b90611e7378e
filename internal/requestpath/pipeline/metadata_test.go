package pipeline

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
)

// withMetadata is d with the metadata file of its claim's request, as
// the DRA driver records it.
func withMetadata(d claims.Device, request string) claims.Device {
	d.Request = request
	d.Metadata = claims.Metadata{
		Host:      "/var/lib/kubelet/plugins/gpu.nri-gpu.dev/device-metadata/" + d.Claim.UID + "/resourceclaims/" + d.Claim.Name + "/" + request + "/gpu.nri-gpu.dev-metadata.json",
		Container: "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/" + d.Claim.Name + "/" + request + "/gpu.nri-gpu.dev-metadata.json",
	}
	return d
}

// metadataMounts returns the adjustment's mounts under the device
// metadata directory.
func metadataMounts(adj *api.ContainerAdjustment) []*api.Mount {
	var out []*api.Mount
	for _, m := range adj.GetMounts() {
		if len(m.Destination) > 45 && m.Destination[:45] == "/var/run/kubernetes.io/dra-device-attributes/" {
			out = append(out, m)
		}
	}
	return out
}

// TestClaimDeviceMetadata: a claim's container gets the device metadata
// file of each request whose devices it holds, once per request
// (two devices of one request share a file), read-only, beside its
// driver files; a request it holds no device of, or a claim whose entry
// it forged, gives it none; a destination the container has already is
// left to it; a container whose claims have no file gets no such mount.
func TestClaimDeviceMetadata(t *testing.T) {
	devs := []claims.Device{withMetadata(claimDev(trainClaim, 1, false), "gpu"), withMetadata(claimDev(trainClaim, 3, false), "gpu"),
		withMetadata(claimDev(trainClaim, 4, false), "extra"), withMetadata(claimDev(sharedClaim, 5, false), "gpu")}
	p := claimPath(t, sharing.Exclusive, claims.New(devs))
	pod := &api.PodSandbox{Id: "p-t", Name: "t", Namespace: "ml"}
	ctr := &api.Container{Id: "c-main", PodSandboxId: "p-t", Name: "main", Linux: pluginLinux(1, 3),
		Env: claimEnv(trainClaim, []string{"NVIDIA_DRIVER_CAPABILITIES=compute,utility"}, 1, 3)}
	// An entry of the shared claim without its device node: forged.
	ctr.Env = append(ctr.Env, claims.EnvKey("gpu-5")+"="+sharedClaim.UID)
	adj, _, err := p.Handle(context.Background(), pod, ctr)
	if err != nil {
		t.Fatal(err)
	}
	ms := metadataMounts(adj)
	if len(ms) != 1 {
		t.Fatalf("metadata mounts %v, want the one file of request gpu", ms)
	}
	m := ms[0]
	if m.Source != devs[0].Metadata.Host || m.Destination != devs[0].Metadata.Container || m.Type != "bind" || !slices.Contains(m.Options, "ro") {
		t.Errorf("metadata mount %v, want %s read-only at %s", m, devs[0].Metadata.Host, devs[0].Metadata.Container)
	}
	if len(adj.GetMounts()) < 2 {
		t.Error("no driver files beside the metadata")
	}

	// Both requests: two files.
	ctr2 := &api.Container{Id: "c-two", PodSandboxId: "p-t", Name: "two", Linux: pluginLinux(1, 3, 4),
		Env: claimEnv(trainClaim, nil, 1, 3, 4)}
	adj, _, err = p.Handle(context.Background(), pod, ctr2)
	if err != nil {
		t.Fatal(err)
	}
	var dst []string
	for _, m := range metadataMounts(adj) {
		dst = append(dst, m.Destination)
	}
	if want := []string{devs[0].Metadata.Container, devs[2].Metadata.Container}; !slices.Equal(dst, want) {
		t.Errorf("metadata mounts %q, want %q", dst, want)
	}

	// The runtime mounts something there already: left to it.
	ctr3 := &api.Container{Id: "c-three", PodSandboxId: "p-t", Name: "three", Linux: pluginLinux(1, 3),
		Env:    claimEnv(trainClaim, nil, 1, 3),
		Mounts: []*api.Mount{{Source: "/elsewhere", Destination: devs[0].Metadata.Container, Type: "bind"}}}
	adj, _, err = p.Handle(context.Background(), pod, ctr3)
	if err != nil {
		t.Fatal(err)
	}
	if ms := metadataMounts(adj); len(ms) != 0 {
		t.Errorf("a destination the container has got %v", ms)
	}

	// Claims prepared without metadata files: no such mount.
	q := claimPath(t, sharing.Exclusive, preparedClaims())
	adj, _, err = q.Handle(context.Background(), pod, &api.Container{Id: "c-four", PodSandboxId: "p-t", Name: "four", Linux: pluginLinux(1, 3),
		Env: claimEnv(trainClaim, nil, 1, 3)})
	if err != nil {
		t.Fatal(err)
	}
	if ms := metadataMounts(adj); len(ms) != 0 || len(adj.GetMounts()) == 0 {
		t.Errorf("without files: metadata mounts %v, %d mounts", ms, len(adj.GetMounts()))
	}
}
