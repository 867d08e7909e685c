#!/usr/bin/env bash
# Put Prometheus' promtool (and prometheus) from Debian's `prometheus` package into the cache,
# extracted only (no service is installed or started). Prints the bin dir.
set -euo pipefail
CACHE="${GPUPLACE_CACHE:-$HOME/.cache/gpuplace}"
if command -v promtool >/dev/null 2>&1; then dirname "$(command -v promtool)"; exit 0; fi
found=$(ls -d "$CACHE"/bin/prometheus-*/usr/bin 2>/dev/null | head -1 || true)
if [ -n "$found" ] && [ -x "$found/promtool" ]; then echo "$found"; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
  apt-get update -qq >/dev/null
  (cd "$tmp" && apt-get download prometheus >/dev/null)
fi
deb=$(ls "$tmp"/prometheus_*.deb)
ver=$(dpkg-deb -f "$deb" Version)
dest="$CACHE/bin/prometheus-$ver"
mkdir -p "$dest"
dpkg-deb -x "$deb" "$dest"
echo "$dest/usr/bin"
