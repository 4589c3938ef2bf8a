#!/usr/bin/env bash
# Build helm from the Go module in tools/helm, once per go.mod/go.sum. Prints the bin directory.
# Usage: tools/build-helm.sh [--dir]   (--dir: print the directory; exit 1 if helm is not built)
# Cache: ${SLUICEWAY_CACHE:-~/.cache/sluiceway}/helm-<version>-<content hash>/bin
set -euo pipefail
here=$(cd "$(dirname "$0")/helm" && pwd)
version=$(awk '($1=="require" && $2=="helm.sh/helm/v3") {print $3; exit}
               ($1=="helm.sh/helm/v3" && $2 ~ /^v[0-9]/) {print $2; exit}' "$here/go.mod")
case "$version" in
  v3.*) ;;
  *) echo "build-helm.sh: cannot read the helm.sh/helm/v3 version from $here/go.mod" >&2; exit 1 ;;
esac
sum=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
cache=${SLUICEWAY_CACHE:-$HOME/.cache/sluiceway}
out="$cache/helm-$version-$sum/bin"
if [ "${1:-}" = "--dir" ]; then
  echo "$out"
  [ -x "$out/helm" ] || exit 1
  exit 0
fi
if [ -x "$out/helm" ]; then echo "$out"; exit 0; fi
mkdir -p "$out.tmp"
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
cd "$here"
go build -trimpath -o "$out.tmp/helm" \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version" helm.sh/helm/v3/cmd/helm >&2
rm -rf "$out"; mv "$out.tmp" "$out"
echo "$out"
