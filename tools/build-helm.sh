#!/usr/bin/env bash
# Build helm from the Go module in tools/helm, once per version and go.sum (cache: tools/cache.sh).
# Prints the bin directory.
# Usage: tools/build-helm.sh [--dir]   (--dir: print the directory; exit 1 if helm is not built)
set -euo pipefail
. "$(dirname "$0")/cache.sh"
here=$(cd "$(dirname "$0")/helm" && pwd)
version=$(module_version "$here" helm.sh/helm/v3)
case "$version" in
  v3.*) ;;
  *) echo "build-helm.sh: cannot read the helm.sh/helm/v3 version from $here/go.mod" >&2; exit 1 ;;
esac
out=$(cache_bin helm "$version" "$here")
cache_lookup "$out" "${1:-}" helm
cd "$here"
echo "build-helm.sh: building helm $version (about 5 minutes on 2 cores, cold)" >&2
go build -trimpath -o "$out.tmp/helm" \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version" helm.sh/helm/v3/cmd/helm >&2
cache_commit "$out"
