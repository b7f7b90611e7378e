module github.com/nri-gpu/nri-gpu/test/e2e

go 1.26.0

// The product module, from this checkout: e2e tests import its packages (such as
// github.com/nri-gpu/nri-gpu/test/simnode). When the product module gains
// dependencies, run `go mod tidy` here too.
replace github.com/nri-gpu/nri-gpu => ../..

require (
	github.com/nri-gpu/nri-gpu v0.0.0-00010101000000-000000000000
	github.com/opencontainers/runtime-spec v1.3.0
	github.com/pelletier/go-toml/v2 v2.4.3
	golang.org/x/sys v0.48.0
	google.golang.org/grpc v1.83.2
	k8s.io/cri-api v0.37.0
)

require (
	golang.org/x/net v0.58.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af // indirect
)
