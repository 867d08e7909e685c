#!/usr/bin/env bash
# Build the real control plane (kube-apiserver, kube-scheduler, kubectl, etcd) and Helm
# from the Go module proxy, cached by version outside the repo.
#
#   hack/build-control-plane.sh            # build what is missing, print the bin dir
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
CACHE="${GPUPLACE_CACHE:-$HOME/.cache/gpuplace}"
BIN="$CACHE/bin"
export GOFLAGS="-buildvcs=false -trimpath"
export CGO_ENABLED=0
LDFLAGS="-s -w"

log() { echo "[build-control-plane] $*" >&2; }

build_k8s() {
  local out="$BIN/k8s-$K8S_VERSION"
  local want=(kube-apiserver kube-scheduler kubectl)
  local missing=()
  for b in "${want[@]}"; do [ -x "$out/$b" ] || missing+=("$b"); done
  [ ${#missing[@]} -eq 0 ] && { log "k8s $K8S_VERSION cached in $out"; return; }
  local mod="$CACHE/src/k8s-$K8S_VERSION"
  mkdir -p "$mod" "$out"
  local staging_minor="v0.${K8S_VERSION#v1.}"
  if [ ! -f "$mod/go.sum" ]; then
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
    cat > "$mod/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    (cd "$mod" && go mod tidy -e >/dev/null 2>&1 || true; cd "$mod" && go mod download)
  fi
  for b in "${missing[@]}"; do
    log "building $b $K8S_VERSION (first build takes minutes on 2 cores; cached after)"
    (cd "$mod" && go build -ldflags "$LDFLAGS" -o "$out/$b" "k8s.io/kubernetes/cmd/$b")
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
  [ -x "$out/helm" ] && { log "helm $HELM_VERSION cached"; return; }
  mkdir -p "$out"
  log "building helm $HELM_VERSION"
  GOBIN="$out" go install -ldflags "$LDFLAGS" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

what="${1:-all}"
case "$what" in
  k8s) build_k8s ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  all) build_etcd; build_k8s; build_helm ;;
  *) echo "usage: $0 [all|k8s|etcd|helm]" >&2; exit 2 ;;
esac
echo "$BIN"
