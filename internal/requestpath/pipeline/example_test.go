package pipeline_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/pipeline"
	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// One container's way through the request path, on an in-memory node of
// 8 GPUs: the image asks for two GPUs by index through the NVIDIA
// toolkit's variable; the answer holds their device nodes, the control
// nodes, the driver files and the environment, and books them.
func ExamplePath_Handle() {
	snap := simnode.MemorySnapshot()
	p := pipeline.Path{
		Source:  adjust.Prepare(snap, adjust.Layout{LibraryDir: "/usr/local/nvidia/lib64", Library32Dir: "/usr/local/nvidia/lib"}),
		Table:   simnode.TableFor(snap),
		Sharing: sharing.Shared,
	}
	pod := &api.PodSandbox{Id: "p", Name: "train", Namespace: "ml"}
	ctr := &api.Container{Id: "c", PodSandboxId: "p", Name: "main", Env: []string{"NVIDIA_VISIBLE_DEVICES=1,3"}}
	adj, res, err := p.Handle(context.Background(), pod, ctr)
	if err != nil {
		fmt.Println(err)
		return
	}
	var devs []string
	for _, d := range adj.GetLinux().GetDevices() {
		devs = append(devs, d.Path)
	}
	fmt.Println(strings.Join(devs, " "))
	fmt.Println(res.Request.Source, "->", len(adj.GetMounts()), "mounts,", res.Holding.Mode, "holding of GPUs", res.Holding.GPUs)
	fmt.Println(alloc.Summary(p.Table.State()))
	// Output:
	// /dev/nvidia1 /dev/nvidia3 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools
	// env NVIDIA_VISIBLE_DEVICES -> 18 mounts, shared holding of GPUs [1 3]
	// 0=free 1=shared[ml/train/main] 2=free 3=shared[ml/train/main] 4=free 5=free 6=free 7=free
}
