#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler and etcd from the Go
# module in tools/kube, once per version and go.sum. Prints the bin directory.
# Usage: tools/build-kube.sh [--dir]
# Cache: ${SLUICEWAY_CACHE:-~/.cache/sluiceway}/kube-<version>-<go.sum hash>/bin
set -euo pipefail
here=$(cd "$(dirname "$0")/kube" && pwd)
# Both forms: `require k8s.io/kubernetes vX` and a line inside a `require (...)` block.
version=$(awk '($1=="require" && $2=="k8s.io/kubernetes") {print $3; exit}
               ($1=="k8s.io/kubernetes" && $2 ~ /^v[0-9]/) {print $2; exit}' "$here/go.mod")
case "$version" in
  v1.*) ;;
  *) echo "build-kube.sh: cannot read the k8s.io/kubernetes version from $here/go.mod" >&2; exit 1 ;;
esac
# Content hash only (not the checkout path), so every clone shares the cache.
sum=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
cache=${SLUICEWAY_CACHE:-$HOME/.cache/sluiceway}
out="$cache/kube-$version-$sum/bin"
want="kube-apiserver kube-controller-manager kube-scheduler etcd"
# --dir: print the bin directory and exit 0 if it is complete, 1 if not; never builds.
if [ "${1:-}" = "--dir" ]; then
  echo "$out"
  for b in $want; do [ -x "$out/$b" ] || exit 1; done
  exit 0
fi
ok=1
for b in $want; do [ -x "$out/$b" ] || ok=0; done
if [ "$ok" = 1 ]; then echo "$out"; exit 0; fi
mkdir -p "$out.tmp"
minor=$(echo "$version" | cut -d. -f2)
P=k8s.io/component-base/version
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
cd "$here"
go build -trimpath -o "$out.tmp/" \
  -ldflags "-s -w -X $P.gitVersion=$version -X $P.gitMajor=1 -X $P.gitMinor=$minor -X $P.gitTreeState=clean" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler >&2
go build -trimpath -o "$out.tmp/etcd" -ldflags "-s -w" go.etcd.io/etcd/server/v3 >&2
rm -rf "$out"; mv "$out.tmp" "$out"
echo "$out"
