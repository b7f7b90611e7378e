#!/usr/bin/env bash
# Warm the nri-gpu e2e tool cache: pinned containerd (+ shim, ctr) and runc, built
# with `go install` from the Go module proxy (containerd 1.7: `go build` in its
# downloaded module source, which `go install` refuses). Mirrors harness.InstallTools: same
# directories, so the Go harness finds what this script installed.
#
# usage: test/e2e/install-tools.sh [cachedir]
#   cachedir defaults to $NRI_GPU_E2E_CACHE, else $HOME/.cache/nri-gpu-e2e
# env:
#   CONTAINERD_VERSIONS        containerd versions, space-separated (default "v2.4.2 v2.2.9 v1.7.36")
#   NRI_GPU_E2E_RUNC_SECCOMP=0 build runc without seccomp (default: with seccomp,
#                              installing libseccomp-dev with apt-get when missing;
#                              falls back to no seccomp if that fails)
#   NRI_GPU_E2E_KUBELET=1      also build the kubelet (opt-in kubelet phase; ~4 min), unless
#                              the cluster's v1.34.4 build below has one
#   NRI_GPU_E2E_CLUSTER="v1.37.2 ..."  also build the cluster phase's binaries for these
#                              Kubernetes versions, etcd and Helm (install-cluster.sh)
#   NRI_GPU_E2E_NVIDIA_DRA=1   also build NVIDIA's DRA driver (gpu-kubelet-plugin; ~5 min)
#
# Layout: <cache>/containerd-<v>/{containerd,containerd-shim-runc-v2,ctr}  (v2.4.2, v2.2.9, v1.7.36)
#         <cache>/runc-v1.5.3/runc              (built with -tags seccomp)
#         <cache>/runc-v1.5.3-noseccomp/runc    (built without)
#         <cache>/nvidia-container-toolkit-v1.20.2/{nvidia-cdi-hook,nvidia-container-runtime,nvidia-ctk}
#         <cache>/kubelet-v1.34.4/kubelet       (only with NRI_GPU_E2E_KUBELET=1)
#         <cache>/kubernetes-<v>/{kube-apiserver,...,kubelet}, etcd-<v>/, helm-<v>/
#                                               (only with NRI_GPU_E2E_CLUSTER)
#         <cache>/crio-v1.34.0/{crio,pinns}     (NRI_GPU_E2E_CRIO=0 skips it; conmon and
#                                               skopeo come from apt when missing)
#         <cache>/nvidia-dra-driver-gpu-v0.5.0/gpu-kubelet-plugin
#                                               (only with NRI_GPU_E2E_NVIDIA_DRA=1: NVIDIA's
#                                               DRA driver, for the cluster phase's comparison)
set -euo pipefail

cache="${1:-${NRI_GPU_E2E_CACHE:-$HOME/.cache/nri-gpu-e2e}}"
containerd_versions="${CONTAINERD_VERSIONS:-v2.4.2 v2.2.9 v1.7.36}"
runc_version="v1.5.3" # keep in sync with harness.RuncVersion
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
export GOWORK=off

install() { # dir pkg@version binary [extra go install args...]
  local dir="$1" pkg="$2" bin="$3"; shift 3
  if [ -x "$dir/$bin" ]; then
    echo "cached  $dir/$bin"
    return
  fi
  mkdir -p "$dir"
  local scratch t0=$SECONDS
  scratch="$(mktemp -d "$dir/.gobin-XXXXXX")"
  echo "install $pkg -> $dir"
  (cd /tmp && GOBIN="$scratch" go install -trimpath "$@" "$pkg")
  mv "$scratch/$bin" "$dir/$bin"
  rmdir "$scratch"
  echo "done    $dir/$bin in $((SECONDS - t0))s"
}

# containerd 1.x: `go install` refuses it (its go.mod has an exclude directive),
# but its module source builds. Mirrors harness.buildContainerd1.
build_containerd1() { # dir version
  local dir="$1" v="$2" c missing=0
  for c in containerd containerd-shim-runc-v2 ctr; do
    [ -x "$dir/$c" ] || missing=1
  done
  if [ "$missing" = 0 ]; then
    echo "cached  $dir/{containerd,containerd-shim-runc-v2,ctr}"
    return
  fi
  mkdir -p "$dir"
  local src moddir t0=$SECONDS
  src="$(mktemp -d "$dir/.src-XXXXXX")"
  echo "build   github.com/containerd/containerd@$v -> $dir"
  moddir="$(cd /tmp && go mod download -json "github.com/containerd/containerd@$v" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  cp -r "$moddir/." "$src/"
  chmod -R u+w "$src"
  for c in containerd containerd-shim-runc-v2 ctr; do
    [ -x "$dir/$c" ] && continue
    local env=(GOFLAGS=-mod=mod)
    [ "$c" = containerd-shim-runc-v2 ] && env+=(CGO_ENABLED=0) # static, as containerd's Makefile builds it
    (cd "$src" && env "${env[@]}" go build -trimpath -tags urfave_cli_no_docs \
      -ldflags "-X github.com/containerd/containerd/version.Version=$v" -o "$dir/.$c.tmp" "./cmd/$c")
    mv "$dir/.$c.tmp" "$dir/$c"
  done
  rm -rf "$src"
  echo "done    $dir in $((SECONDS - t0))s"
}

