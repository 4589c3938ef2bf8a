#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and etcd from the Go module in
# tools/kube (kubectl from the same k8s.io/kubernetes module as the control plane, so client and
# server versions match), once per version and go.sum (cache: tools/cache.sh). Prints the bin directory.
# Usage: tools/build-kube.sh [--dir]   (--dir: print the directory; exit 1 if not built yet)
set -euo pipefail
. "$(dirname "$0")/cache.sh"
here=$(cd "$(dirname "$0")/kube" && pwd)
version=$(module_version "$here" k8s.io/kubernetes)
case "$version" in
  v1.*) ;;
  *) echo "build-kube.sh: cannot read the k8s.io/kubernetes version from $here/go.mod" >&2; exit 1 ;;
esac
out=$(cache_bin kube "$version" "$here")
cache_lookup "$out" "${1:-}" kube-apiserver kube-controller-manager kube-scheduler kubectl etcd
minor=$(echo "$version" | cut -d. -f2)
P=k8s.io/component-base/version
cd "$here"
echo "build-kube.sh: building Kubernetes $version (about 15 minutes on 2 cores, cold)" >&2
go build -trimpath -o "$out.tmp/" \
  -ldflags "-s -w -X $P.gitVersion=$version -X $P.gitMajor=1 -X $P.gitMinor=$minor -X $P.gitTreeState=clean" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl >&2
go build -trimpath -o "$out.tmp/etcd" -ldflags "-s -w" go.etcd.io/etcd/server/v3 >&2
cache_commit "$out"
