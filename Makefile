# nri-gpu: see README.md.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.Version=$(VERSION)
PKGS    := ./...
# Modules with their own go.mod, checked like the product module: the e2e
# suite, the protocol tests (test/integration, which need runtime-tools)
# and deploy/ (the manifests' test, which needs k8s.io/api), and our
# stand-in for NVIDIA's go-nvfm (test/e2e/nvidiadra/go-nvfm).
SUBMODULES := test/e2e test/integration deploy test/e2e/nvidiadra/go-nvfm

# make install: where things go. DESTDIR stages into a directory (packages,
# tests); PREFIX is where the binary lives on the node.
DESTDIR        ?=
PREFIX         ?= /usr/local
NRI_PLUGIN_DIR ?= /opt/nri/plugins
NRI_CONF_DIR   ?= /etc/nri/conf.d
SYSTEMD_DIR    ?= /etc/systemd/system
CONFIG_DIR     ?= /etc/nri-gpu

.PHONY: all build image test test-arm64 arm64-tools lint unit e2e e2e-tools e2e-cluster e2e-scale e2e-peer bench demo demo-cluster bench-e2e bench-cluster bench-scale bench-scale-smoke bench-agent clean install install-systemd fuzz fuzz-short soak

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/nri-gpu ./cmd/nri-gpu

# make image: the release image, an OCI archive written without a
# container engine (deploy/cmd/mkimage; docs/install.md, "The image"):
# IMAGE_TAR, named $(IMAGE_REPO):$(VERSION), an image index with one image
# per architecture of IMAGE_ARCHES (linux/amd64, linux/arm64), each with
# its binary (CGO_ENABLED=0 GOARCH=<arch>, in IMAGE_BINDIR/<arch>). Its
# VERSION is the chart's appVersion (what the kustomization and the chart
# deploy) unless given (make image VERSION=0.2.0); the binaries in it
# report that version. Reproducible: the same commit, Go toolchain and
# libc6 packages give the same bytes (every time in it is
# SOURCE_DATE_EPOCH, the commit's time).
# glibc comes from Debian's libc6 of each architecture: for the build
# machine's own, its installed libc6 (LIBC_ROOT=/, or a libc6 package
# unpacked with dpkg-deb -x into LIBC_ROOT); for another, libc6:<arch>
# downloaded with apt-get and unpacked into bin/libc6-<arch>
# (deploy/image/debian-package.sh, which as root adds the architecture to
# dpkg), or LIBC_ROOT_<arch>=DIR. mkimage runs the other architecture's
# binary with Debian's qemu-user to check its version.
IMAGE_REPO        := ghcr.io/nri-gpu/nri-gpu
CHART_VERSION     := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' deploy/helm/nri-gpu/Chart.yaml)
IMAGE_TAR         ?= bin/nri-gpu-image.tar
IMAGE_ARCHES      ?= amd64 arm64
IMAGE_BINDIR      ?= bin/image
HOST_ARCH         := $(shell GOARCH= $(GO) env GOARCH)
LIBC_ROOT         ?= /
LIBC_ROOT_$(HOST_ARCH) ?= $(LIBC_ROOT)
libc_root          = $(or $(LIBC_ROOT_$(1)),bin/libc6-$(1))
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
ifeq ($(filter command line environment,$(origin VERSION)),)
image: VERSION = $(CHART_VERSION)
endif
define image_binary
	CGO_ENABLED=0 GOARCH=$(1) $(GO) build -trimpath -ldflags "-X main.Version=$(VERSION)" -o $(IMAGE_BINDIR)/$(1)/nri-gpu ./cmd/nri-gpu

endef
define image_libc
	deploy/image/debian-package.sh $(1) libc6 bin/libc6-$(1)

endef
image:
	$(foreach a,$(IMAGE_ARCHES),$(call image_binary,$(a)))
	$(foreach a,$(IMAGE_ARCHES),$(if $(LIBC_ROOT_$(a)),,$(call image_libc,$(a))))
	cd deploy && GOOS= GOARCH= $(GO) run ./cmd/mkimage $(foreach a,$(IMAGE_ARCHES),-binary $(a)=$(abspath $(IMAGE_BINDIR)/$(a)/nri-gpu) -libc-root $(a)=$(abspath $(call libc_root,$(a)))) -version $(VERSION) -ref $(IMAGE_REPO):$(VERSION) -epoch $(SOURCE_DATE_EPOCH) -o $(abspath $(IMAGE_TAR))

