#!/usr/bin/env bash
# Build the chart's test tools from the Go module proxy, cached by version outside the repo:
#
#   ct             chart-testing's `ct lint` (helm/chart-testing), with its own etc/chart_schema.yaml
#                  and etc/lintconf.yaml next to it (ct's defaults, which it otherwise looks for in
#                  ./, ~/.ct and /etc/ct)
#   helm-unittest  the helm-unittest plugin: `untt` plus its plugin.yaml, laid out as a Helm
#                  plugin directory (HELM_PLUGINS=<dir>/plugins makes `helm unittest` work); the
#                  binary also runs on its own: `untt -f 'tests/*_test.yaml' CHART`
#   crds           the CustomResourceDefinitions the chart's optional objects need, from the
#                  projects' own Go modules: prometheus-operator (ServiceMonitor, PodMonitor,
#                  PrometheusRule) and cert-manager (Certificate, Issuer, ...)
#
#   hack/install-chart-tools.sh [all|ct|helm-unittest|crds]   # build what is missing, print the bin dir
#
# Layout: $GPUPLACE_CACHE (default ~/.cache/gpuplace)/bin/ct-<ver>/{ct,etc/}
#         .../bin/helm-unittest-<ver>/plugins/unittest/{untt,plugin.yaml}
#         .../crds/prometheus-operator-<ver>/*.yaml, .../crds/cert-manager-<ver>/*.yaml
# ct needs helm, yamllint and yamale on PATH (hack/build-control-plane.sh helm; the test extra of
# pyproject.toml). Versions: the newest tags the module proxy serves (it refuses chart-testing's
# version list, @v/list; v3.14.0 is the newest v3 tag it answers for).
set -euo pipefail

CT_VERSION="${CT_VERSION:-v3.14.0}"
HELM_UNITTEST_VERSION="${HELM_UNITTEST_VERSION:-v1.1.2}"
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
CERT_MANAGER_VERSION="${CERT_MANAGER_VERSION:-v1.21.2}"
CACHE="${GPUPLACE_CACHE:-$HOME/.cache/gpuplace}"
BIN="$CACHE/bin"
export GOFLAGS="-buildvcs=false -trimpath"
export CGO_ENABLED=0
LDFLAGS="-s -w"

log() { echo "[install-chart-tools] $*" >&2; }

# module_dir MODULE@VERSION: download the module (from the proxy, or the module cache) and print
# its directory. A scratch module, so that no go.mod of the repository is touched.
module_dir() {
  local tmp; tmp=$(mktemp -d)
  (cd "$tmp" && go mod init gpuplace.local/fetch >/dev/null 2>&1 &&
    go mod download -json "$1") | python3 -c '
import json, sys
d = json.load(sys.stdin)
if d.get("Error") or not d.get("Dir"):
    sys.exit("go mod download %s: %s" % (sys.argv[1], d.get("Error")))
print(d["Dir"])' "$1"
  rm -rf "$tmp"
}

# fresh DIR RECIPE FILE...: true when every file exists and DIR was made with RECIPE.
fresh() {
  local out="$1" recipe="$2"; shift 2
  [ "$(cat "$out/.recipe" 2>/dev/null)" = "$recipe" ] || return 1
  for f in "$@"; do [ -e "$out/$f" ] || return 1; done
}

# Both tools are built inside their own module directory (its go.mod and go.sum pin every
# dependency), as their Makefiles do, rather than with `go install module@version`: helm-unittest's
# go.mod has a replace directive, which `go install` refuses, and `go install` also reads the
# module's version list (@v/list) to check for deprecation, which a proxy that serves only pinned
# versions answers with 403.
build_ct() {
  local out="$BIN/ct-$CT_VERSION"
  local flags="$LDFLAGS -X github.com/helm/chart-testing/v3/ct/cmd.Version=$CT_VERSION"
  fresh "$out" "$flags" ct etc/chart_schema.yaml etc/lintconf.yaml && { log "ct $CT_VERSION cached"; return; }
  log "building ct $CT_VERSION (about 30 s on 2 cores with an empty Go build cache)"
  local src tmp; src=$(module_dir "github.com/helm/chart-testing/v3@$CT_VERSION")
  tmp=$(mktemp -d)
  (cd "$src" && go build -mod=readonly -ldflags "$flags" -o "$tmp/ct" ./ct)
  mkdir -p "$out/etc"
  cp "$src/etc/chart_schema.yaml" "$src/etc/lintconf.yaml" "$out/etc/"
  chmod u+w "$out/etc/"*
  mv -f "$tmp/ct" "$out/ct"
  rmdir "$tmp"
  echo "$flags" > "$out/.recipe"
}

