# nri-gpu: see README.md.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.Version=$(VERSION)
PKGS    := ./...
# Modules with their own go.mod, checked like the product module.
SUBMODULES := test/e2e

.PHONY: all build test lint unit e2e bench demo bench-e2e clean

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

bench:
	$(GO) test -run XXX -bench . -benchmem ./plugin/

clean:
	rm -rf bin