# Every test: formatting, vet, unit and protocol tests under the race
# detector, a short fuzzing round, and the end-to-end suite against a real
# containerd when root.
test: lint unit fuzz-short
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) e2e; \
	else echo "make test: not root: skipping the end-to-end suite (make e2e needs root; CI runs it)"; fi

# golangci-lint, pinned, built from the Go module proxy into the tool
# cache on first use (.golangci.yml says which linters).
GOLANGCI_VERSION ?= v2.15.0
TOOLS_CACHE      ?= $(HOME)/.cache/nri-gpu-tools
GOLANGCI_LINT    := $(TOOLS_CACHE)/golangci-lint-$(GOLANGCI_VERSION)/golangci-lint

$(GOLANGCI_LINT):
	cd /tmp && GOFLAGS= GOBIN=$(dir $(GOLANGCI_LINT)) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION)

# gofmt, go vet and golangci-lint over every module.
lint: $(GOLANGCI_LINT)
	@out="$$(gofmt -l . )"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GOLANGCI_LINT) run ./...
	@for m in $(SUBMODULES); do [ -f $$m/go.mod ] || continue; \
		(cd $$m && $(GO) vet ./... && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...) || exit 1; done

# The Helm CLI of the chart's tests (deploy: helm lint --strict and helm
# template of every switch) and of the cluster phase: the e2e tool cache's,
# built from the Go module proxy on first use as test/e2e/install-cluster.sh
# builds it (deploy's TestHelmVersionPinned keeps the versions equal).
HELM_VERSION := v4.3.1
E2E_CACHE    ?= $(or $(NRI_GPU_E2E_CACHE),$(HOME)/.cache/nri-gpu-e2e)
HELM         := $(E2E_CACHE)/helm-$(HELM_VERSION)/helm
$(HELM):
	mkdir -p $(dir $@) && d=$$(mktemp -d $(dir $@).gobin-XXXXXX) && cd /tmp && \
	GOWORK=off GOBIN=$$d $(GO) install -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$(HELM_VERSION)" helm.sh/helm/v4/cmd/helm@$(HELM_VERSION) && \
	mv $$d/helm $@ && rmdir $$d

# Unit tests, then the protocol tests (their own module), under the race
# detector; then the deploy module's tests: the manifests, and the release
# image (deploy/image: make image, its files, reproducibility, Dockerfile,
# versions; as root, run in its own root). bin/testreport prints go test's
# usual lines (and failing tests' output), then which tests were skipped
# and why: without root, the ones that need mknod or mounts.
unit: $(HELM)
	$(GO) build -o bin/testreport ./test/testreport
	bin/testreport $(GO) test -json -race -count=1 $(PKGS)
	cd test/integration && ../../bin/testreport $(GO) test -json -race -count=1 ./...
	cd deploy && NRI_GPU_HELM=$(HELM) $(GO) test -count=1 ./...

# arm64 (Grace nodes) on this amd64 machine. make arm64-tools (root):
# qemu-user registered with binfmt_misc, libc6:arm64 (multiarch), the
# aarch64 cross gcc, and libc-bin:arm64's ldconfig in bin/libc-bin-arm64
# (test/arm64/install-tools.sh). With them make unit also tests arm64
# simulated nodes (discovery, the arm64 image loading their NVML), which
# find that ldconfig through NRI_GPU_SIMNODE_LDCONFIG.
ARM64_LDCONFIG := $(CURDIR)/bin/libc-bin-arm64/sbin/ldconfig
export NRI_GPU_SIMNODE_LDCONFIG ?= $(wildcard $(ARM64_LDCONFIG))
arm64-tools:
	test/arm64/install-tools.sh bin/libc-bin-arm64

# make test-arm64 (root, amd64): the unit tests of the arm64 build,
# cross-compiled (GOARCH=arm64, no race detector: it needs cgo) and run
# under qemu-user, their simulated nodes arm64 too (aarch64 driver
# libraries, ld.so.cache, NVML loaded through purego). Not part of make
# test: see docs/benchmarks.md ("arm64") for its time.
test-arm64: arm64-tools
	$(GO) build -o bin/testreport ./test/testreport
	GOARCH=arm64 NRI_GPU_TEST_EMULATED=qemu-user NRI_GPU_SIMNODE_LDCONFIG=$(ARM64_LDCONFIG) bin/testreport $(GO) test -json -count=1 -timeout 30m $(PKGS)

