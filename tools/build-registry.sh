#!/usr/bin/env bash
# Build the OCI registry (github.com/distribution/distribution/v3 cmd/registry, "registry:3") from
# the Go module in tools/registry, once per version and go.sum (cache: tools/cache.sh). The oci://
# fetch tests (tests/pod/test_fetch_oci.py) run it on loopback with its filesystem storage and
# htpasswd auth. Prints the bin directory.
# Usage: tools/build-registry.sh [--dir]   (--dir: print the directory; exit 1 if not built yet)
set -euo pipefail
. "$(dirname "$0")/cache.sh"
here=$(cd "$(dirname "$0")/registry" && pwd)
version=$(module_version "$here" github.com/distribution/distribution/v3)
case "$version" in
  v3.*) ;;
  *) echo "build-registry.sh: cannot read the github.com/distribution/distribution/v3 version from $here/go.mod" >&2
     exit 1 ;;
esac
out=$(cache_bin registry "$version" "$here")
cache_lookup "$out" "${1:-}" registry
cd "$here"
echo "build-registry.sh: building registry $version (about 3 CPU-minutes cold)" >&2
go build -trimpath -o "$out.tmp/registry" \
  -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$version" \
  github.com/distribution/distribution/v3/cmd/registry >&2
cache_commit "$out"
