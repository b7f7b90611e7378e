# nri-gpu: see README.md.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.Version=$(VERSION)
PKGS    := ./...
# Modules with their own go.mod, checked like the product module.
SUBMODULES := test/e2e

.PHONY: all build test lint unit e2e e2e-tools bench demo bench-e2e clean

all: build

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/nri-gpu ./cmd/nri-gpu

# Every test: formatting, vet, unit and protocol tests under the race
# detector, and the end-to-end suite against a real containerd when root.
test: lint unit
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) e2e; \
	else echo "make test: not root: skipping the end-to-end suite (make e2e needs root; CI runs it)"; fi

lint:
	@out="$$(gofmt -l . )"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@for m in $(SUBMODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

unit:
	$(GO) test -race -count=1 $(PKGS)

# The end-to-end suite: a real containerd 2.4.2 + runc (installed from the Go
# module proxy into $$HOME/.cache/nri-gpu-e2e on first use) and the plugin on a
# simulated node, then the same against containerd 2.2.9 (older NRI API).
e2e: e2e-tools
	cd test/e2e && $(GO) test -count=1 -timeout 30m ./harness/
	cd test/e2e && $(GO) test -v -count=1 -timeout 30m ./suite/
	cd test/e2e && NRI_GPU_E2E_CONTAINERD_VERSION=v2.2.9 $(GO) test -v -count=1 -timeout 30m ./suite/

e2e-tools:
	test/e2e/install-tools.sh

# One command to a working demo on a machine without a GPU (root).
demo: build
	cd test/e2e && $(GO) run ./cmd/demo -nri-gpu ../../bin/nri-gpu

bench:
	$(GO) test -run XXX -bench . -benchmem ./plugin/ ./alloc/

clean:
	rm -rf bin
