module github.com/nri-gpu/nri-gpu/test/integration

go 1.25.0

// The product module, from this checkout: the protocol tests import its
// packages (and github.com/nri-gpu/nri-gpu/test/simnode). When the product
// module gains dependencies, run `go mod tidy` here too.
replace github.com/nri-gpu/nri-gpu => ../..

require (
	github.com/containerd/nri v0.12.3
	github.com/google/go-cmp v0.7.0
	github.com/nri-gpu/nri-gpu v0.0.0-00010101000000-000000000000
	github.com/opencontainers/runtime-spec v1.3.0
	github.com/opencontainers/runtime-tools v0.9.1-0.20251114084447-edf4cb3d2116
	github.com/sirupsen/logrus v1.10.2
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af
	sigs.k8s.io/yaml v1.6.0
	tags.cncf.io/container-device-interface v1.1.1
)

require (
	github.com/containerd/log v0.1.0 // indirect
	github.com/containerd/ttrpc v1.2.7 // indirect
	github.com/fsnotify/fsnotify v1.9.0 // indirect
	github.com/knqyf263/go-plugin v0.9.0 // indirect
	github.com/moby/sys/capability v0.4.0 // indirect
	github.com/moby/sys/mountinfo v0.7.2 // indirect
	github.com/tetratelabs/wazero v1.11.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/mod v0.38.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250303144028-a0af3efb3deb // indirect
	google.golang.org/grpc v1.72.1 // indirect
	sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730 // indirect
	tags.cncf.io/container-device-interface/specs-go v1.1.1 // indirect
)
