#!/usr/bin/env bash
# Build the e2e cluster's binaries into the nri-gpu e2e tool cache: a Kubernetes
# control plane and kubelet per version (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kubelet from k8s.io/kubernetes), etcd and the Helm CLI.
# Mirrors harness.InstallKubernetes, InstallEtcd and InstallHelm: same
# directories, so the Go harness finds what this script built.
#
# usage: test/e2e/install-cluster.sh [cachedir]
#   cachedir defaults to $NRI_GPU_E2E_CACHE, else $HOME/.cache/nri-gpu-e2e
# env:
#   NRI_GPU_E2E_CLUSTER  Kubernetes versions, space-separated (default "v1.37.2";
#                        make e2e passes $(CLUSTER_VERSIONS))
#
# Layout: <cache>/kubernetes-<v>/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl,kubelet}
#         <cache>/etcd-v3.6.16/etcd
#         <cache>/helm-v4.3.1/helm
#         <cache>/kwok-v0.8.0/kwok  (the scale bench's node simulator)
#
# Each Kubernetes version is ONE `go build` of its five commands, so the packages
# they share compile once (-trimpath, -s -w: no debug info to link). The script
# prints each build's time. Builds write to a scratch name and rename, so an
# interrupted build leaves nothing half-written.
set -euo pipefail

cache="${1:-${NRI_GPU_E2E_CACHE:-$HOME/.cache/nri-gpu-e2e}}"
versions="${NRI_GPU_E2E_CLUSTER:-v1.37.2}"
etcd_version="v3.6.16" # keep in sync with harness.EtcdVersion
helm_version="v4.3.1"  # keep in sync with harness.HelmVersion
kwok_version="v0.8.0"  # keep in sync with harness.KwokVersion
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
export GOWORK=off

moddir() { # module@version -> its directory in the module cache
  (cd /tmp && go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}

# build_kubernetes dir version cmd...: the k8s.io/kubernetes module source, with
# its ./staging replaces (the module zip lacks staging/) swapped for the
# published k8s.io/* v0.<minor>.<patch> modules and the two test-only requires
# the proxy refuses dropped, then one go build of ./cmd/<cmd> for each cmd.
build_kubernetes() {
  local dir="$1" v="$2"; shift 2
  local c missing=0
  for c in "$@"; do [ -x "$dir/$c" ] || missing=1; done
  if [ "$missing" = 0 ]; then
    echo "cached  $dir/{$(IFS=,; echo "$*")}"
    return
  fi
  mkdir -p "$dir"
  local src out t0=$SECONDS
  src="$(mktemp -d "$dir/.src-XXXXXX")"
  out="$(mktemp -d "$dir/.out-XXXXXX")"
  echo "build   k8s.io/kubernetes@$v ($*) -> $dir"
  cp -r "$(moddir "k8s.io/kubernetes@$v")/." "$src/"
  chmod -R u+w "$src"
  (
    cd "$src"
    staging="v0.${v#v1.}"
    args=()
    for m in $(go mod edit -json | sed -n 's/^[[:space:]]*"Path": "\(k8s\.io\/[^"]*\)"$/\1/p' | sort -u); do
      if go mod edit -json | grep -q "\"Path\": \"./staging/src/$m\""; then
        args+=("-dropreplace=$m" "-require=$m@$staging")
      fi
    done
    go mod edit "${args[@]}" -droprequire=k8s.io/sample-cli-plugin -droprequire=k8s.io/sample-controller
    pkgs=()
    for c in "$@"; do pkgs+=("./cmd/$c"); done
    GOFLAGS=-mod=mod go build -trimpath -o "$out/" \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$v -X k8s.io/client-go/pkg/version.gitVersion=$v" "${pkgs[@]}"
  )
  for c in "$@"; do mv "$out/$c" "$dir/$c"; done
  rm -rf "$src" "$out"
  echo "done    $dir in $((SECONDS - t0))s"
}

# build_etcd dir version: the proxy has no installable etcd main, but
# go.etcd.io/etcd/server/v3 has etcdmain: a one-line main in a module of its own.
build_etcd() {
  local dir="$1" v="$2"
  if [ -x "$dir/etcd" ]; then
    echo "cached  $dir/etcd"
    return
  fi
  mkdir -p "$dir"
  local src t0=$SECONDS
  src="$(mktemp -d "$dir/.src-XXXXXX")"
  echo "build   go.etcd.io/etcd/server/v3@$v etcdmain -> $dir"
  (
    cd "$src"
    printf 'module nri-gpu-e2e/etcd\n\ngo 1.26.0\n' >go.mod
    printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >main.go
    GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$v" >/dev/null 2>&1
    GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1
    GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$dir/.etcd.tmp" .
  )
  mv "$dir/.etcd.tmp" "$dir/etcd"
  rm -rf "$src"
  echo "done    $dir/etcd in $((SECONDS - t0))s"
}

# build_helm dir version: helm's go.mod has no replace directives, so
# go install works.
build_helm() {
  local dir="$1" v="$2"
  if [ -x "$dir/helm" ]; then
    echo "cached  $dir/helm"
    return
  fi
  mkdir -p "$dir"
  local scratch t0=$SECONDS
  scratch="$(mktemp -d "$dir/.gobin-XXXXXX")"
  echo "install helm.sh/helm/v4/cmd/helm@$v -> $dir"
  (cd /tmp && GOBIN="$scratch" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$v" "helm.sh/helm/v4/cmd/helm@$v")
  mv "$scratch/helm" "$dir/helm"
  rmdir "$scratch"
  echo "done    $dir/helm in $((SECONDS - t0))s"
}

# build_kwok dir version: sigs.k8s.io/kwok's node simulator, for the scale
# bench (test/e2e/scale); go install works.
build_kwok() {
  local dir="$1" v="$2"
  if [ -x "$dir/kwok" ]; then
    echo "cached  $dir/kwok"
    return
  fi
  mkdir -p "$dir"
  local scratch t0=$SECONDS
  scratch="$(mktemp -d "$dir/.gobin-XXXXXX")"
  echo "install sigs.k8s.io/kwok/cmd/kwok@$v -> $dir"
  (cd /tmp && GOBIN="$scratch" go install -trimpath "sigs.k8s.io/kwok/cmd/kwok@$v")
  mv "$scratch/kwok" "$dir/kwok"
  rmdir "$scratch"
  echo "done    $dir/kwok in $((SECONDS - t0))s"
}

# The nodes' pod network: Debian's CNI plugins (bridge, host-local).
if [ ! -x /usr/lib/cni/bridge ] && command -v apt-get >/dev/null; then
  echo "apt-get install containernetworking-plugins (the cluster's pod network)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends containernetworking-plugins >/dev/null ||
    { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends containernetworking-plugins >/dev/null; }
fi

for v in $versions; do
  build_kubernetes "$cache/kubernetes-$v" "$v" kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet
done
build_etcd "$cache/etcd-$etcd_version" "$etcd_version"
build_helm "$cache/helm-$helm_version" "$helm_version"
# kwok only for the scale bench (make bench-scale sets NRI_GPU_E2E_KWOK=1):
# its build (its own Kubernetes libraries) does not fit CI's budget.
if [ "${NRI_GPU_E2E_KWOK:-0}" = 1 ]; then
  build_kwok "$cache/kwok-$kwok_version" "$kwok_version"
fi
