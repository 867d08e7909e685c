#!/usr/bin/env bash
# Build gpuplace's container images offline, without a Docker daemon or a registry, as
# docker-archive tarballs that `ctr -n k8s.io images import FILE` (or `docker load -i FILE`) takes.
#
#   hack/build-images.sh [--wheel FILE] [all|gpuplace|scheduler|pause]...
#
# stdout: one line per image, "REF PATH"; progress goes to stderr. Images are cached by content
# under $GPUPLACE_CACHE (default ~/.cache/gpuplace)/images/: a second run with the same inputs
# prints the same paths and builds nothing.
#
#   gpuplace.local/gpuplace:<version>   the extender and the agent (the chart's image). Debian
#       bookworm's own python3 (mmdebstrap, no apt, no compilers), plus a venv at /opt/gpuplace
#       holding the gpuplace wheel with its dependencies and the "podresources" extra, installed
#       from wheels only, byte-compiled at build time; user 65532 ("nonroot"). The repository's
#       Dockerfile is the same recipe for a Docker daemon. The wheel is built from this tree, or
#       taken from --wheel FILE / $GPUPLACE_WHEEL.
#   gpuplace.local/kube-scheduler:<K8S_VERSION>   the static kube-scheduler that
#       hack/build-control-plane.sh builds, at /usr/local/bin; user 65532.
#   registry.k8s.io/pause:<PAUSE_VERSION>   Kubernetes' build/pause/linux/pause.c of K8S_VERSION,
#       compiled static; containerd's sandbox image. User 65535, entrypoint /pause.
#
# Needs root (mmdebstrap's root mode and chroot) and Debian's mmdebstrap, umoci, skopeo, gcc and
# libc6-dev, which it installs with apt-get when missing. Network: Debian's mirror (the base root
# filesystem, built once per recipe and cached), PyPI (the wheels of gpuplace's dependencies) and
# the Go module proxy (pause.c, kube-scheduler) -- only for what is not cached yet.
#
# Reproducible: the layers' file times are clamped to SOURCE_DATE_EPOCH when set, else to the
# last commit of the wheel's sources (gpuplace) or 0 (kube-scheduler, pause), names are sorted,
# owners numeric, bytecode hash-based; rebuilding with the same base root filesystem and the same
# dependency versions gives the same tarball. Next to each gpuplace tarball, NAME.contents lists its
# Debian packages and Python distributions. The cache keeps the 3 newest tarballs of each image.
set -euo pipefail
umask 022

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
K8S_VERSION="${K8S_VERSION:-v1.34.4}"
PAUSE_VERSION="${PAUSE_VERSION:-3.10}"
CACHE="${GPUPLACE_CACHE:-$HOME/.cache/gpuplace}"
IMAGES="$CACHE/images"
PYTHON="${PYTHON:-python3}"
DEBIAN_SUITE=bookworm
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
# glibc of bookworm: the newest manylinux tag the image's Python can load.
DEBIAN_GLIBC_MINOR=36
REGISTRY=gpuplace.local
# Extras of the wheel installed in the image (the agent's PodResources client needs grpcio).
EXTRAS="podresources"
# Bump a recipe when the way an image is built changes, so that cached tarballs are not reused.
BASE_RECIPE=1
GPUPLACE_RECIPE=2
SCHEDULER_RECIPE=2
PAUSE_RECIPE=2

# The image's user: distroless' "nonroot", as the chart's securityContext runs it.
NONROOT_UID=65532
VENV=/opt/gpuplace
GPUPLACE_PATH="$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GPUPLACE_WORKDIR=/home/nonroot

log() { echo "[build-images] $*" >&2; }
die() { echo "[build-images] error: $*" >&2; exit 1; }

usage() { echo "usage: $0 [--wheel FILE] [all|gpuplace|scheduler|pause]..." >&2; exit 2; }

