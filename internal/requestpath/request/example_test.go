package request_test

import (
	"fmt"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/request"
)

// A pod annotation in the syntax of docker run --gpus, for the container
// named train; the capabilities come from the image's environment.
func ExampleParseInput() {
	r, err := request.ParseInput(request.Input{
		Annotations: map[string]string{"gpus.nri-gpu.dev/container.train": "2,exclusive=true"},
		Name:        "train",
		Env:         []string{"NVIDIA_DRIVER_CAPABILITIES=compute,utility"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Source, "asks for", r.Count, "GPUs with", r.Caps, "exclusive:", *r.Exclusive)

	// A bad token is an error that names the source and what is valid.
	_, err = request.ParseInput(request.Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=warp"}})
	fmt.Println(err)
	// Output:
	// annotation gpus.nri-gpu.dev/container.train asks for 2 GPUs with compute,utility exclusive: true
	// nri-gpu: env NVIDIA_DRIVER_CAPABILITIES: unsupported capability "warp" (valid: compute, compat32, graphics, utility, video, display, ngx, all)
}
