package pipeline

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

func TestEmitCDI(t *testing.T) {
	snap := benchSnapshot()
	p := Path{Source: adjust.Prepare(snap, layout), Sharing: sharing.Shared, EmitCDI: true, CDINames: map[string]string{
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
		adj.Annotations[alloc.Annotation] != `{"version":1,"mode":"exclusive","gpus":["`+snap.GPUs[0].UUID+`","`+snap.GPUs[1].UUID+`"],"pod":true}` {
		t.Errorf("count request: %q, %v", how, adj)
	}
	adj, how = answer(`"device=0,2"`)
	if !strings.Contains(how, "no CDI spec defines nvidia.com/gpu="+snap.GPUs[2].UUID) || len(adj.CDIDevices) != 0 || len(adj.Mounts) == 0 {
		t.Errorf("GPU without a spec: %q, %v", how, adj)
	}
}

// TestEmitCDIMIG: with emit: cdi, a MIG device that the runtime's specs
// define (nvidia.com/gpu=MIG-<uuid>, as nri-gpu cdi generate and the
// toolkit name it) goes as that CDI name; a container that also asks for
// MIG management (mig/config, mig/monitor nodes, which no CDI device
// carries) gets edits, saying why.
func TestEmitCDIMIG(t *testing.T) {
	s := simnode.MemoryMIGSnapshot()
	u01 := migUUID(s, 0, 1)
	pol := policy.Policy{Default: policy.DefaultAllow, ManagementNamespaces: []string{"gpu-admin"}}
	pol.SetDefaults()
	p := Path{Source: adjust.Prepare(s, layout), Sharing: sharing.Shared, Policy: pol, EmitCDI: true, RuntimeCDI: true,
		CDINames: map[string]string{u01: "nvidia.com/gpu=" + u01}}
	answer := func(env ...string) (*api.ContainerAdjustment, string) {
		t.Helper()
		pod := &api.PodSandbox{Name: "p", Namespace: "gpu-admin", Annotations: map[string]string{"gpus.nri-gpu.dev/container.c": "device=0:1"}}
		p.Table = tableFor(s)
		adj, res, err := p.Handle(context.Background(), pod, &api.Container{Id: "c", Name: "c", Env: env})
		if err != nil {
			t.Fatal(err)
		}
		return adj, res.Emit
	}
	adj, how := answer()
	if how != "cdi" || len(adj.CDIDevices) != 1 || adj.CDIDevices[0].Name != "nvidia.com/gpu="+u01 || len(adj.GetLinux().GetDevices()) != 0 || adj.Env[0].Value != u01 {
		t.Errorf("MIG device 0:1: %q, %v", how, adj)
	}
	adj, how = answer("NVIDIA_MIG_MONITOR_DEVICES=all")
	if how != "edits (MIG management capabilities mig/monitor: no CDI device carries them)" || len(adj.CDIDevices) != 0 || !slices.Contains(devicePaths(adj), capNode(2)) {
		t.Errorf("with MIG monitor: %q, %q", how, devicePaths(adj))
	}
	p.CDINames = nil
	if _, how := answer(); how != "edits (no CDI spec defines nvidia.com/gpu="+u01+")" {
		t.Errorf("without a spec: %q", how)
	}
}