for v in $containerd_versions; do
  d="$cache/containerd-$v"
  case "$v" in
  v1.*) build_containerd1 "$d" "$v" ;;
  *)
    for c in containerd containerd-shim-runc-v2 ctr; do
      install "$d" "github.com/containerd/containerd/v2/cmd/$c@$v" "$c"
    done
    ;;
  esac
done

seccomp=0
if [ "${NRI_GPU_E2E_RUNC_SECCOMP:-1}" != 0 ]; then
  if pkg-config --exists libseccomp 2>/dev/null; then
    seccomp=1
  elif command -v apt-get >/dev/null; then
    echo "apt-get install libseccomp-dev (runc's seccomp build needs its headers)"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libseccomp-dev >/dev/null ||
      { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libseccomp-dev >/dev/null; }; then
      seccomp=1
    fi
  fi
fi
if [ "$seccomp" = 1 ]; then
  CGO_ENABLED=1 install "$cache/runc-$runc_version" "github.com/opencontainers/runc@$runc_version" runc -tags seccomp
else
  echo "building runc without seccomp support"
  CGO_ENABLED=1 install "$cache/runc-$runc_version-noseccomp" "github.com/opencontainers/runc@$runc_version" runc
fi

# The NVIDIA Container Toolkit, for the start-latency benchmark and its smoke
# test (test/e2e/bench) and the cluster phase's migration from it
# (nvidia-ctk): keep in sync with bench.ToolkitVersion.
toolkit_version="v1.20.2"
for b in nvidia-cdi-hook nvidia-container-runtime nvidia-ctk; do
  install "$cache/nvidia-container-toolkit-$toolkit_version" "github.com/NVIDIA/nvidia-container-toolkit/cmd/$b@$toolkit_version" "$b"
done

# The kubelet (v1.34.4), for the kubelet phase of the suite only
# (NRI_GPU_E2E_KUBELET=1; keep in sync with harness.KubeletVersion). It is not
# `go install`-able: its go.mod replaces k8s.io/* with ./staging, which the
# module zip lacks. Build it from the module source with the staging replaces
# swapped for the published v0.34.x modules (about 4 min on 2 cores).
# The cluster phase's binaries first: a v1.34.4 build there has the
# kubelet phase's kubelet too (harness.InstallKubelet prefers it).
if [ -n "${NRI_GPU_E2E_CLUSTER:-}" ]; then
  "$(dirname "$0")/install-cluster.sh" "$cache"
fi

kubelet_version="v1.34.4"
if [ "${NRI_GPU_E2E_KUBELET:-0}" = 1 ]; then
  d="$cache/kubelet-$kubelet_version"
  if [ -x "$cache/kubernetes-$kubelet_version/kubelet" ]; then
    echo "cached  $cache/kubernetes-$kubelet_version/kubelet (the cluster's)"
  elif [ -x "$d/kubelet" ]; then
    echo "cached  $d/kubelet"
  else
    t0=$SECONDS
    mkdir -p "$d"
    src="$(mktemp -d "$d/.src-XXXXXX")"
    echo "build   k8s.io/kubernetes@$kubelet_version cmd/kubelet -> $d"
    moddir="$(cd /tmp && go mod download -json "k8s.io/kubernetes@$kubelet_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    cp -r "$moddir/." "$src/"
    chmod -R u+w "$src"
    (
      cd "$src"
      staging_minor="v0.${kubelet_version#v1.}"
      args=()
      for m in $(go mod edit -json | sed -n 's/^[[:space:]]*"Path": "\(k8s\.io\/[^"]*\)"$/\1/p' | sort -u); do
        if go mod edit -json | grep -q "\"Path\": \"./staging/src/$m\""; then
          args+=("-dropreplace=$m" "-require=$m@$staging_minor")
        fi
      done
      go mod edit "${args[@]}" -droprequire=k8s.io/sample-cli-plugin -droprequire=k8s.io/sample-controller
      GOFLAGS=-mod=mod go build -trimpath -o "$d/.kubelet.tmp" \
        -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$kubelet_version" ./cmd/kubelet
    )
    mv "$d/.kubelet.tmp" "$d/kubelet"
    rm -rf "$src"
    echo "done    $d/kubelet in $((SECONDS - t0))s"
  fi