# The end-to-end suite: a real containerd 2.4.2 + runc (installed from the Go
# module proxy into $$HOME/.cache/nri-gpu-e2e on first use) and the plugin on a
# simulated node, then the same against containerd 2.2.9 (older NRI API) and
# containerd 1.7.36 (NRI v0.8.0, config version 2), then CRI-O 1.34.0 (built from
# source into the same cache). One line per runtime. Then the cluster phase
# (make e2e-cluster) at each of CLUSTER_VERSIONS, and the scale smoke
# (make e2e-scale).
# Before it, on the built (non-race) plugin: TestMeasureRSS (its peak RSS
# under the DaemonSet's GOMEMLIMIT) and a smoke run of the creation cost;
# then the release image (make image) loaded with ctr images import and
# podman load, and run (test/e2e/releaseimage).
e2e: e2e-tools build image
	cd test/integration && NRI_GPU_BIN=$(CURDIR)/bin/nri-gpu NRI_GPU_MEASURE_RSS=1 $(GO) test -count=1 -run '^TestMeasureRSS$$' -bench CreateContainerCost -benchtime 20x .
	cd test/e2e && NRI_GPU_IMAGE=$(abspath $(IMAGE_TAR)) $(GO) test -v -count=1 -timeout 10m ./releaseimage/
	cd test/e2e && $(GO) test -count=1 -timeout 30m ./harness/ ./bench/ ./nvidiadra/
	cd test/e2e && NRI_GPU_E2E_RUNTIME=containerd-2.4.2 NRI_GPU_E2E_KUBELET=1 $(GO) test -v -count=1 -timeout 30m ./suite/
	cd test/e2e && NRI_GPU_E2E_RUNTIME=containerd-2.2.9 $(GO) test -v -count=1 -timeout 30m ./suite/
	cd test/e2e && NRI_GPU_E2E_RUNTIME=containerd-1.7.36 $(GO) test -v -count=1 -timeout 30m ./suite/
	cd test/e2e && NRI_GPU_E2E_RUNTIME=crio-1.34.0 $(GO) test -v -count=1 -timeout 30m ./suite/
	$(MAKE) --no-print-directory e2e-cluster
	$(MAKE) --no-print-directory e2e-scale

# CI's smoke of make bench-scale (root; TestScaleSmoke without kwok):
# the control plane at v1.37.2 and 20 Node objects the test keeps Ready
# itself (a Ready condition and a renewed Lease, as a kubelet does), each
# with nri-gpu's and NVIDIA's ResourceSlices; every claim kind at 90%
# fill on both shapes, every pod bound (none runs: no kubelet) and every
# allocation checked. About 45 s, and 25 s to compile; only with
# CLUSTER_VERSIONS (whose e2e-tools build the control plane).
e2e-scale:
	@if [ -n "$(CLUSTER_VERSIONS)" ]; then cd test/e2e && $(GO) test -tags nobench -v -count=1 -timeout 10m -run '^TestScaleSmoke$$' ./scale/; \
	else echo "make e2e-scale: CLUSTER_VERSIONS is empty: no scale smoke"; fi

e2e-tools:
	NRI_GPU_E2E_KUBELET=1 NRI_GPU_E2E_CLUSTER="$(CLUSTER_VERSIONS)" test/e2e/install-tools.sh

# The cluster phase (TestCluster): nri-gpu installed with kubectl apply -k
# and Helm on a real two-node cluster (containerd and CRI-O), once per
# Kubernetes version in CLUSTER_VERSIONS (the newest the module proxy
# serves, and the oldest with resource.k8s.io/v1). Each version's binaries
# are built into the e2e cache on first use (install-cluster.sh).
# CLUSTER_VERSIONS=v1.37.2 runs only the newest; CLUSTER_VERSIONS= none.
# NVIDIA's own DRA driver beside nri-gpu's is make e2e-peer's: its build
# (about 7.5 min on 2 cores) does not fit CI's budget beside the rest.
CLUSTER_VERSIONS ?= v1.37.2 v1.34.4
e2e-cluster: e2e-tools
	@if [ -n "$(CLUSTER_VERSIONS)" ]; then cd test/e2e && NRI_GPU_E2E_CLUSTER="$(CLUSTER_VERSIONS)" $(GO) test -v -count=1 -timeout 60m -run '^TestCluster$$' ./suite/; \
	else echo "make e2e-cluster: CLUSTER_VERSIONS is empty: no cluster phase"; fi

