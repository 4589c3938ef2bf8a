#!/usr/bin/env bash
# Build prometheus and promtool (github.com/prometheus/prometheus cmd/prometheus, cmd/promtool) from
# the Go module in tools/prometheus, once per version and go.sum (cache: tools/cache.sh). Prints the
# bin directory.
# Why not Debian's package: Debian builds prometheus without Kubernetes service discovery
# (its promtool answers "field kubernetes_sd_configs not found in type config.ScrapeConfig"),
# and the sandbox discovers pods with kubernetes_sd_configs as a real cluster does.
# Usage: tools/build-prometheus.sh [--dir]   (--dir: print the directory; exit 1 if not built yet)
set -euo pipefail
. "$(dirname "$0")/cache.sh"
here=$(cd "$(dirname "$0")/prometheus" && pwd)
version=$(module_version "$here" github.com/prometheus/prometheus)
case "$version" in
  v0.*) ;;
  *) echo "build-prometheus.sh: cannot read the github.com/prometheus/prometheus version from $here/go.mod" >&2
     exit 1 ;;
esac
out=$(cache_bin prometheus "$version" "$here")
cache_lookup "$out" "${1:-}" prometheus promtool
# v0.314.0 is Prometheus 3.14.0 (the Go module's versions are v0.<major*100+minor>.<patch>).
minor=$(echo "$version" | cut -d. -f2); patch=$(echo "$version" | cut -d. -f3)
release="$((minor / 100)).$((minor % 100)).$patch"
V=github.com/prometheus/common/version
cd "$here"
echo "build-prometheus.sh: building Prometheus $release (prometheus, promtool; about 12 CPU-minutes cold)" >&2
go build -trimpath -o "$out.tmp/" -ldflags "-s -w -X $V.Version=$release -X $V.Branch=module" \
  github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool >&2
cache_commit "$out"
