#!/usr/bin/env bash
# Build the real control plane (kube-apiserver, kube-scheduler, kubectl, etcd), Helm, and the
# parts of a real node (kubelet, kube-proxy, kube-controller-manager, CoreDNS) from the Go module
# proxy, cached by version outside the repo.
#
#   hack/build-control-plane.sh            # control plane + Helm: build what is missing, print the bin dir
#   hack/build-control-plane.sh node       # kubelet, kube-proxy, kube-controller-manager, CoreDNS
#   hack/build-control-plane.sh dra        # hack/dra-test-driver, the DRA kubelet plugin test double
#   hack/build-control-plane.sh containerd # containerd 1.7 + its runc shim (CDI), for the real node's DRA pods
#
# Layout: $GPUPLACE_CACHE (default ~/.cache/gpuplace)/bin/k8s-<ver>/{kube-apiserver,...}
# k8s.io/kubernetes is built the way kubernetes-sigs/scheduler-plugins consumes it: every
# k8s.io/* staging module it lists as "=> ./staging/..." is replaced by its v0.X.Y release.
# etcd's server module has local replaces in its own go.mod, so it is built from a small
# wrapper module that calls etcdmain.Main.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v1.7.29}"
CACHE="${GPUPLACE_CACHE:-$HOME/.cache/gpuplace}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$CACHE/bin"
export GOFLAGS="-buildvcs=false -trimpath"
export CGO_ENABLED=0
LDFLAGS="-s -w"

log() { echo "[build-control-plane] $*" >&2; }

# Version stamps, as the projects' own release builds set them (kubernetes hack/lib/version.sh,
# helm's Makefile); without them kube-apiserver reports v0.0.0-master and Helm assumes k8s v1.20.
# Each binary records the ldflags it was built with (.recipe-<name> for k8s, .recipe for Helm); a
# different recipe rebuilds it.
k8s_ldflags() {
  local v="$K8S_VERSION" major minor
  major="${v#v}"; major="${major%%.*}"
  minor="${v#v*.}"; minor="${minor%%.*}"
  local f="$LDFLAGS"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f="$f -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  echo "$f"
}

helm_ldflags() {
  # Helm's Makefile derives the Kubernetes version it assumes from its client-go (v0.X -> 1.X).
  local modfile client_minor
  modfile="$(go env GOMODCACHE)/cache/download/helm.sh/helm/v3/@v/$HELM_VERSION.mod"
  [ -f "$modfile" ] || (cd "$(mktemp -d)" && go mod download -json "helm.sh/helm/v3@$HELM_VERSION" >/dev/null)
  client_minor=$(awk '$1 == "k8s.io/client-go" {split($2, a, "."); print a[2]}' "$modfile")
  local f="$LDFLAGS -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    f="$f -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$client_minor"
  done
  echo "$f"
}

# fresh DIR RECIPE BINARY...: true when every binary exists and was built with RECIPE.
fresh() {
  local out="$1" recipe="$2"; shift 2
  [ "$(cat "$out/.recipe" 2>/dev/null)" = "$recipe" ] || return 1
  for b in "$@"; do [ -x "$out/$b" ] || return 1; done
}

# install_bin SRC DST: replace DST atomically (a running test may be executing the old one).
install_bin() { mv -f "$1" "$2"; }

# Commands of k8s.io/kubernetes this script builds: the control plane's and the node's.
K8S_COMMANDS=(kube-apiserver kube-scheduler kubectl kubelet kube-proxy kube-controller-manager)

