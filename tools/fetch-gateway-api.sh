#!/usr/bin/env bash
# Fetch the Gateway API CRDs (standard channel: HTTPRoute, Gateway, GatewayClass, ReferenceGrant) from
# the sigs.k8s.io/gateway-api Go module through the Go module proxy (`go mod download`; nothing else
# is downloaded), into ${SLUICEWAY_CACHE:-~/.cache/sluiceway}/gateway-api-<version>/. The operator's
# HTTPRoute tests (tests/operator/test_operator_hold_route.py) install them in the real API server.
# v1.6.3: v1.7.0's module needs Go 1.27. Prints the directory.
# Usage: tools/fetch-gateway-api.sh [--dir]   (--dir: print the directory; exit 1 if not fetched yet)
set -euo pipefail
version=v1.6.3
files="gateway.networking.k8s.io_httproutes.yaml gateway.networking.k8s.io_gateways.yaml
gateway.networking.k8s.io_gatewayclasses.yaml gateway.networking.k8s.io_referencegrants.yaml"
out="${SLUICEWAY_CACHE:-$HOME/.cache/sluiceway}/gateway-api-$version"
ok=1
for f in $files; do [ -s "$out/$f" ] || ok=0; done
if [ "${1:-}" = "--dir" ]; then
  echo "$out"
  [ "$ok" = 1 ] && exit 0
  exit 1
fi
if [ "$ok" = 1 ]; then echo "$out"; exit 0; fi
if ! command -v go >/dev/null 2>&1; then
  echo "fetch-gateway-api.sh: Go is needed to fetch sigs.k8s.io/gateway-api@$version (none on PATH)" >&2
  exit 1
fi
# Outside any module (a module's go.mod would otherwise decide), the toolchain on PATH only.
dir=$(cd "${TMPDIR:-/tmp}" && GOTOOLCHAIN=local GOFLAGS= GO111MODULE=on \
  go mod download -json "sigs.k8s.io/gateway-api@$version" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or ""); sys.exit(1 if d.get("Error") else 0)')
if [ -z "$dir" ] || [ ! -d "$dir/config/crd/standard" ]; then
  echo "fetch-gateway-api.sh: go mod download gave no config/crd/standard for sigs.k8s.io/gateway-api@$version" >&2
  exit 1
fi
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
for f in $files; do cp "$dir/config/crd/standard/$f" "$out.tmp/$f"; done
chmod -R u+w "$out.tmp"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out"