build_helm_unittest() {
  local out="$BIN/helm-unittest-$HELM_UNITTEST_VERSION"
  local plugin="$out/plugins/unittest"
  local flags="$LDFLAGS -X github.com/helm-unittest/helm-unittest/internal/build.version=${HELM_UNITTEST_VERSION#v}"
  fresh "$out" "$flags" plugins/unittest/untt plugins/unittest/plugin.yaml && { log "helm-unittest $HELM_UNITTEST_VERSION cached"; return; }
  log "building helm-unittest $HELM_UNITTEST_VERSION (about a minute on 2 cores with an empty Go build cache)"
  local src tmp; src=$(module_dir "github.com/helm-unittest/helm-unittest@$HELM_UNITTEST_VERSION")
  tmp=$(mktemp -d)
  (cd "$src" && go build -mod=readonly -ldflags "$flags" -o "$tmp/untt" ./cmd/helm-unittest)
  mkdir -p "$plugin"
  # The release's plugin.yaml names a binary per platform (untt-linux-amd64, ...); this build has
  # one, so the plugin runs $HELM_PLUGIN_DIR/untt everywhere. Helm's install hooks (which would
  # download a release) are left out.
  { awk '/^(platformCommand|platformHooks|hooks):/ {exit} {print}' "$src/plugin.yaml"
    echo 'command: "$HELM_PLUGIN_DIR/untt"'; } > "$tmp/plugin.yaml"
  mv -f "$tmp/untt" "$plugin/untt"
  mv -f "$tmp/plugin.yaml" "$plugin/plugin.yaml"
  rmdir "$tmp"
  echo "$flags" > "$out/.recipe"
}

# copy_crds SRC_DIR DEST GLOB...: the CRD documents among SRC_DIR/GLOB, one file each.
copy_crds() {
  local src="$1" dest="$2"; shift 2
  local tmp; tmp=$(mktemp -d)
  local n=0 f
  for pattern in "$@"; do
    for f in $src/$pattern; do
      [ -f "$f" ] || continue
      grep -q '^kind: CustomResourceDefinition' "$f" || continue
      cp "$f" "$tmp/"; n=$((n + 1))
    done
  done
  [ "$n" -gt 0 ] || { log "no CRDs in $src/$*"; rm -rf "$tmp"; return 1; }
  chmod 0644 "$tmp"/*; chmod 0755 "$tmp"
  rm -rf "$dest"; mkdir -p "$(dirname "$dest")"; mv "$tmp" "$dest"
  log "$n CRDs in $dest"
}

# prometheus-operator's module ships the CRDs the operator installs, one file per kind, in
# example/prometheus-operator-crd-full/ (with descriptions; example/prometheus-operator-crd/ has
# the same schemas without them).
fetch_crds() {
  local po="$CACHE/crds/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
  if ls "$po"/*.yaml >/dev/null 2>&1; then log "prometheus-operator $PROMETHEUS_OPERATOR_VERSION CRDs cached"
  else
    local src; src=$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")
    copy_crds "$src/example/prometheus-operator-crd-full" "$po" "*.yaml"
  fi
  local cm="$CACHE/crds/cert-manager-$CERT_MANAGER_VERSION"
  if ls "$cm"/*.yaml >/dev/null 2>&1; then log "cert-manager $CERT_MANAGER_VERSION CRDs cached"
  else
    local src; src=$(module_dir "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION")
    copy_crds "$src/deploy/crds" "$cm" "*.yaml"
  fi
}

what="${1:-all}"
case "$what" in
  ct) build_ct ;;
  helm-unittest) build_helm_unittest ;;
  crds) fetch_crds ;;
  all) build_ct; build_helm_unittest; fetch_crds ;;
  *) echo "usage: $0 [all|ct|helm-unittest|crds]" >&2; exit 2 ;;
esac
echo "$BIN"
