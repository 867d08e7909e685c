#!/usr/bin/env bash
# Install the Debian packages the end-to-end tests' real node runs on (tests/harness/realnode.py):
# containerd, runc, the CNI plugins (/usr/lib/cni), iptables and conntrack for kube-proxy, iproute2
# and util-linux for the network and mount namespaces. Installs only what is missing; needs root.
#
#   hack/install-node-packages.sh
set -euo pipefail

declare -A need=(
  [containerd]=containerd [ctr]=containerd [runc]=runc [iptables]=iptables [conntrack]=conntrack
  [ip]=iproute2 [nsenter]=util-linux [unshare]=util-linux
)
missing=()
for tool in "${!need[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1 || missing+=("${need[$tool]}")
done
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/portmap ] || missing+=(containernetworking-plugins)
[ ${#missing[@]} -eq 0 ] && exit 0

pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ]; then
  echo "install-node-packages: the real node needs root and these Debian packages: $pkgs" >&2
  exit 1
fi
echo "[install-node-packages] apt-get install $pkgs" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
# shellcheck disable=SC2086 # word splitting of the package list is intended
apt-get install -y -q --no-install-recommends $pkgs >/dev/null
