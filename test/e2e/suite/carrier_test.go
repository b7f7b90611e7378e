package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/e2e/harness"
	"github.com/nri-gpu/nri-gpu/test/simnode"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// readStatus returns the GPU rows of `nri-gpu status -o json` over socket.
func readStatus(t *testing.T, socket string) []statusGPU {
	t.Helper()
	out, err := exec.Command(nriGPU(t), "status", "--status-socket", socket, "-o", "json").CombinedOutput()
	var st struct {
		GPUs []statusGPU `json:"gpus"`
	}
	if err != nil || json.Unmarshal(out, &st) != nil {
		t.Fatalf("nri-gpu status: %v\n%s", err, out)
	}
	return st.GPUs
}

// holdersOf returns GPU index's holders in the status rows.
func holdersOf(rows []statusGPU, index int) []alloc.HolderState {
	for _, r := range rows {
		if r.Index == index {
			return r.Holders
		}
	}
	return nil
}

// TestKubeletCarrier checks, through CRI alone (no kubelet), the carrier of
// the kubelet's assignment as the runtime hands it to NRI: what the
// kubelet does with a device plugin's Allocate answer is put the answer's
// annotations into the CRI ContainerConfig's annotations and its
// DeviceSpecs into ContainerConfig.devices, and this test does the same.
// It asserts on what nri-gpu did (the container's device nodes and env,
// nri-gpu's status) and on what each runtime the suite drives does with a
// pod annotation of the same key (CRI-O copies it to the container).
func TestKubeletCarrier(t *testing.T) {
	c := startRuntime(t, harness.RuntimeOptions{})
	n := newNode(t, simnode.LayoutRHEL, "")
	w := &world{t: t, c: c, cri: c.CRI(), node: n, ctx: context.Background()}
	socket := filepath.Join(t.TempDir(), "status.sock")
	w.plugin = startPlugin(t, c, n, "--status-socket", socket)
	// What each runtime does with a pod's annotations: CRI-O copies them
	// into every container's annotations, which NRI shows; containerd
	// (1.7, 2.2, 2.4, without a pod_annotations passthrough) does not.
	copiesPodAnnotations := onCRIO()

	// device is the DeviceSpec of GPU g as a device plugin answers it. The
	// host path is the simulated node's node (char 195:<minor>, as on a
	// real node); nri-gpu matches device nodes by major:minor.
	device := func(g simnode.GPU) *runtimeapi.Device {
		return &runtimeapi.Device{
			HostPath:      filepath.Join(n.Root, "dev", fmt.Sprintf("nvidia%d", g.Minor)),
			ContainerPath: fmt.Sprintf("/dev/nvidia%d", g.Minor),
			Permissions:   "rw",
		}
	}
	// reached says whether the kubelet key reached nri-gpu through NRI
	// for container name: nri-gpu logs every container that carries it
	// (served as the kubelet's assignment, or ignored with a warning). The
	// OCI spec in containerd's verbose status is no witness: containerd
	// 2.4 hands NRI the CRI container annotations, which that spec lacks.
	reached := func(name string) bool {
		for _, l := range strings.Split(w.plugin.log.String(), "\n") {
			if strings.Contains(l, alloc.KubeletAnnotation) && strings.Contains(l, "container="+name+" ") {
				return true
			}
		}
		return false
	}

	t.Run("container annotation and device node: the kubelet's assignment", func(t *testing.T) {
		g := n.GPUs[1]
		c := w.mustRun("dp", nil, harness.ContainerSpec{
			Image:       harness.GlibcImage,
			Annotations: map[string]string{alloc.KubeletAnnotation: g.UUID},
			Devices:     []*runtimeapi.Device{device(g)},
		})
		if !reached("dp") {
			t.Errorf("the container annotation did not reach nri-gpu:\n%s", w.plugin.log.String())
		}
		want := []string{fmt.Sprintf("/dev/nvidia%d", g.Minor)}
		if got := gpuNodes(c); !equal(got, want) {
			t.Errorf("GPU nodes %q, want exactly %q\n%s", got, want, c.view())
		}
		if got := envOf(c, "NVIDIA_VISIBLE_DEVICES"); got != g.UUID {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, g.UUID)
		}
		// The driver files come with the assignment: libcuda loads and
		// counts the one GPU.
		if out, code := c.sh("gpucheck cuda"); code != 0 || !strings.Contains(out, "devices=1") {
			t.Errorf("gpucheck cuda: exit %d\n%s", code, out)
		}
		hs := holdersOf(readStatus(t, socket), g.Index)
		if len(hs) != 1 || hs[0].Container != "dp" || !hs[0].Kubelet {
			t.Errorf("GPU %d holders %+v, want default/dp/dp marked kubelet", g.Index, hs)
		}
	})

	t.Run("pod annotation without device nodes: no GPU", func(t *testing.T) {
		g := n.GPUs[2]
		c := w.mustRun("podann", map[string]string{alloc.KubeletAnnotation: g.UUID}, harness.ContainerSpec{})
		// containerd passes no pod annotation into the container's
		// annotations unless its pod_annotations passthrough names it;
		// CRI-O copies the pod's annotations in. Either way nri-gpu must
		// not take it for the kubelet's: the container has no GPU node.
		if passed := reached("podann"); passed != copiesPodAnnotations {
			t.Errorf("%s passed the pod annotation on to the container's (NRI) annotations: %v, want %v", runtimeName(), passed, copiesPodAnnotations)
		}
		if got := gpuNodes(c); len(got) != 0 {
			t.Errorf("a pod annotation %s gave GPU nodes %q\n%s", alloc.KubeletAnnotation, got, c.view())
		}
		if got := envOf(c, "NVIDIA_VISIBLE_DEVICES"); got != "(unset)" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want unset", got)
		}
		if hs := holdersOf(readStatus(t, socket), g.Index); len(hs) != 0 {
			t.Errorf("GPU %d holders %+v, want none", g.Index, hs)
		}
	})

	t.Run("pod annotation with a device node: booked as the runtime's, never the kubelet's", func(t *testing.T) {
		g := n.GPUs[3]
		c := w.mustRun("podanndev", map[string]string{alloc.KubeletAnnotation: g.UUID}, harness.ContainerSpec{
			Devices: []*runtimeapi.Device{device(g)},
		})
		if passed := reached("podanndev"); passed != copiesPodAnnotations {
			t.Errorf("%s passed the pod annotation on to the container's (NRI) annotations: %v, want %v", runtimeName(), passed, copiesPodAnnotations)
		}
		want := []string{fmt.Sprintf("/dev/nvidia%d", g.Minor)}
		if got := gpuNodes(c); !equal(got, want) {
			t.Errorf("GPU nodes %q, want exactly the runtime's %q\n%s", got, want, c.view())
		}
		hs := holdersOf(readStatus(t, socket), g.Index)
		if len(hs) != 1 || hs[0].Container != "podanndev" {
			t.Fatalf("GPU %d holders %+v, want default/podanndev/podanndev", g.Index, hs)
		}
		// A runtime that copies pod annotations in (CRI-O) shows nri-gpu
		// the key among the container's annotations, but the pod's own
		// annotations carry it too: a pod author's, passed on, which the
		// kubelet never writes there (docs/design.md). nri-gpu ignores it
		// with a warning and books the GPU as the runtime gave it, by its
		// device node; a runtime that does not copy never shows the key.
		// On neither is it the kubelet's.
		if hs[0].Kubelet {
			t.Errorf("on %s GPU %d booked as the kubelet's: %+v", runtimeName(), g.Index, hs[0])
		}
		if copiesPodAnnotations && !strings.Contains(w.plugin.log.String(), "the pod's annotations carry it too") {
			t.Errorf("on %s no warning that the pod's annotations carry %s:\n%s", runtimeName(), alloc.KubeletAnnotation, w.plugin.log.String())
		}
	})

	t.Run("container annotation without the device nodes: ignored", func(t *testing.T) {
		g := n.GPUs[0]
		before := strings.Count(w.plugin.log.String(), "annotation "+alloc.KubeletAnnotation+" ignored")
		c := w.mustRun("nodev", nil, harness.ContainerSpec{
			Annotations: map[string]string{alloc.KubeletAnnotation: g.UUID},
		})
		if got := gpuNodes(c); len(got) != 0 {
			t.Errorf("an annotation without device nodes gave GPU nodes %q\n%s", got, c.view())
		}
		if got := envOf(c, "NVIDIA_VISIBLE_DEVICES"); got != "(unset)" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want unset", got)
		}
		if hs := holdersOf(readStatus(t, socket), g.Index); len(hs) != 0 {
			t.Errorf("GPU %d holders %+v, want none", g.Index, hs)
		}
		want := fmt.Sprintf("names GPUs %d but the container has the device nodes of GPUs none", g.Index)
		waitFor(t, 5*time.Second, "nri-gpu's warning", func() (bool, string) {
			log := w.plugin.log.String()
			return strings.Count(log, "annotation "+alloc.KubeletAnnotation+" ignored") > before && strings.Contains(log, want), "no warning containing " + want
		})
	})

	t.Run("container annotation naming another GPU than its node: ignored", func(t *testing.T) {
		// GPU 0 is free; GPU 1 is dp's (shared node: a second holder is
		// allowed). The annotation names 0, the node is 1's.
		named, have := n.GPUs[0], n.GPUs[1]
		c := w.mustRun("other", nil, harness.ContainerSpec{
			Annotations: map[string]string{alloc.KubeletAnnotation: named.UUID},
			Devices:     []*runtimeapi.Device{device(have)},
		})
		want := []string{fmt.Sprintf("/dev/nvidia%d", have.Minor)}
		if got := gpuNodes(c); !equal(got, want) {
			t.Errorf("GPU nodes %q, want exactly the runtime's %q\n%s", got, want, c.view())
		}
		rows := readStatus(t, socket)
		if hs := holdersOf(rows, named.Index); len(hs) != 0 {
			t.Errorf("GPU %d (named only by the annotation) holders %+v, want none", named.Index, hs)
		}
		for _, h := range holdersOf(rows, have.Index) {
			if h.Container == "other" && h.Kubelet {
				t.Errorf("GPU %d booked as the kubelet's for other: %+v", have.Index, h)
			}
		}
	})
}

func equal(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }
