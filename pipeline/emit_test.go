package pipeline

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/alloc"
)

func TestEmitCDI(t *testing.T) {
	snap := benchSnapshot()
	p := Path{Source: adjust.Prepare(snap, layout), Sharing: alloc.Shared, EmitCDI: true, CDINames: map[string]string{
		snap.GPUs[0].UUID: "nvidia.com/gpu=" + snap.GPUs[0].UUID,
		snap.GPUs[1].UUID: "nvidia.com/gpu=" + snap.GPUs[1].UUID,
	}}
	answer := func(ann string) (*api.ContainerAdjustment, string) {
		pod := &api.PodSandbox{Annotations: map[string]string{"gpus.nri-gpu.dev/pod": ann}}
		p.Table = tableFor(snap)
		adj, res, err := p.Handle(context.Background(), pod, &api.Container{Id: "c", Name: "c"})
		if err != nil {
			t.Fatal(err)
		}
		return adj, res.Emit
	}

	if _, how := answer(`"device=0,1"`); !strings.Contains(how, "does not inject CDI") {
		t.Errorf("runtime without CDI support: %q", how)
	}
	p.RuntimeCDI = true
	adj, how := answer(`"device=0,1"`)
	if how != "cdi" || len(adj.CDIDevices) != 2 || len(adj.GetLinux().GetDevices()) != 0 || len(adj.Mounts) != 0 {
		t.Errorf("resolvable GPUs: %q, %v", how, adj)
	}
	if adj.CDIDevices[1].Name != "nvidia.com/gpu="+snap.GPUs[1].UUID || adj.Env[0].Value != snap.GPUs[0].UUID+","+snap.GPUs[1].UUID {
		t.Errorf("adjustment %v", adj)
	}
	// A count request names the GPUs the allocator picked, and the
	// booking's record goes with the CDI form.
	adj, how = answer("2,exclusive=true")
	if how != "cdi" || len(adj.CDIDevices) != 2 || adj.CDIDevices[0].Name != "nvidia.com/gpu="+snap.GPUs[0].UUID ||
		adj.Annotations[alloc.Annotation] != `{"mode":"exclusive","gpus":["`+snap.GPUs[0].UUID+`","`+snap.GPUs[1].UUID+`"],"pod":true}` {
		t.Errorf("count request: %q, %v", how, adj)
	}
	adj, how = answer(`"device=0,2"`)
	if !strings.Contains(how, "no CDI spec defines nvidia.com/gpu="+snap.GPUs[2].UUID) || len(adj.CDIDevices) != 0 || len(adj.Mounts) == 0 {
		t.Errorf("GPU without a spec: %q, %v", how, adj)
	}
}