# NVIDIA's own DRA driver (gpu-kubelet-plugin v0.5.0, built from its Go
# module into the e2e cache on first use) beside nri-gpu's on a cluster of
# two simulated MIG nodes (TestClusterPeer; root): their ResourceSlices
# device by device, NVIDIA's quickstart claims on both, the GpuConfig
# table, prepare and restart side by side (docs/dra.md, "Beside NVIDIA's
# driver").
e2e-peer:
	CONTAINERD_VERSIONS=v2.4.2 NRI_GPU_E2E_CRIO=0 NRI_GPU_E2E_NVIDIA_DRA=1 NRI_GPU_E2E_CLUSTER="$(CLUSTER_VERSION)" test/e2e/install-tools.sh
	cd test/e2e && NRI_GPU_E2E_PEER=$(CLUSTER_VERSION) $(GO) test -v -count=1 -timeout 40m -run '^TestClusterPeer$$' ./suite/

# One command to a working demo on a machine without a GPU (root).
# RUNTIME=containerd-2.2.9, containerd-1.7.36 or crio-1.34.0 runs it on another runtime.
RUNTIME ?= containerd-2.4.2
demo: build
	cd test/e2e && $(GO) run ./cmd/demo -nri-gpu ../../bin/nri-gpu -runtime $(RUNTIME)

# The same on a real two-node Kubernetes cluster (root): nri-gpu applied
# with kubectl apply -k, three GPU pods placed by the scheduler, what each
# container sees, everything torn down. CLUSTER_VERSION picks the version.
CLUSTER_VERSION ?= v1.37.2
demo-cluster:
	CONTAINERD_VERSIONS=v2.4.2 NRI_GPU_E2E_CLUSTER="$(CLUSTER_VERSION)" test/e2e/install-tools.sh
	cd test/e2e && $(GO) run ./cmd/demo-cluster -version $(CLUSTER_VERSION)

# Fuzz targets, package:Target; `make fuzz` runs each for FUZZTIME.
FUZZTIME ?= 10s
FUZZ_TARGETS := \
	internal/requestpath/request:FuzzParseAnnotation internal/requestpath/request:FuzzParseCDI internal/requestpath/request:FuzzParseEnv internal/requestpath/request:FuzzParseEnvList internal/requestpath/request:FuzzParseIMEX inventory/require:FuzzRequirement inventory/require:FuzzCheckEnv \
	inventory/discover:FuzzParseLDCache inventory/discover:FuzzParseELF inventory/discover:FuzzParseGPUInformation \
	inventory/discover:FuzzParseProcDevices inventory/discover:FuzzParseDriverVersion inventory/discover:FuzzParseMIGMinors internal/nodestate/config:FuzzParse \
	internal/requestpath/pipeline:FuzzHandle internal/requestpath/alloc:FuzzParseKubeletShares \
	internal/kubelet/dra:FuzzParseGpuConfig internal/kubelet/dra:FuzzDecodeCheckpoint

# A run that fails with a bare "context deadline exceeded" and writes no
# failing input is Go's fuzz-coordinator race at the end of -fuzztime
# (golang/go#75804, fixed in Go 1.27), not a finding: it is reported and
# not counted as a failure.
fuzz:
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; out=/tmp/nri-gpu-fuzz.$$$$; \
		echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
		if ! $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -parallel 2 ./$$pkg >$$out 2>&1; then \
			if grep -q 'context deadline exceeded' $$out && ! grep -q 'Failing input written' $$out; then \
				echo "  (Go fuzz coordinator deadline race, golang/go#75804: no failing input; ignored)"; \
			else cat $$out; rm -f $$out; exit 1; fi; \
		fi; rm -f $$out; \
	done

# The short round of `make test` (CI): every target for a few seconds.
fuzz-short:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=2s

