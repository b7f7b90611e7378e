#!/usr/bin/env bash
# Warm the nri-gpu e2e tool cache: pinned containerd (+ shim, ctr) and runc, built
# with `go install` from the Go module proxy. Mirrors harness.InstallTools: same
# directories, so the Go harness finds what this script installed.
#
# usage: test/e2e/install-tools.sh [cachedir]
#   cachedir defaults to $NRI_GPU_E2E_CACHE, else $HOME/.cache/nri-gpu-e2e
# env:
#   CONTAINERD_VERSIONS        containerd versions, space-separated (default "v2.4.2 v2.2.9")
#   NRI_GPU_E2E_RUNC_SECCOMP=0 build runc without seccomp (default: with seccomp,
#                              installing libseccomp-dev with apt-get when missing;
#                              falls back to no seccomp if that fails)
#
# Layout: <cache>/containerd-<v>/{containerd,containerd-shim-runc-v2,ctr}
#         <cache>/runc-v1.5.3/runc              (built with -tags seccomp)
#         <cache>/runc-v1.5.3-noseccomp/runc    (built without)
#         <cache>/nvidia-container-toolkit-v1.20.2/{nvidia-cdi-hook,nvidia-container-runtime}
set -euo pipefail

cache="${1:-${NRI_GPU_E2E_CACHE:-$HOME/.cache/nri-gpu-e2e}}"
containerd_versions="${CONTAINERD_VERSIONS:-v2.4.2 v2.2.9}"
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

for v in $containerd_versions; do
  d="$cache/containerd-$v"
  for c in containerd containerd-shim-runc-v2 ctr; do
    install "$d" "github.com/containerd/containerd/v2/cmd/$c@$v" "$c"
  done
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
# test only (test/e2e/bench): keep in sync with bench.ToolkitVersion.
toolkit_version="v1.20.2"
for b in nvidia-cdi-hook nvidia-container-runtime; do
  install "$cache/nvidia-container-toolkit-$toolkit_version" "github.com/NVIDIA/nvidia-container-toolkit/cmd/$b@$toolkit_version" "$b"
done
