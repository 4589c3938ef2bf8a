#!/usr/bin/env bash
# Build prometheus and promtool (github.com/prometheus/prometheus cmd/prometheus, cmd/promtool) from
# the Go module in tools/prometheus, once per version and go.sum. Prints the bin directory.
# Why not Debian's package: Debian builds prometheus without Kubernetes service discovery
# (its promtool answers "field kubernetes_sd_configs not found in type config.ScrapeConfig"),
# and the sandbox discovers pods with kubernetes_sd_configs as a real cluster does.
# Usage: tools/build-prometheus.sh [--dir]   (--dir: print the directory; exit 1 if not built yet)
# Cache: ${SLUICEWAY_CACHE:-~/.cache/sluiceway}/prometheus-<version>-<go.mod+go.sum hash>/bin
set -euo pipefail
here=$(cd "$(dirname "$0")/prometheus" && pwd)
version=$(awk '($1=="require" && $2=="github.com/prometheus/prometheus") {print $3; exit}
               ($1=="github.com/prometheus/prometheus" && $2 ~ /^v[0-9]/) {print $2; exit}' "$here/go.mod")
case "$version" in
  v0.*) ;;
  *) echo "build-prometheus.sh: cannot read the github.com/prometheus/prometheus version from $here/go.mod" >&2
     exit 1 ;;
esac
# v0.314.0 is Prometheus 3.14.0 (the Go module's versions are v0.<major*100+minor>.<patch>).
minor=$(echo "$version" | cut -d. -f2); patch=$(echo "$version" | cut -d. -f3)
release="$((minor / 100)).$((minor % 100)).$patch"
sum=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
cache=${SLUICEWAY_CACHE:-$HOME/.cache/sluiceway}
out="$cache/prometheus-$version-$sum/bin"
want="prometheus promtool"
if [ "${1:-}" = "--dir" ]; then
  echo "$out"
  for b in $want; do [ -x "$out/$b" ] || exit 1; done
  exit 0
fi
ok=1
for b in $want; do [ -x "$out/$b" ] || ok=0; done
if [ "$ok" = 1 ]; then echo "$out"; exit 0; fi
mkdir -p "$out.tmp"
V=github.com/prometheus/common/version
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
cd "$here"
echo "build-prometheus.sh: building Prometheus $release (prometheus, promtool; about 12 CPU-minutes cold)" >&2
go build -trimpath -o "$out.tmp/" -ldflags "-s -w -X $V.Version=$release -X $V.Branch=module" \
  github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool >&2
rm -rf "$out"; mv "$out.tmp" "$out"
echo "$out"