# build_k8s COMMAND...: build those commands of k8s.io/kubernetes into $BIN/k8s-$K8S_VERSION.
# Each binary's ldflags are recorded in .recipe-<name>, so adding commands rebuilds none of the others.
build_k8s() {
  local out="$BIN/k8s-$K8S_VERSION"
  local flags; flags=$(k8s_ldflags)
  local want=() b
  for b in "$@"; do
    # .recipe is where earlier versions of this script recorded the flags of the first three.
    [ -f "$out/.recipe-$b" ] || [ ! -f "$out/.recipe" ] || cp "$out/.recipe" "$out/.recipe-$b"
    [ "$(cat "$out/.recipe-$b" 2>/dev/null)" = "$flags" ] && [ -x "$out/$b" ] || want+=("$b")
  done
  [ ${#want[@]} -eq 0 ] && { log "k8s $K8S_VERSION ($*) cached in $out"; return; }
  local mod="$CACHE/src/k8s-$K8S_VERSION"
  mkdir -p "$mod" "$out"
  local staging_minor="v0.${K8S_VERSION#v1.}"
  # Every command built from this module is imported by tools.go, so that go.sum has what each
  # needs; a module prepared by an older script (fewer commands) is tidied again.
  local tools
  tools=$(printf '//go:build tools\n\npackage tools\n\nimport (\n'; for c in "${K8S_COMMANDS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done; printf ')\n')
  if [ ! -f "$mod/go.sum" ] || [ "$(cat "$mod/tools.go" 2>/dev/null)" != "$tools" ]; then
    log "preparing module for k8s.io/kubernetes $K8S_VERSION (staging $staging_minor)"
    local gomod
    gomod=$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    {
      echo "module gpuplace.local/controlplane"
      echo
      echo "go 1.24"
      echo
      echo "require k8s.io/kubernetes $K8S_VERSION"
      echo
      echo "replace ("
      grep -E '^\s+k8s.io/[a-z0-9-]+ => ./staging/' "$gomod" | awk -v v="$staging_minor" '{print "\t" $1 " => " $1 " " v}'
      echo ")"
    } > "$mod/go.mod"
    echo "$tools" > "$mod/tools.go"
    (cd "$mod" && go mod tidy -e >/dev/null 2>&1 || true; cd "$mod" && go mod download)
  fi
  for b in "${want[@]}"; do
    log "building $b $K8S_VERSION (first build takes minutes on 2 cores; cached after)"
    (cd "$mod" && go build -ldflags "$flags" -o "$out/$b.new" "k8s.io/kubernetes/cmd/$b")
    install_bin "$out/$b.new" "$out/$b"
    echo "$flags" > "$out/.recipe-$b"
  done
}

build_etcd() {
  local out="$BIN/etcd-$ETCD_VERSION"
  [ -x "$out/etcd" ] && { log "etcd $ETCD_VERSION cached"; return; }
  local mod="$CACHE/src/etcd-$ETCD_VERSION"
  mkdir -p "$mod" "$out"
  cat > "$mod/main.go" <<'GO'
// Wrapper so that etcd builds from the module proxy: go.etcd.io/etcd/server/v3's own
// go.mod uses local replaces, so `go install` of it cannot work directly.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  if [ ! -f "$mod/go.sum" ]; then
    printf 'module gpuplace.local/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$mod/go.mod"
    (cd "$mod" && go mod tidy)
  fi
  log "building etcd $ETCD_VERSION"
  (cd "$mod" && go build -ldflags "$LDFLAGS" -o "$out/etcd" .)
}

build_helm() {
  local out="$BIN/helm-$HELM_VERSION"
  local flags; flags=$(helm_ldflags)
  fresh "$out" "$flags" helm && { log "helm $HELM_VERSION cached"; return; }
  mkdir -p "$out"
  log "building helm $HELM_VERSION"
  local tmp; tmp=$(mktemp -d)
  GOBIN="$tmp" go install -ldflags "$flags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  install_bin "$tmp/helm" "$out/helm"
  echo "$flags" > "$out/.recipe"
}

# CoreDNS, the cluster DNS of the end-to-end tests' real node (pods resolve Service names).
build_coredns() {
  local out="$BIN/coredns-$COREDNS_VERSION"
  [ -x "$out/coredns" ] && { log "coredns $COREDNS_VERSION cached"; return; }
  mkdir -p "$out"
  log "building coredns $COREDNS_VERSION (minutes the first time; cached after)"
  local tmp; tmp=$(mktemp -d)
  GOBIN="$tmp" go install -ldflags "$LDFLAGS" "github.com/coredns/coredns@$COREDNS_VERSION" || { rm -rf "$tmp"; return 1; }
  install_bin "$tmp/coredns" "$out/coredns"
  rmdir "$tmp"
}

# The DRA kubelet plugin test double of the real node (hack/dra-test-driver, a module of its own
# pinned to the k8s.io staging modules of K8S_VERSION). Its recipe is the hash of its sources and
# ldflags: an edit of main.go, go.mod or go.sum rebuilds it.
build_dra_test_driver() {
  local src="$ROOT/hack/dra-test-driver" out="$BIN/dra-test-driver-$K8S_VERSION"
  local recipe
  recipe=$( (cat "$src/go.mod" "$src/go.sum" "$src/main.go"; echo "$LDFLAGS") | sha256sum | cut -d' ' -f1)
  fresh "$out" "$recipe" dra-test-driver && { log "dra-test-driver cached in $out"; return; }
  mkdir -p "$out"
  log "building dra-test-driver (hack/dra-test-driver)"
  (cd "$src" && go build -ldflags "$LDFLAGS" -o "$out/dra-test-driver.new" .)
  install_bin "$out/dra-test-driver.new" "$out/dra-test-driver"
  echo "$recipe" > "$out/.recipe"
}

# containerd 1.7 and its runc shim, for a real node whose pods get devices through CDI (Debian
# bookworm's containerd 1.6 has no CDI and drops the CRI field CDIDevices the kubelet fills for DRA
# claims). Built from a small wrapper module, as etcd: containerd's go.mod has an exclude directive,
# which `go install pkg@version` refuses. Without cgo: no btrfs, devmapper, zfs or aufs snapshotter
# (the node uses overlayfs), and no seccomp library (the kubelet asks for no seccomp profile).
build_containerd() {
  local out="$BIN/containerd-$CONTAINERD_VERSION"
  local tags="no_btrfs no_devmapper no_zfs no_aufs"
  # The version stamp of containerd's Makefile (without it: "1.7.29+unknown").
  local flags="$LDFLAGS -X github.com/containerd/containerd/version.Version=$CONTAINERD_VERSION"
  local recipe="$flags tags=$tags"
  fresh "$out" "$recipe" containerd containerd-shim-runc-v2 && { log "containerd $CONTAINERD_VERSION cached"; return; }
  local mod="$CACHE/src/containerd-$CONTAINERD_VERSION"
  mkdir -p "$mod" "$out"
  if [ ! -f "$mod/go.sum" ]; then
    local gomod excludes
    gomod=$(cd "$mod" && go mod download -json "github.com/containerd/containerd@$CONTAINERD_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    excludes=$(grep -E '^exclude ' "$gomod" || true)
    printf 'module gpuplace.local/containerd\n\ngo 1.23.0\n\nrequire github.com/containerd/containerd %s\n\n%s\n' \
      "$CONTAINERD_VERSION" "$excludes" > "$mod/go.mod"
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/containerd/containerd/cmd/containerd"\n\t_ "github.com/containerd/containerd/cmd/containerd-shim-runc-v2"\n)\n' > "$mod/tools.go"
    (cd "$mod" && go mod tidy)
  fi
  log "building containerd $CONTAINERD_VERSION and containerd-shim-runc-v2 (a minute or two; cached after)"
  local b
  for b in containerd containerd-shim-runc-v2; do
    (cd "$mod" && go build -tags "$tags" -ldflags "$flags" -o "$out/$b.new" "github.com/containerd/containerd/cmd/$b")
    install_bin "$out/$b.new" "$out/$b"
  done
  echo "$recipe" > "$out/.recipe"
}

what="${1:-all}"
case "$what" in
  k8s) build_k8s kube-apiserver kube-scheduler kubectl ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  node) build_k8s kubelet kube-proxy kube-controller-manager; build_coredns ;;
  dra) build_dra_test_driver ;;
  containerd) build_containerd ;;
  all) build_etcd; build_k8s kube-apiserver kube-scheduler kubectl; build_helm ;;
  *) echo "usage: $0 [all|k8s|etcd|helm|node|dra|containerd]" >&2; exit 2 ;;
esac
echo "$BIN"
