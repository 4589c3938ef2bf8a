#!/usr/bin/env bash
# Build KEDA's operator and metrics adapter (github.com/kedacore/keda/v2 cmd/operator, cmd/adapter)
# from the Go module in tools/keda, once per version and go.sum. Prints the bin directory.
# Usage: tools/build-keda.sh [--dir]   (--dir: print the directory; exit 1 if not built yet)
# Cache: ${SLUICEWAY_CACHE:-~/.cache/sluiceway}/keda-<version>-<go.mod+go.sum hash>/bin
# Binaries: keda-operator, keda-adapter (KEDA's admission webhooks are not built: optional).
set -euo pipefail
here=$(cd "$(dirname "$0")/keda" && pwd)
version=$(awk '($1=="require" && $2=="github.com/kedacore/keda/v2") {print $3; exit}
               ($1=="github.com/kedacore/keda/v2" && $2 ~ /^v[0-9]/) {print $2; exit}' "$here/go.mod")
case "$version" in
  v2.*) ;;
  *) echo "build-keda.sh: cannot read the github.com/kedacore/keda/v2 version from $here/go.mod" >&2; exit 1 ;;
esac
# Content hash only (not the checkout path), so every clone shares the cache.
sum=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
cache=${SLUICEWAY_CACHE:-$HOME/.cache/sluiceway}
out="$cache/keda-$version-$sum/bin"
want="keda-operator keda-adapter"
if [ "${1:-}" = "--dir" ]; then
  echo "$out"
  for b in $want; do [ -x "$out/$b" ] || exit 1; done
  exit 0
fi
ok=1
for b in $want; do [ -x "$out/$b" ] || ok=0; done
if [ "$ok" = 1 ]; then echo "$out"; exit 0; fi
mkdir -p "$out.tmp"
P=github.com/kedacore/keda/v2/version
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
cd "$here"
echo "build-keda.sh: building KEDA $version (operator, then adapter; about 18 CPU-minutes cold)" >&2
go build -trimpath -o "$out.tmp/keda-operator" -ldflags "-s -w -X $P.Version=$version" \
  github.com/kedacore/keda/v2/cmd/operator >&2
go build -trimpath -o "$out.tmp/keda-adapter" -ldflags "-s -w -X $P.Version=$version" \
  github.com/kedacore/keda/v2/cmd/adapter >&2
rm -rf "$out"; mv "$out.tmp" "$out"
echo "$out"