# Soak: 100 000 CreateContainer requests through the real protocol to
# the built (non-race) plugin, 16 concurrent clients; needs root.
SOAK_N ?= 100000
soak: build
	cd test/integration && NRI_GPU_BIN=$(CURDIR)/bin/nri-gpu NRI_GPU_SOAK_N=$(SOAK_N) $(GO) test -count=1 -timeout 30m -run '^TestSoak$$' -v . | grep -v 'level='

# The request path and allocation; as root also what a container's creation
# costs the runtime with nri-gpu (over NRI, the built plugin) and with its
# own CDI resolution of the same edits, side by side.
bench: build
	$(GO) test -run XXX -bench . -benchmem ./internal/requestpath/pipeline/ ./plugin/ ./internal/requestpath/alloc/
	@if [ "$$(id -u)" = 0 ]; then cd test/integration && NRI_GPU_BIN=$(CURDIR)/bin/nri-gpu $(GO) test -run XXX -bench CreateContainerCost -benchmem .; \
	else echo "make bench: not root: skipping BenchmarkCreateContainerCost (simulated device nodes need mknod)"; fi

# The pre-registered plugin: the runtime starts it itself and hands it
# its configuration (see docs/install.md). Also installs the
# command for nri-gpu inventory and nri-gpu doctor. An existing
# configuration file is kept.
install: build
	install -D -m 0755 bin/nri-gpu $(DESTDIR)$(PREFIX)/bin/nri-gpu
	install -D -m 0755 bin/nri-gpu $(DESTDIR)$(NRI_PLUGIN_DIR)/10-nri-gpu
	@if [ -e $(DESTDIR)$(NRI_CONF_DIR)/10-nri-gpu.conf ]; then \
		echo "keeping $(DESTDIR)$(NRI_CONF_DIR)/10-nri-gpu.conf"; \
	else install -D -m 0644 deploy/nri/10-nri-gpu.conf $(DESTDIR)$(NRI_CONF_DIR)/10-nri-gpu.conf; fi

# nri-gpu as a systemd service instead (not together with install: two
# plugins of one name cannot both register).
install-systemd: build
	install -D -m 0755 bin/nri-gpu $(DESTDIR)$(PREFIX)/bin/nri-gpu
	install -d $(DESTDIR)$(SYSTEMD_DIR)
	sed 's|/usr/local/bin/nri-gpu|$(PREFIX)/bin/nri-gpu|' deploy/systemd/nri-gpu.service > $(DESTDIR)$(SYSTEMD_DIR)/nri-gpu.service
	chmod 0644 $(DESTDIR)$(SYSTEMD_DIR)/nri-gpu.service
	@if [ -e $(DESTDIR)$(CONFIG_DIR)/config.yaml ]; then \
		echo "keeping $(DESTDIR)$(CONFIG_DIR)/config.yaml"; \
	else install -D -m 0644 deploy/systemd/config.yaml $(DESTDIR)$(CONFIG_DIR)/config.yaml; fi

# Container start latency through CRI on a real containerd (root): nri-gpu
# beside no injection, the NRI floor, containerd's CDI, the NVIDIA toolkit's
# CDI spec with its hooks and nvidia-container-runtime; markdown on stdout.
# BENCH_FLAGS="-rounds 10 -scaling-rounds 5" for a quick run. Then the row of
# containerd 1.7.36: nri-gpu and the toolkit's spec with its hooks through
# containerd 1.7's own CDI, beside no injection.
bench-e2e: build
	cd test/e2e && $(GO) run ./cmd/bench-e2e -nri-gpu ../../bin/nri-gpu $(BENCH_FLAGS)
	cd test/e2e && $(GO) run ./cmd/bench-e2e -nri-gpu ../../bin/nri-gpu -runtime containerd-1.7.36 -phases main -paths nri-gpu,toolkit $(BENCH_FLAGS)