WHEEL="${GPUPLACE_WHEEL:-}"
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) [ $# -ge 2 ] || usage; WHEEL="$2"; shift 2 ;;
    --wheel=*) WHEEL="${1#--wheel=}"; shift ;;
    all) targets+=(gpuplace scheduler pause); shift ;;
    gpuplace|scheduler|pause) targets+=("$1"); shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(gpuplace scheduler pause)

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap's root mode, chroot, file ownership in the layers)"

# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------

apt_updated=
apt_install() {
  log "installing $* with apt-get"
  if [ -z "$apt_updated" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2
}

ensure_tools() {
  local missing=()
  command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
  [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
  command -v umoci >/dev/null || missing+=(umoci)
  command -v skopeo >/dev/null || missing+=(skopeo)
  command -v flock >/dev/null || missing+=(util-linux)
  command -v gcc >/dev/null || missing+=(gcc)
  [ -f "/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)/libc.a" ] || missing+=(libc6-dev)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
}

ensure_tools
mkdir -p "$IMAGES"
# One build at a time per cache (two test sessions share the tarballs).
exec 9>"$IMAGES/.lock"
flock 9

WORK="$(mktemp -d "$IMAGES/.work.XXXXXX")"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

sha() { sha256sum | cut -c1-"${1:-16}"; }
iso_date() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ; }

# layer_tar DIR OUT EPOCH PATH...: a reproducible layer of DIR's PATHs (names sorted, numeric
# owners, mtimes clamped to EPOCH, no atime/ctime).
layer_tar() {
  local dir="$1" out="$2" epoch="$3"; shift 3
  tar -C "$dir" --create --file "$out" --sort=name --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --mtime="@$epoch" --clamp-mtime "$@"
}

# pack NAME REF OUT EPOCH CONFIG-ARGS -- "CREATED-BY=LAYER"...: an OCI image of those layers in
# order, with that config, written as a docker-archive tarball OUT tagged REF.
pack() {
  local name="$1" ref="$2" out="$3" epoch="$4"; shift 4
  local config=()
  while [ "$1" != "--" ]; do config+=("$1"); shift; done
  shift
  local created; created=$(iso_date "$epoch")
  local oci="$WORK/oci-$name"
  rm -rf "$oci"
  umoci init --layout "$oci"
  umoci new --image "$oci:$name"
  local spec
  for spec in "$@"; do
    umoci raw add-layer --image "$oci:$name" --history.created "$created" \
      --history.created_by "${spec%=*}" "${spec##*=}"
  done
  umoci config --image "$oci:$name" --no-history --created "$created" \
    --os linux --architecture amd64 "${config[@]}"
  rm -f "$out.tmp"
  skopeo --insecure-policy copy --quiet "oci:$oci:$name" "docker-archive:$out.tmp:$ref" >&2
  mv -f "$out.tmp" "$out"
}

# prune GLOB KEEP: remove all but the KEEP newest files matching GLOB (with their .contents and
# .packages notes), so that a cache rebuilt at every change of the sources stays bounded.
prune() {
  local keep="$2" f
  # shellcheck disable=SC2086
  ls -t $1 2>/dev/null | tail -n +"$((keep + 1))" | while read -r f; do
    log "pruning $f"
    rm -f "$f" "${f%.tar}.contents" "$f.packages"
  done
}

# elf_static FILE: true when FILE is an ELF executable without a program interpreter.
elf_static() {
  "$PYTHON" - "$1" <<'PY'
import struct, sys
with open(sys.argv[1], "rb") as f:
    data = f.read()
if data[:4] != b"\x7fELF" or data[4] != 2:
    sys.exit(1)
phoff, = struct.unpack_from("<Q", data, 0x20)
phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
for i in range(phnum):
    (p_type,) = struct.unpack_from("<I", data, phoff + i * phentsize)
    if p_type == 3:  # PT_INTERP: dynamically linked
        sys.exit(1)
PY
}

# ---------------------------------------------------------------------------------------------
# Base root filesystem: Debian bookworm's essential packages and python3, no apt, no docs
# ---------------------------------------------------------------------------------------------

BASE_OPTS=(
  --variant=essential
  # libstdc++6: manylinux wheels may link it (grpcio, frozenlist) and expect the system to have it.
  --include=python3,libstdc++6
  # /bin, /lib... as symlinks set up directly, instead of the usrmerge package (which pulls perl).
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  # The container runtime provides /dev.
  --skip=output/dev
)
BASE_SOURCES=(
  "deb $DEBIAN_MIRROR $DEBIAN_SUITE main"
  "deb $DEBIAN_MIRROR $DEBIAN_SUITE-updates main"
  "deb $DEBIAN_SECURITY_MIRROR $DEBIAN_SUITE-security main"
)

# ensure_base: sets BASE_TAR (the root filesystem tarball) and BASE_KEY, building it if needed.
ensure_base() {
  BASE_KEY=$(printf '%s\n' "base-$BASE_RECIPE" "$DEBIAN_SUITE" "${BASE_OPTS[@]}" "${BASE_SOURCES[@]}" | sha)
  BASE_TAR="$IMAGES/base/debian-$DEBIAN_SUITE-python3-$BASE_KEY.tar"
  if [ -f "$BASE_TAR" ] && [ -f "$BASE_TAR.packages" ]; then
    log "base root filesystem cached: $BASE_TAR"
    return
  fi
  mkdir -p "$IMAGES/base"
  log "building the base root filesystem with mmdebstrap (Debian $DEBIAN_SUITE, python3; about a minute)"
  local t0=$SECONDS
  rm -f "$BASE_TAR.tmp"
  mmdebstrap --quiet --format=tar "${BASE_OPTS[@]}" \
    --customize-hook="chroot \"\$1\" dpkg-query -W -f '\${Package}=\${Version}\n' > '$WORK/packages'" \
    --customize-hook='rm -f "$1"/var/log/dpkg.log "$1"/var/log/alternatives.log "$1"/var/log/apt/*.log "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old "$1"/var/cache/ldconfig/aux-cache' \
    "$DEBIAN_SUITE" "$BASE_TAR.tmp" "${BASE_SOURCES[@]}" > "$WORK/mmdebstrap.log" 2>&1 ||
    { tail -n 40 "$WORK/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
  mv -f "$WORK/packages" "$BASE_TAR.packages"
  mv -f "$BASE_TAR.tmp" "$BASE_TAR"
  prune "$IMAGES/base/debian-*.tar" 2
  log "base root filesystem built in $((SECONDS - t0)) s: $BASE_TAR ($(du -m "$BASE_TAR" | cut -f1) MB)"
}

# ---------------------------------------------------------------------------------------------
# gpuplace
# ---------------------------------------------------------------------------------------------

# The files the wheel is built from; the Dockerfile copies the same ones. Not testing/ (the
# gpuplace-testing distribution, the test doubles): the image holds the product wheel only.
WHEEL_SOURCES=(pyproject.toml README.md LICENSE scheduler_extender node_agent)

# The wheel the test suite installs and tests (tests/harness/artifacts.py: from a clean copy of the
# files the wheel is built from, cached by their content under $CACHE/wheels).
build_wheel() {
  log "building the gpuplace wheel from $ROOT"
  WHEEL=$(cd "$ROOT" && "$PYTHON" -m tests.harness.artifacts wheel "$CACHE/wheels")
}

# wheel_info WHEEL: "VERSION DIGEST", the digest over the wheel's member names and contents
# (not its zip timestamps), so that a rebuilt identical wheel hits the cache.
wheel_info() {
  "$PYTHON" - "$1" <<'PY'
import hashlib, sys, zipfile
h = hashlib.sha256()
with zipfile.ZipFile(sys.argv[1]) as z:
    version = None
    for name in sorted(z.namelist()):
        data = z.read(name)
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
        if name.endswith(".dist-info/METADATA"):
            for line in data.decode().splitlines():
                if line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
if not version:
    sys.exit("no Version in the wheel's METADATA")
print(version, h.hexdigest()[:16])
PY
}

source_epoch() {
  if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then echo "$SOURCE_DATE_EPOCH"; return; fi
  git -C "$ROOT" log -1 --format=%ct -- "${WHEEL_SOURCES[@]}" 2>/dev/null | grep . || echo 0
}

build_gpuplace() {
  ensure_base
  local t0=$SECONDS
  if [ -n "$WHEEL" ]; then
    [ -f "$WHEEL" ] || die "wheel not found: $WHEEL"
    WHEEL="$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")"
    log "using the wheel $WHEEL"
  else
    build_wheel
  fi
  local version digest
  read -r version digest < <(wheel_info "$WHEEL")
  local epoch; epoch=$(source_epoch)
  local constraints=""
  [ -z "${PIP_CONSTRAINT:-}" ] || constraints=$(cat $PIP_CONSTRAINT | sha)  # pip download reads it too
  local key
  key=$(printf '%s\n' "gpuplace-$GPUPLACE_RECIPE" "$BASE_KEY" "$digest" "$EXTRAS" "$constraints" "$epoch" | sha)
  local ref="$REGISTRY/gpuplace:$version"
  local out="$IMAGES/gpuplace-$version-$key.tar"
  if [ -f "$out" ]; then
    log "$ref cached: $out"
    echo "$ref $out"
    return
  fi
  log "building $ref (wheel digest $digest, SOURCE_DATE_EPOCH $epoch)"

  # The dependencies' wheels, for the image's interpreter (Debian's CPython) and glibc.
  local pyver
  pyver=$(sed -n 's/^python3\.[0-9]*-minimal=\([0-9.]*\).*/\1/p' "$BASE_TAR.packages")
  [ -n "$pyver" ] || die "no python3.X-minimal in $BASE_TAR.packages"
  local platforms=() m
  for m in $(seq "$DEBIAN_GLIBC_MINOR" -1 17); do platforms+=(--platform "manylinux_2_${m}_x86_64"); done
  platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
  local wheels="$WORK/wheels"
  mkdir -p "$wheels"
  cp "$WHEEL" "$wheels/"
  local wheel_name; wheel_name=$(basename "$WHEEL")
  log "downloading wheels of the dependencies for CPython $pyver, manylinux x86_64 (PyPI)"
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --dest "$wheels" \
    --only-binary=:all: --implementation cp --python-version "$pyver" --abi "cp$(echo "$pyver" | cut -d. -f1,2 | tr -d .)" \
    "${platforms[@]}" "$wheels/$wheel_name[$EXTRAS]" >&2
  # The installer: pip runs from its own wheel, so that no pip is left in the image.
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$WORK/pip" pip >&2
  local pip_whl; pip_whl=$(ls "$WORK"/pip/pip-*.whl)

  local rootfs="$WORK/rootfs"
  mkdir -p "$rootfs"
  tar -C "$rootfs" --numeric-owner -xpf "$BASE_TAR"
  local run_in=(chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8)
  "${run_in[@]}" /usr/bin/python3 -m venv --without-pip "$VENV"
  # /wheels and /pip, as in the Dockerfile: the wheel's path is recorded in its direct_url.json.
  mkdir -p "$rootfs/wheels" "$rootfs/pip"
  cp "$wheels"/*.whl "$rootfs/wheels/"
  cp "$pip_whl" "$rootfs/pip/"
  log "installing $wheel_name[$EXTRAS] into $VENV"
  "${run_in[@]}" "$VENV/bin/python" "/pip/$(basename "$pip_whl")/pip" install \
    --quiet --no-index --find-links /wheels --no-cache-dir --no-compile \
    --disable-pip-version-check --no-warn-script-location "/wheels/$wheel_name[$EXTRAS]" >&2
  rm -rf "$rootfs/wheels" "$rootfs/pip"
  # Bytecode for every module, checked against the source's hash rather than its mtime, so that
  # a read-only root filesystem needs no writes whatever the layers' mtimes. -q -q: a few
  # non-module .py files in packages do not compile; they are never imported.
  log "byte-compiling $VENV"
  "${run_in[@]}" "$VENV/bin/python" -m compileall -q -q --invalidation-mode checked-hash \
    "$VENV/lib" >&2 || true
  "${run_in[@]}" "$VENV/bin/python" - > "$WORK/distributions" <<'PY'
import importlib.metadata as md
for d in sorted(md.distributions(), key=lambda d: d.metadata["Name"].lower()):
    print(f"{d.metadata['Name']}=={d.version}")
PY
  echo "nonroot:x:$NONROOT_UID:$NONROOT_UID:nonroot:/home/nonroot:/usr/sbin/nologin" >> "$rootfs/etc/passwd"
  echo "nonroot:x:$NONROOT_UID:" >> "$rootfs/etc/group"
  install -d -m 0755 -o "$NONROOT_UID" -g "$NONROOT_UID" "$rootfs/home/nonroot"
  install -d -m 0755 "$rootfs/dev"
  layer_tar "$rootfs" "$WORK/app.tar" "$epoch" ./dev ./etc/group ./etc/passwd ./home/nonroot ".$VENV"

  pack gpuplace "$ref" "$out" "$epoch" \
    --config.user "$NONROOT_UID:$NONROOT_UID" \
    --config.env "PATH=$GPUPLACE_PATH" \
    --config.env PYTHONDONTWRITEBYTECODE=1 \
    --config.env PYTHONUNBUFFERED=1 \
    --config.env LANG=C.UTF-8 \
    --config.workingdir "$GPUPLACE_WORKDIR" \
    --config.cmd gpuplace-extender --config.cmd --help \
    -- \
    "mmdebstrap --variant=essential --include=python3,libstdc++6 $DEBIAN_SUITE=$BASE_TAR" \
    "python3 -m venv $VENV; pip install $wheel_name[$EXTRAS]; compileall; user nonroot=$WORK/app.tar"
  { cat "$BASE_TAR.packages" | sed 's/^/deb /'; sed 's/^/python /' "$WORK/distributions"; } > "${out%.tar}.contents"
  log "built $ref in $((SECONDS - t0)) s: $out ($(du -m "$out" | cut -f1) MB)"
  prune "$IMAGES/gpuplace-*.tar" 3
  echo "$ref $out"
}

# ---------------------------------------------------------------------------------------------
# kube-scheduler
# ---------------------------------------------------------------------------------------------

# Files every small image carries: users root and nonroot, and hosts lookups in /etc/hosts first.
minimal_etc() {
  local dir="$1"
  install -d -m 0755 "$dir" "$dir/etc"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/home/nonroot:/sbin/nologin\n' \
    "$NONROOT_UID" "$NONROOT_UID" > "$dir/etc/passwd"
  printf 'root:x:0:\nnonroot:x:%s:\n' "$NONROOT_UID" > "$dir/etc/group"
  printf 'hosts: files dns\n' > "$dir/etc/nsswitch.conf"
  chmod 0644 "$dir/etc/passwd" "$dir/etc/group" "$dir/etc/nsswitch.conf"
  install -d -m 1777 "$dir/tmp"
}

build_scheduler() {
  local bin="$CACHE/bin/k8s-$K8S_VERSION/kube-scheduler"
  if [ ! -x "$bin" ]; then
    log "kube-scheduler $K8S_VERSION not built yet: running hack/build-control-plane.sh k8s"
    # The lock tests.harness.controlplane.ensure_binaries takes: never two builds at once.
    flock "$CACHE/.build.lock" env K8S_VERSION="$K8S_VERSION" bash "$ROOT/hack/build-control-plane.sh" k8s >/dev/null
  fi
  [ -x "$bin" ] || die "no $bin after hack/build-control-plane.sh k8s"
  elf_static "$bin" || die "$bin is not a static executable (the image has no libc)"
  local epoch="${SOURCE_DATE_EPOCH:-0}"
  local key; key=$(printf '%s\n' "scheduler-$SCHEDULER_RECIPE" "$(sha256sum < "$bin")" "$epoch" | sha)
  local ref="$REGISTRY/kube-scheduler:$K8S_VERSION"
  local out="$IMAGES/kube-scheduler-$K8S_VERSION-$key.tar"
  if [ -f "$out" ]; then
    log "$ref cached: $out"
    echo "$ref $out"
    return
  fi
  local t0=$SECONDS
  local dir="$WORK/scheduler"
  minimal_etc "$dir"
  install -D -m 0755 "$bin" "$dir/usr/local/bin/kube-scheduler"
  layer_tar "$dir" "$WORK/scheduler.tar" "$epoch" .
  pack kube-scheduler "$ref" "$out" "$epoch" \
    --config.user "$NONROOT_UID:$NONROOT_UID" \
    --config.env PATH=/usr/local/bin:/usr/bin:/bin \
    --config.workingdir / \
    --config.cmd kube-scheduler \
    -- \
    "kube-scheduler $K8S_VERSION (hack/build-control-plane.sh, CGO_ENABLED=0)=$WORK/scheduler.tar"
  log "built $ref in $((SECONDS - t0)) s: $out ($(du -m "$out" | cut -f1) MB)"
  prune "$IMAGES/kube-scheduler-*.tar" 3
  echo "$ref $out"
}

# ---------------------------------------------------------------------------------------------
# pause
# ---------------------------------------------------------------------------------------------

build_pause() {
  local modcache; modcache=$(go env GOMODCACHE)
  local src="$modcache/k8s.io/kubernetes@$K8S_VERSION/build/pause/linux/pause.c"
  if [ ! -f "$src" ]; then
    log "downloading k8s.io/kubernetes@$K8S_VERSION (Go module proxy) for pause.c"
    (cd "$WORK" && GOFLAGS=-mod=mod go mod download "k8s.io/kubernetes@$K8S_VERSION") >&2
  fi
  [ -f "$src" ] || die "no $src"
  local dir="$WORK/pause"
  install -d -m 0755 "$dir"
  # As Kubernetes' build/pause/Makefile does (VERSION there is v$(TAG)-$(git describe)).
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-$K8S_VERSION" -o "$dir/pause" "$src"
  strip "$dir/pause"
  elf_static "$dir/pause" || die "pause is not static"
  local epoch="${SOURCE_DATE_EPOCH:-0}"
  local key; key=$(printf '%s\n' "pause-$PAUSE_RECIPE" "$(sha256sum < "$dir/pause")" "$epoch" | sha)
  local ref="registry.k8s.io/pause:$PAUSE_VERSION"
  local out="$IMAGES/pause-$PAUSE_VERSION-$key.tar"
  if [ -f "$out" ]; then
    log "$ref cached: $out"
    echo "$ref $out"
    return
  fi
  layer_tar "$dir" "$WORK/pause.tar" "$epoch" .
  pack pause "$ref" "$out" "$epoch" \
    --config.user 65535:65535 \
    --config.entrypoint /pause \
    -- \
    "gcc -Os -static pause.c of k8s.io/kubernetes@$K8S_VERSION=$WORK/pause.tar"
  log "built $ref: $out"
  prune "$IMAGES/pause-*.tar" 3
  echo "$ref $out"
}

for t in "${targets[@]}"; do
  case "$t" in
    gpuplace) build_gpuplace ;;
    scheduler) build_scheduler ;;
    pause) build_pause ;;
  esac
done
