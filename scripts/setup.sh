#!/usr/bin/env bash
# Install everything Sluiceway's tests and demo need on a fresh Debian machine (idempotent):
# Debian's prometheus (prometheus + promtool), the Python package with its extras (torch comes from
# PyPI; pip's cache serves later runs), and the Go-built control plane and helm (cached under
# ~/.cache/sluiceway, keyed by version and go.sum, so only a new machine rebuilds them), and the
# fetch tests' S3 server, s3proxy, from Maven Central (Java and Maven from Debian when missing), and
# their OCI registry (distribution's, built from its Go module).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
# The sandbox (sluiceway sandbox / demo): network namespaces, veths and a bridge (iproute2),
# kube-proxy's Service rules (iptables; kube-proxy v1.34 clears conntrack entries over netlink, so
# the conntrack command is not needed), nsenter for exec probes (util-linux).
if ! command -v iptables >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1 || ! command -v nsenter >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables iproute2 util-linux >/dev/null
fi
# The fetch tests' S3 server (s3proxy, tools/build-s3.sh) runs on Java and is fetched with Maven.
if [ "${SLUICEWAY_SKIP_GO:-0}" != 1 ] && { ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; }; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless maven >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check -e '.[dev]'
if [ "${SLUICEWAY_SKIP_GO:-0}" != 1 ]; then
  echo "control plane: $(tools/build-kube.sh)"
  # The sandbox's Service routing: the real kube-proxy, same k8s.io/kubernetes module, its own cache
  # entry (most of its packages are in Go's build cache once the control plane is built).
  echo "kube-proxy: $(tools/build-kube-proxy.sh)"
  echo "helm: $(tools/build-helm.sh)"
  echo "KEDA: $(tools/build-keda.sh)"
  # The sandbox's Prometheus: Debian's lacks kubernetes_sd_configs (the scaler tests keep Debian's).
  echo "prometheus (sandbox): $(tools/build-prometheus.sh)"
  echo "s3proxy (fetch tests): $(tools/build-s3.sh)"
  # The oci:// fetch tests' registry: distribution's cmd/registry, built from its Go module.
  echo "registry (oci:// fetch tests): $(tools/build-registry.sh)"
  # The operator's HTTPRoute tests: the Gateway API CRDs from the sigs.k8s.io/gateway-api module.
  echo "Gateway API CRDs (HTTPRoute tests): $(tools/fetch-gateway-api.sh)"
fi
