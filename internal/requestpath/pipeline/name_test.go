package pipeline

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
)

// On CRI-O, NRI names a container only from the kubelet's label
// io.kubernetes.container.name: a container without a name must not get
// the pod's request in place of a per-container annotation it cannot be
// matched to.
func TestUnnamedContainer(t *testing.T) {
	s := benchSnapshot()
	src := adjust.Prepare(s, layout)
	perContainer := map[string]string{
		"gpus.nri-gpu.dev/container.train": "1",
		"gpus.nri-gpu.dev/pod":             "2",
	}
	cdiPerContainer := map[string]string{"nvidia.cdi.k8s.io/container.train": "nvidia.com/gpu=0"}
	cases := []struct {
		name    string
		ann     map[string]string
		ctr     *api.Container
		gpus    int    // GPUs injected
		refused string // the annotation key an error names
	}{
		{"named by NRI", perContainer, &api.Container{Name: "train"}, 1, ""},
		{"named by the kubelet's label only", perContainer,
			&api.Container{Labels: map[string]string{request.ContainerNameLabel: "train"}}, 1, ""},
		{"NRI's name wins over the label", perContainer,
			&api.Container{Name: "sidecar", Labels: map[string]string{request.ContainerNameLabel: "train"}}, 2, ""},
		{"no name, per-container annotation", perContainer, &api.Container{}, 0, "gpus.nri-gpu.dev/container.train"},
		{"no name, the toolkit's per-container annotation", cdiPerContainer, &api.Container{}, 0, "nvidia.cdi.k8s.io/container.train"},
		{"no name, an annotation for the empty name", map[string]string{"gpus.nri-gpu.dev/container.": "1"}, &api.Container{}, 0, "gpus.nri-gpu.dev/container."},
		{"no name, only the pod annotation", map[string]string{"gpus.nri-gpu.dev/pod": "2"}, &api.Container{}, 2, ""},
		{"no name, no annotation", nil, &api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=1"}}, 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := &api.PodSandbox{Name: "p", Namespace: "default", Uid: "u", Annotations: tc.ann}
			tc.ctr.Id = "c1"
			adj, res, err := handle(src, tableFor(s), sharing.Shared, pod, tc.ctr)
			if tc.refused != "" {
				var re *request.Error
				if !errors.As(err, &re) || re.Source.Key != tc.refused || adj != nil {
					t.Fatalf("got adj %v, err %v; want a refusal naming %s", adj != nil, err, tc.refused)
				}
				for _, want := range []string{"no name", request.ContainerNameLabel, request.AnnotationPod} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := len(res.GPUs); got != tc.gpus {
				t.Errorf("%d GPUs, want %d (source %s)", got, tc.gpus, res.Request.Source)
			}
		})
	}
}

// TestHolderNameFromLabel: a container NRI names only through the
// kubelet's label (CRI-O) is shown under that name in the table.
func TestHolderNameFromLabel(t *testing.T) {
	h := HolderOf(&api.PodSandbox{Id: "p", Namespace: "ns", Name: "pod"},
		&api.Container{Id: "c", Labels: map[string]string{request.ContainerNameLabel: "main"}})
	if h.Container != "main" || h.String() != "ns/pod/main" {
		t.Errorf("holder %+v (%s), want container main", h, h.String())
	}
}
