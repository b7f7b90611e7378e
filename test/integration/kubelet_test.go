package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	rgen "github.com/opencontainers/runtime-tools/generate"

	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// runShaped creates container name in pod pod-<name> as containerd's CRI
// does for a kubelet pod: pod annotations podAnn, container annotations
// ctrAnn (where the kubelet puts a device plugin's Allocate annotations)
// and the device nodes of gpus (its DeviceSpecs) already in the spec. The
// adjustment is applied and the container kept, running, for Synchronize.
func (r *runtimeSide) runShaped(name string, podAnn, ctrAnn map[string]string, gpus ...simnode.GPU) (*api.ContainerAdjustment, error) {
	pod := &api.PodSandbox{Id: "pod-" + name, Name: "pod-" + name, Namespace: "default", Uid: "uid-" + name, Annotations: podAnn}
	var devs []*api.LinuxDevice
	for _, g := range gpus {
		devs = append(devs, &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", g.Minor), Type: "c", Major: 195, Minor: int64(g.Minor)})
	}
	ctr := &api.Container{Id: "ctr-" + name, PodSandboxId: pod.Id, Name: name, Env: []string{"PATH=/usr/bin:/bin"},
		Annotations: ctrAnn, Linux: &api.LinuxContainer{Devices: devs}, State: api.ContainerState_CONTAINER_CREATED}
	rpl, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		r.nri.StopContainer(context.Background(), &api.StopContainerRequest{Pod: pod, Container: ctr})
		r.nri.RemoveContainer(context.Background(), &api.RemoveContainerRequest{Pod: pod, Container: ctr})
		return nil, err
	}
	g, err := rgen.New("linux")
	if err != nil {
		r.t.Fatal(err)
	}
	g.ClearProcessEnv()
	for _, e := range ctr.Env {
		k, v, _ := strings.Cut(e, "=")
		g.AddProcessEnv(k, v)
	}
	for k, v := range ctrAnn {
		g.AddAnnotation(k, v)
	}
	for _, d := range devs {
		g.AddDevice(d.ToOCI())
	}
	if err := nrigen.SpecGenerator(&g).Adjust(rpl.GetAdjust()); err != nil {
		r.t.Fatalf("applying the adjustment: %v", err)
	}
	spec := g.Config
	ctr.Annotations = spec.Annotations
	ctr.Env = spec.Process.Env
	ctr.Linux = &api.LinuxContainer{Devices: api.FromOCILinuxDevices(spec.Linux.Devices)}
	ctr.State = api.ContainerState_CONTAINER_RUNNING
	r.kept.put(pod, ctr)
	return rpl.GetAdjust(), nil
}

// kubeletHolders returns "GPU index -> holder container names" of the
// holdings marked the kubelet's in `nri-gpu status -o json`.
func kubeletHolders(t *testing.T, socket string) map[int][]string {
	t.Helper()
	out, code := statusCmd(t, socket, "-o", "json")
	var s status.Status
	if err := json.Unmarshal([]byte(out), &s); code != 0 || err != nil {
		t.Fatalf("nri-gpu status -o json: exit %d, %v\n%s", code, err, out)
	}
	m := map[int][]string{}
	for _, g := range s.GPUs {
		for _, h := range g.Kubelet {
			m[g.Index] = append(m[g.Index], h.Container)
		}
	}
	return m
}

// TestKubeletShapedContainerOverNRI sends containers shaped as the kubelet
// makes them from nri-gpu's device plugin (annotation
// gpus.nri-gpu.dev/kubelet on the container plus the GPU's device node)
// through the real NRI runtime side to the built binary: it is served and
// booked as the kubelet's, also after a plugin restart (Synchronize); the
// same key as a pod annotation, or an annotation without the device node,
// is not the kubelet's. A container of two resources carries one
// annotation per resource, trusted as their union.
func TestKubeletShapedContainerOverNRI(t *testing.T) {
	needRoot(t)
	dir := shortTempDir(t)
	n, cfg := simNodeN(t, dir, 4, "sharing: exclusive\n")
	socket := filepath.Join(dir, "status.sock")
	args := []string{"run", "--config", cfg, "--status-socket", socket}
	r := startRuntime(t, dir)
	defer r.stop()
	p := startPlugin(t, append(args, "--socket", r.socket)...)
	r.waitSynced(20 * time.Second)

	g1 := n.GPUs[1]
	adj, err := r.runShaped("kub", nil, map[string]string{alloc.KubeletAnnotation: g1.UUID}, g1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(adj.GetEnv(), func(e *api.KeyValue) bool { return e.Key == "NVIDIA_VISIBLE_DEVICES" && e.Value == g1.UUID }) {
		t.Errorf("env %v, want NVIDIA_VISIBLE_DEVICES=%s", adj.GetEnv(), g1.UUID)
	}
	var added []string
	for _, d := range adj.GetLinux().GetDevices() {
		added = append(added, d.Path)
	}
	if slices.Contains(added, fmt.Sprintf("/dev/nvidia%d", g1.Minor)) || !slices.Contains(added, "/dev/nvidiactl") {
		t.Errorf("added devices %v: want the control nodes, not the GPU node the runtime already gives", added)
	}
	if len(adj.GetMounts()) == 0 {
		t.Errorf("no driver files mounted")
	}
	want := map[int][]string{g1.Index: {"kub"}}
	if got := kubeletHolders(t, socket); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("kubelet holders %v, want %v", got, want)
	}

	// Two resources of the device plugin in one container: one annotation
	// each (the kubelet keeps the first value of a key), trusted as their
	// union against the container's device nodes.
	g0, g3 := n.GPUs[0], n.GPUs[3]
	adj, err = r.runShaped("two", nil, map[string]string{alloc.KubeletAnnotationFor("nvidia.com/gpu"): g0.UUID, alloc.KubeletAnnotationFor("example.com/gpu"): g3.UUID}, g0, g3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(adj.GetEnv(), func(e *api.KeyValue) bool { return e.Key == "NVIDIA_VISIBLE_DEVICES" && e.Value == g0.UUID+","+g3.UUID }) || len(adj.GetMounts()) == 0 {
		t.Errorf("two resources: env %v, %d mounts; want NVIDIA_VISIBLE_DEVICES=%s,%s and the driver files", adj.GetEnv(), len(adj.GetMounts()), g0.UUID, g3.UUID)
	}
	want = map[int][]string{g0.Index: {"two"}, g1.Index: {"kub"}, g3.Index: {"two"}}
	if got := kubeletHolders(t, socket); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("kubelet holders %v, want %v", got, want)
	}

	// The same key on the pod, with the device node: booked (the runtime
	// gave the GPU), but not as the kubelet's.
	g2 := n.GPUs[2]
	if _, err := r.runShaped("podann", map[string]string{alloc.KubeletAnnotation: g2.UUID}, nil, g2); err != nil {
		t.Fatal(err)
	}
	// The annotation without the device node: ignored, no GPU.
	adj, err = r.runShaped("nodev", nil, map[string]string{alloc.KubeletAnnotation: n.GPUs[3].UUID})
	if err != nil {
		t.Fatal(err)
	}
	if len(adj.GetLinux().GetDevices()) != 0 || len(adj.GetMounts()) != 0 {
		t.Errorf("an annotation without device nodes got devices %v, mounts %d", adj.GetLinux().GetDevices(), len(adj.GetMounts()))
	}
	if !strings.Contains(p.log.String(), "annotation gpus.nri-gpu.dev/kubelet ignored: names GPUs 3 but the container has the device nodes of GPUs none") {
		t.Errorf("no warning for the annotation without device nodes:\n%s", p.log.String())
	}
	wantTable := "0=exclusive[kubelet:default/pod-two/two] 1=exclusive[kubelet:default/pod-kub/kub] 2=exclusive[default/pod-podann/podann] 3=exclusive[kubelet:default/pod-two/two]"
	if got := table(t, socket); got != wantTable {
		t.Errorf("table %s\nwant %s", got, wantTable)
	}
	if got := kubeletHolders(t, socket); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("kubelet holders %v, want %v", got, want)
	}

	// Synchronize after a plugin restart rebuilds the same bookings from
	// the kept containers.
	stopPlugin(t, p)
	startPlugin(t, append(args, "--socket", r.socket)...)
	r.waitSynced(20 * time.Second)
	if got := table(t, socket); got != wantTable {
		t.Errorf("after a plugin restart: table %s\nwant %s", got, wantTable)
	}
	if got := kubeletHolders(t, socket); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after a plugin restart: kubelet holders %v, want %v", got, want)
	}
}
