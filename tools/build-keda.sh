#!/usr/bin/env bash
# Build KEDA's operator and metrics adapter (github.com/kedacore/keda/v2 cmd/operator, cmd/adapter)
# from the Go module in tools/keda, once per version and go.sum (cache: tools/cache.sh). Prints the
# bin directory. Binaries: keda-operator, keda-adapter (KEDA's admission webhooks are not built).
# Usage: tools/build-keda.sh [--dir]   (--dir: print the directory; exit 1 if not built yet)
set -euo pipefail
. "$(dirname "$0")/cache.sh"
here=$(cd "$(dirname "$0")/keda" && pwd)
version=$(module_version "$here" github.com/kedacore/keda/v2)
case "$version" in
  v2.*) ;;
  *) echo "build-keda.sh: cannot read the github.com/kedacore/keda/v2 version from $here/go.mod" >&2; exit 1 ;;
esac
out=$(cache_bin keda "$version" "$here")
cache_lookup "$out" "${1:-}" keda-operator keda-adapter
P=github.com/kedacore/keda/v2/version
cd "$here"
echo "build-keda.sh: building KEDA $version (operator, then adapter; about 18 CPU-minutes cold)" >&2
go build -trimpath -o "$out.tmp/keda-operator" -ldflags "-s -w -X $P.Version=$version" \
  github.com/kedacore/keda/v2/cmd/operator >&2
go build -trimpath -o "$out.tmp/keda-adapter" -ldflags "-s -w -X $P.Version=$version" \
  github.com/kedacore/keda/v2/cmd/adapter >&2
cache_commit "$out"