# Pod start as the cluster sees it (root): creation to Running from the
# API server's watch, paired rounds of a GPU-less pod, a 1-GPU pod through
# nri-gpu, a 1-GPU claim through nri-gpu's DRA driver, and the NVIDIA paths
# (its device plugin's envvar answer + nvidia-container-runtime as a runtime
# class; a claim through a stand-in of its DRA driver's kubelet plugin, a
# per-claim CDI spec with nvidia-cdi-hook hooks) on the cluster of
# make e2e-cluster. BENCH_ROUNDS=5 for a quick run.
BENCH_ROUNDS ?= 50
bench-cluster:
	CONTAINERD_VERSIONS=v2.4.2 NRI_GPU_E2E_CRIO=0 NRI_GPU_E2E_NVIDIA_DRA=1 NRI_GPU_E2E_CLUSTER="$(CLUSTER_VERSION)" test/e2e/install-tools.sh
	cd test/e2e && NRI_GPU_E2E_CLUSTER="$(CLUSTER_VERSION)" NRI_GPU_E2E_CLUSTER_BENCH=$(BENCH_ROUNDS) $(GO) test -v -count=1 -timeout 90m -run '^TestClusterPodStart$$' ./suite/

# A thousand GPU nodes (root; docs/benchmarks.md): the suite's control
# plane with SCALE_NODES simulated GPU nodes (Node objects that kwok
# serves), each with the ResourceSlices nri-gpu publishes for 8 H100s and
# with the slices NVIDIA's real DRA driver (gpu-kubelet-plugin, built into
# the e2e cache when missing) publishes for the same node, captured first
# in the same run, and the scheduler's
# claim pods a second over them at 0, 50 and 90% fill, SCALE_ROUNDS
# interleaved rounds (even: each shape goes first as often); tables in
# bin/bench-scale. Not in CI: kwok's build
# (its own Kubernetes libraries, up to 29 min on a loaded 2-core machine)
# does not fit CI's budget; CI runs make e2e-scale, the smoke without
# kwok (pods bound, not Running). make bench-scale-smoke runs the 20-node
# smoke with kwok, Running measured too (about 95 s once kwok is built).
SCALE_NODES ?= 100 500 1000
SCALE_ROUNDS ?= 4
SCALE_FEATURES ?= plain cel share mig
SCALE_FILLS ?= 0 50 90
bench-scale:
	NRI_GPU_E2E_KWOK=1 NRI_GPU_E2E_CLUSTER="$(CLUSTER_VERSION)" test/e2e/install-cluster.sh
	cd test/e2e && NRI_GPU_SCALE="$(SCALE_NODES)" NRI_GPU_SCALE_ROUNDS=$(SCALE_ROUNDS) NRI_GPU_SCALE_FEATURES="$(SCALE_FEATURES)" NRI_GPU_SCALE_FILLS="$(SCALE_FILLS)" NRI_GPU_SCALE_OUT=$(CURDIR)/bin/bench-scale $(GO) test -v -count=1 -timeout 0 -run '^TestSchedulerScale$$' ./scale/

# One agent at cluster scale (root; docs/benchmarks.md): nri-gpu's
# requests to the API server (the audit log) at install, AGENT_MINUTES of
# steady state, a restart, a health flap and 100 claim prepares; then one
# node of 56 MIG devices driven at NODE_RATE pod starts a second for
# AGENT_MINUTES, each pod living NODE_LIFE seconds (NODE_RATE="2 3 4":
# each rate in turn, a probe for the highest sustained one).
AGENT_MINUTES ?= 10
NODE_RATE ?= 1
NODE_LIFE ?= 20
bench-scale-smoke:
	NRI_GPU_E2E_KWOK=1 NRI_GPU_E2E_CLUSTER="$(CLUSTER_VERSION)" test/e2e/install-cluster.sh
	cd test/e2e && NRI_GPU_SCALE_KWOK=1 $(GO) test -v -count=1 -timeout 20m -run '^TestScaleSmoke$$' ./scale/

bench-agent:
	CONTAINERD_VERSIONS=v2.4.2 NRI_GPU_E2E_CRIO=0 NRI_GPU_E2E_CLUSTER="$(CLUSTER_VERSION)" test/e2e/install-tools.sh
	cd test/e2e && NRI_GPU_E2E_API_COST=$(AGENT_MINUTES) $(GO) test -v -count=1 -timeout 60m -run '^TestAgentAPICost$$' ./suite/
	cd test/e2e && NRI_GPU_E2E_NODE_RATE=$(AGENT_MINUTES) NRI_GPU_E2E_NODE_RATE_PODS="$(NODE_RATE)" NRI_GPU_E2E_NODE_RATE_LIFE=$(NODE_LIFE) $(GO) test -v -count=1 -timeout 60m -run '^TestNodeRate$$' ./suite/

clean:
	rm -rf bin
