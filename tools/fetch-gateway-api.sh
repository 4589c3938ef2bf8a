#!/usr/bin/env bash
# Fetch the Gateway API's standard CRDs (GatewayClass, Gateway, HTTPRoute, ReferenceGrant) from the
# sigs.k8s.io/gateway-api Go module (the module proxy; nothing is built) into the shared cache, once
# per version. The operator's HTTPRoute test installs them into its API server. Prints the directory.
# Usage: tools/fetch-gateway-api.sh [--dir]   (--dir: print the directory; exit 1 if not fetched yet)
set -euo pipefail
version=v1.6.3  # the newest that Go 1.26 accepts (v1.7.0 needs Go 1.27)
dir="${SLUICEWAY_CACHE:-$HOME/.cache/sluiceway}/gateway-api-$version"
crds="gatewayclasses gateways httproutes referencegrants"
if [ -f "$dir/gateway.networking.k8s.io_httproutes.yaml" ]; then echo "$dir"; exit 0; fi
if [ "${1:-}" = "--dir" ]; then echo "$dir"; exit 1; fi
if ! command -v go >/dev/null 2>&1; then
  echo "fetch-gateway-api.sh: go is needed to download sigs.k8s.io/gateway-api@$version from the module proxy" >&2
  exit 1
fi
src=$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/gateway-api@$version" \
  | awk -F'"' '$2=="Dir" {print $4}')
if [ -z "$src" ] || [ ! -d "$src/config/crd/standard" ]; then
  echo "fetch-gateway-api.sh: go mod download gave no module directory for sigs.k8s.io/gateway-api@$version" >&2
  exit 1
fi
mkdir -p "$dir.tmp"
for c in $crds; do cp "$src/config/crd/standard/gateway.networking.k8s.io_$c.yaml" "$dir.tmp/"; done
rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "$dir"