fi

# CRI-O (v1.34.0), for the CRI-O run of the suite (NRI_GPU_E2E_RUNTIME=crio-1.34.0;
# keep in sync with harness.CRIOVersion). `go install` stops on it (the proxy's
# version list answers 403) but the module download works: build cmd/crio and
# its small C helper pinns from the module source (about 2-4 min on 2 cores).
# conmon and skopeo (image import into CRI-O's storage) come from Debian.
crio_version="v1.34.0"
if [ "${NRI_GPU_E2E_CRIO:-1}" != 0 ]; then
  missing=()
  command -v conmon >/dev/null || missing+=(conmon)
  command -v skopeo >/dev/null || missing+=(skopeo)
  pkg-config --exists libseccomp 2>/dev/null || missing+=(libseccomp-dev)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "apt-get install ${missing[*]} (CRI-O's monitor, image copy, seccomp headers)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
      { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
  fi
  d="$cache/crio-$crio_version"
  if [ -x "$d/crio" ] && [ -x "$d/pinns" ]; then
    echo "cached  $d/crio"
  else
    t0=$SECONDS
    mkdir -p "$d"
    src="$(mktemp -d "$d/.src-XXXXXX")"
    echo "build   github.com/cri-o/cri-o@$crio_version cmd/crio + pinns -> $d"
    moddir="$(cd /tmp && go mod download -json "github.com/cri-o/cri-o@$crio_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    cp -r "$moddir/." "$src/"
    chmod -R u+w "$src"
    (
      cd "$src"
      CGO_ENABLED=1 go build -trimpath -o "$d/.crio.tmp" \
        -tags "containers_image_ostree_stub exclude_graphdriver_btrfs containers_image_openpgp seccomp" \
        -ldflags "-s -w" ./cmd/crio
      make -C pinns >/dev/null
      cp bin/pinns "$d/.pinns.tmp" # pinns/Makefile writes ../bin/pinns
    )
    mv "$d/.pinns.tmp" "$d/pinns"
    mv "$d/.crio.tmp" "$d/crio"
    rm -rf "$src"
    echo "done    $d/crio in $((SECONDS - t0))s"
  fi
fi

# NVIDIA's DRA driver (gpu-kubelet-plugin v0.5.0), for the cluster phase's
# comparison with nri-gpu's and the pod-start bench (NRI_GPU_E2E_NVIDIA_DRA=1;
# keep in sync with harness.InstallNVIDIADRA). Its go.mod names it
# sigs.k8s.io/dra-driver-nvidia-gpu, so it builds in its module directory.
# The proxy refuses two of its requirements: k8s.io/kubernetes v1.37.0-rc.0
# (replaced by v1.37.2) and github.com/NVIDIA/go-nvfm (replaced by our
# stand-in, test/e2e/nvidiadra/go-nvfm: the fabric manager path is an alpha
# gate, off). About 5 min on 2 cores.
nvidia_dra_version="v0.5.0"
if [ "${NRI_GPU_E2E_NVIDIA_DRA:-0}" = 1 ]; then
  d="$cache/nvidia-dra-driver-gpu-$nvidia_dra_version"
  if [ -x "$d/gpu-kubelet-plugin" ]; then
    echo "cached  $d/gpu-kubelet-plugin"
  else
    t0=$SECONDS
    mkdir -p "$d"
    src="$(mktemp -d "$d/.src-XXXXXX")"
    nvfm="$(cd "$(dirname "$0")/nvidiadra/go-nvfm" && pwd)"
    echo "build   github.com/NVIDIA/k8s-dra-driver-gpu@$nvidia_dra_version cmd/gpu-kubelet-plugin -> $d"
    moddir="$(cd /tmp && go mod download -json "github.com/NVIDIA/k8s-dra-driver-gpu@$nvidia_dra_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    cp -r "$moddir/." "$src/"
    chmod -R u+w "$src"
    (
      cd "$src"
      go mod edit -replace k8s.io/kubernetes=k8s.io/kubernetes@v1.37.2 -replace "github.com/NVIDIA/go-nvfm=$nvfm"
      # (cgo prints go-nvml's deprecation warnings; they are harmless)
      GOFLAGS=-mod=mod CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o "$d/.gpu-kubelet-plugin.tmp" ./cmd/gpu-kubelet-plugin
    )
    mv "$d/.gpu-kubelet-plugin.tmp" "$d/gpu-kubelet-plugin"
    rm -rf "$src"
    echo "done    $d/gpu-kubelet-plugin in $((SECONDS - t0))s"
  fi
fi
