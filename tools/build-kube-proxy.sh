#!/usr/bin/env bash
# Build kube-proxy from the k8s.io/kubernetes module the control plane is built from (tools/kube: the
# same version, checked below), as its own cache entry (tools/cache.sh): tools/kube-proxy/go.mod is
# tools/kube's with kube-proxy as the only tool, so adding kube-proxy did not change the control
# plane's cache key. On a machine that built the control plane, Go's build cache already holds most
# packages kube-proxy needs. Prints the bin directory.
# Usage: tools/build-kube-proxy.sh [--dir]   (--dir: print the directory; exit 1 if not built yet)
set -euo pipefail
. "$(dirname "$0")/cache.sh"
here=$(cd "$(dirname "$0")/kube-proxy" && pwd)
version=$(module_version "$here" k8s.io/kubernetes)
plane=$(module_version "$here/../kube" k8s.io/kubernetes)
case "$version" in
  v1.*) ;;
  *) echo "build-kube-proxy.sh: cannot read the k8s.io/kubernetes version from $here/go.mod" >&2; exit 1 ;;
esac
if [ "$version" != "$plane" ]; then
  echo "build-kube-proxy.sh: tools/kube-proxy requires k8s.io/kubernetes $version, the control plane (tools/kube) $plane: make them equal" >&2
  exit 1
fi
out=$(cache_bin kube-proxy "$version" "$here")
cache_lookup "$out" "${1:-}" kube-proxy
minor=$(echo "$version" | cut -d. -f2)
P=k8s.io/component-base/version
cd "$here"
echo "build-kube-proxy.sh: building kube-proxy $version (a few minutes once the control plane is built)" >&2
go build -trimpath -o "$out.tmp/" \
  -ldflags "-s -w -X $P.gitVersion=$version -X $P.gitMajor=1 -X $P.gitMinor=$minor -X $P.gitTreeState=clean" \
  k8s.io/kubernetes/cmd/kube-proxy >&2
cache_commit "$out"
