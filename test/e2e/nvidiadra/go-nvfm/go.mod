// Our own stand-in for NVIDIA's go-nvfm, which the Go module proxy does not
// serve: the surface NVIDIA's DRA driver v0.5.0 compiles against, with the
// fabric manager never reachable (see pkg/nvfm). The suite's build of that
// driver points a replace here (test/e2e/nvidiadra).
module github.com/NVIDIA/go-nvfm

go 1.25.0
