"""KEDA in the sandbox: the real operator and metrics adapter of ``github.com/kedacore/keda/v2``
(built from its Go module by ``tools/build-keda.sh``), installed the way KEDA installs itself.

What :func:`keda_manifests` returns, in apply order:

* namespace ``keda`` and ServiceAccount ``keda-operator``;
* KEDA's own CRDs (``config/crd/bases``) and RBAC (``config/rbac``, ``config/metrics-server``
  role files), read unchanged from the module directory (``go mod download -json`` -> ``Dir``);
* Secret ``kedaorg-certs`` (``ca.crt``, ``tls.crt``, ``tls.key``: one KEDA CA and one leaf for the
  operator <-> adapter gRPC with mutual TLS and for the adapter's HTTPS), mounted at ``/certs`` in
  both Deployments as in KEDA's manifests;
* Deployments ``keda-operator`` (image ``ghcr.io/kedacore/keda``) and ``keda-metrics-apiserver``
  (image ``ghcr.io/kedacore/keda-metrics-apiserver``) running as ServiceAccount ``keda-operator``,
  and their Services;
* the APIService ``v1beta1.external.metrics.k8s.io`` pointing at Service
  ``keda/keda-metrics-apiserver``, verified with the KEDA CA (``caBundle``): the aggregator checks
  the serving certificate for ``keda-metrics-apiserver.keda.svc``, which the leaf carries.

Not installed: KEDA's admission webhooks (``cmd/webhooks``), an optional part of KEDA; the CRD
schemas still validate every ScaledObject. Pod addresses are unknown in advance, so the leaf's SANs
name the Services (all DNS forms), ``localhost`` and 127.0.0.1.

Split: :func:`build_keda_manifests` is pure (objects from already-read inputs);
:func:`read_upstream`, :func:`ensure_keda_certs`, :func:`keda_module_dir` and :func:`keda_binaries`
do the I/O.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import pki
from .layout import KEDA_ADAPTER_IMAGE, KEDA_OPERATOR_IMAGE, Layout

__all__ = [
    "ADAPTER_NAME",
    "APISERVICE_NAME",
    "CERT_SECRET",
    "KEDA_MODULE",
    "KEDA_VERSION",
    "NAMESPACE",
    "OPERATOR_NAME",
    "SERVICE_ACCOUNT",
    "KedaCerts",
    "KedaError",
    "Upstream",
    "build_keda_manifests",
    "ensure_keda_certs",
    "keda_binaries",
    "keda_manifests",
    "keda_module_dir",
    "read_upstream",
]

KEDA_MODULE = "github.com/kedacore/keda/v2"
KEDA_VERSION = "v2.21.0"
NAMESPACE = "keda"
SERVICE_ACCOUNT = "keda-operator"
OPERATOR_NAME = "keda-operator"
ADAPTER_NAME = "keda-metrics-apiserver"
CERT_SECRET = "kedaorg-certs"
APISERVICE_NAME = "v1beta1.external.metrics.k8s.io"
CERT_DIR = "/certs"
GRPC_PORT = 9666  # operator: the metrics service the adapter calls (mutual TLS)
OPERATOR_METRICS_PORT = 8080
OPERATOR_HEALTH_PORT = 8081
ADAPTER_SECURE_PORT = 6443
ADAPTER_METRICS_PORT = 8080

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "tools" / "build-keda.sh"
#: image repository -> binary name in the build's bin directory
BINARY_FOR_IMAGE = {KEDA_OPERATOR_IMAGE: "keda-operator", KEDA_ADAPTER_IMAGE: "keda-adapter"}
#: the files taken unchanged from KEDA's module directory
UPSTREAM_RBAC = (
    "config/rbac/role.yaml",
    "config/rbac/role_binding.yaml",
    "config/metrics-server/role.yaml",
    "config/metrics-server/role_binding.yaml",
)
UPSTREAM_CRDS = "config/crd/bases"

Obj = dict[str, Any]


class KedaError(RuntimeError):
    """KEDA's binaries or module directory are missing, or its upstream files are not as expected."""


# ------------------------------------------------------------------------------------------------
# I/O: binaries, module directory, upstream files, certificates.


def keda_binaries(*, build: bool = True, script: Path = BUILD_SCRIPT) -> dict[str, Path]:
    """``{image repository: binary}`` for the two KEDA images. Builds them on first use
    (``tools/build-keda.sh``: minutes, its progress goes to stderr) unless ``build`` is False, in
    which case missing binaries raise :class:`KedaError`."""
    args = ["bash", str(script)] + ([] if build else ["--dir"])
    out = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=False)
    bindir = Path(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else None
    if out.returncode != 0 or bindir is None:
        how = "build failed (see its output above)" if build else f"not built yet: run {script}"
        raise KedaError(f"KEDA binaries {how} (expected in {bindir})")
    found = {image: bindir / name for image, name in BINARY_FOR_IMAGE.items()}
    missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    if missing:
        raise KedaError(f"KEDA binaries missing: {', '.join(missing)}")
    return found


def keda_module_dir(tools_dir: Path = ROOT / "tools" / "keda", version: str = KEDA_VERSION) -> Path:
    """KEDA's module directory in the Go module cache (``go mod download -json``; uses the cache,
    and the module proxy only when the module is not there yet)."""
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"}
    try:
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"{KEDA_MODULE}@{version}"],
            cwd=tools_dir, env=env, capture_output=True, text=True, check=False, timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise KedaError(f"go mod download {KEDA_MODULE}@{version}: {err}") from err
    try:
        info = json.loads(out.stdout)
    except ValueError:
        info = {}
    d = info.get("Dir") if isinstance(info, dict) else None
    if out.returncode != 0 or not d:
        detail = (info.get("Error") if isinstance(info, dict) else None) or out.stderr.strip()
        raise KedaError(f"go mod download {KEDA_MODULE}@{version} failed: {detail}")
    return Path(d)


@dataclass(frozen=True)
class Upstream:
    """KEDA's own manifests, as read from its module directory."""

    crds: tuple[Obj, ...]
    rbac: tuple[Obj, ...]


def _load_all(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d]


def read_upstream(module_dir: Path) -> Upstream:
    """The CRDs and RBAC objects of KEDA's ``config/`` directory, unchanged."""
    crd_files = sorted((module_dir / UPSTREAM_CRDS).glob("*.yaml"))
    crds = [d for f in crd_files for d in _load_all(f)]
    if not crds or any(c.get("kind") != "CustomResourceDefinition" for c in crds):
        raise KedaError(f"no CustomResourceDefinitions under {module_dir / UPSTREAM_CRDS}")
    if "scaledobjects.keda.sh" not in {c["metadata"]["name"] for c in crds}:
        raise KedaError(f"{module_dir / UPSTREAM_CRDS} lacks scaledobjects.keda.sh")
    rbac: list[Obj] = []
    for rel in UPSTREAM_RBAC:
        f = module_dir / rel
        if not f.is_file():
            raise KedaError(f"KEDA's {rel} is missing from {module_dir}")
        rbac += _load_all(f)
    return Upstream(tuple(crds), tuple(rbac))


@dataclass(frozen=True)
class KedaCerts:
    """PEM text of KEDA's CA and of its one leaf (server and client auth)."""

    ca_crt: str
    tls_crt: str
    tls_key: str


def cert_dns_names(cluster_domain: str = "cluster.local") -> tuple[str, ...]:
    """Every name by which the adapter reaches the operator and the aggregator reaches the adapter."""
    names = ["localhost"]
    for svc in (OPERATOR_NAME, ADAPTER_NAME):
        names += [svc, f"{svc}.{NAMESPACE}", f"{svc}.{NAMESPACE}.svc", f"{svc}.{NAMESPACE}.svc.{cluster_domain}"]
    return tuple(names)


def ensure_keda_certs(layout: Layout) -> KedaCerts:
    """KEDA's CA and leaf under ``<state>/keda/pki`` (made once, reused by later runs)."""
    d = layout.keda_dir / "pki"
    ca = pki.Pair(d / "ca.crt", d / "ca.key")
    pki.ensure_ca(ca, "sluiceway-sandbox-keda-ca")
    leaf = pki.issue(
        ca, pki.Pair(d / "tls.crt", d / "tls.key"), "keda", server=True, client=True,
        dns=cert_dns_names(layout.cluster_domain), ips=("127.0.0.1",),
    )
    return KedaCerts(ca.cert.read_text(), leaf.cert.read_text(), leaf.key.read_text())


def keda_manifests(layout: Layout, *, module_dir: Path | None = None) -> list[Obj]:
    """Everything KEDA needs in the sandbox, in apply order (see the module docstring)."""
    upstream = read_upstream(module_dir or keda_module_dir())
    return build_keda_manifests(upstream, ensure_keda_certs(layout), cluster_domain=layout.cluster_domain)


# ------------------------------------------------------------------------------------------------
# Pure: the objects.

_LABELS = {"app.kubernetes.io/part-of": "keda-operator", "app.kubernetes.io/managed-by": "sluiceway-sandbox"}


def _meta(name: str, namespace: str | None = NAMESPACE, **labels: str) -> Obj:
    meta: Obj = {"name": name, "labels": {**_LABELS, **labels}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def _env(extra: Sequence[Obj] = ()) -> list[Obj]:
    return [
        {"name": "WATCH_NAMESPACE", "value": ""},  # all namespaces (unset: KEDA exits)
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "KEDA_CLUSTER_OBJECT_NAMESPACE", "value": NAMESPACE},
        *extra,
    ]


def _deployment(name: str, image: str, command: str, args: list[str], ports: list[Obj],
                probe: Obj, extra_volumes: Sequence[Obj] = (), extra_mounts: Sequence[Obj] = ()) -> Obj:
    labels = {"app": name, "app.kubernetes.io/name": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, **labels),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {**_LABELS, **labels}},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "terminationGracePeriodSeconds": 10,
                    "containers": [
                        {
                            "name": name,
                            "image": f"{image}:{KEDA_VERSION.lstrip('v')}",
                            "imagePullPolicy": "IfNotPresent",
                            "command": [command],
                            "args": args,
                            "env": _env(),
                            "ports": ports,
                            "readinessProbe": {**probe, "periodSeconds": 2, "failureThreshold": 3},
                            "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}},
                            "volumeMounts": [
                                {"name": "certificates", "mountPath": CERT_DIR, "readOnly": True},
                                *extra_mounts,
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "certificates", "secret": {"secretName": CERT_SECRET, "defaultMode": 0o444}},
                        *extra_volumes,
                    ],
                },
            },
        },
    }


def _service(name: str, ports: Sequence[tuple[str, int, int]]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, **{"app.kubernetes.io/name": name}),
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": n, "port": p, "targetPort": t, "protocol": "TCP"} for n, p, t in ports],
        },
    }


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def operator_args(cert_dir: str = CERT_DIR, host: str = "", *, grpc_port: int = GRPC_PORT,
                  metrics_port: int = OPERATOR_METRICS_PORT, health_port: int = OPERATOR_HEALTH_PORT,
                  log_level: str = "info") -> list[str]:
    """keda-operator's arguments (in a pod: every listener on the pod's address, ``host`` empty)."""
    return [
        "--leader-elect=false",
        f"--zap-log-level={log_level}",
        "--zap-encoder=console",
        "--zap-time-encoding=rfc3339",
        "--enable-cert-rotation=false",  # the sandbox issues the certificates (Secret kedaorg-certs)
        f"--cert-dir={cert_dir}",
        f"--metrics-bind-address={host}:{metrics_port}",
        f"--health-probe-bind-address={host}:{health_port}",
        f"--metrics-service-bind-address={host}:{grpc_port}",
    ]


def adapter_args(cert_dir: str = CERT_DIR, cluster_domain: str = "cluster.local", *,
                 metrics_service_address: str | None = None, secure_port: int = ADAPTER_SECURE_PORT,
                 metrics_port: int = ADAPTER_METRICS_PORT, log_level: str = "error") -> list[str]:
    """keda-adapter's arguments; it reaches the operator's gRPC service by its Service DNS name."""
    grpc = metrics_service_address or f"{OPERATOR_NAME}.{NAMESPACE}.svc.{cluster_domain}:{GRPC_PORT}"
    return [
        f"--secure-port={secure_port}",
        f"--port={metrics_port}",
        f"--zap-log-level={log_level}",
        f"--client-ca-file={cert_dir}/ca.crt",
        f"--tls-cert-file={cert_dir}/tls.crt",
        f"--tls-private-key-file={cert_dir}/tls.key",
        f"--cert-dir={cert_dir}",  # also where the adapter's gRPC client finds its mTLS files
        f"--metrics-service-address={grpc}",
    ]


def build_keda_manifests(
    upstream: Upstream,
    certs: KedaCerts,
    *,
    cluster_domain: str = "cluster.local",
    images: Mapping[str, str] | None = None,
) -> list[Obj]:
    """KEDA's objects, in apply order. ``images`` may override the two image repositories."""
    img = {KEDA_OPERATOR_IMAGE: KEDA_OPERATOR_IMAGE, KEDA_ADAPTER_IMAGE: KEDA_ADAPTER_IMAGE, **(images or {})}
    namespace: Obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(NAMESPACE, None)}
    sa: Obj = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(SERVICE_ACCOUNT)}
    secret: Obj = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(CERT_SECRET),
        "type": "Opaque",
        "data": {"ca.crt": _b64(certs.ca_crt), "tls.crt": _b64(certs.tls_crt), "tls.key": _b64(certs.tls_key)},
    }
    operator = _deployment(
        OPERATOR_NAME, img[KEDA_OPERATOR_IMAGE], "/keda", operator_args(),
        [
            {"name": "metricsservice", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "http", "containerPort": OPERATOR_METRICS_PORT, "protocol": "TCP"},
            {"name": "health", "containerPort": OPERATOR_HEALTH_PORT, "protocol": "TCP"},
        ],
        {"httpGet": {"path": "/readyz", "port": OPERATOR_HEALTH_PORT}},
    )
    adapter = _deployment(
        ADAPTER_NAME, img[KEDA_ADAPTER_IMAGE], "/keda-adapter", adapter_args(CERT_DIR, cluster_domain),
        [
            {"name": "https", "containerPort": ADAPTER_SECURE_PORT, "protocol": "TCP"},
            {"name": "http", "containerPort": ADAPTER_METRICS_PORT, "protocol": "TCP"},
        ],
        {"httpGet": {"path": "/readyz", "port": ADAPTER_SECURE_PORT, "scheme": "HTTPS"}},
        extra_volumes=[{"name": "temp-vol", "emptyDir": {}}],
        extra_mounts=[{"name": "temp-vol", "mountPath": "/tmp"}],
    )
    apiservice: Obj = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": _meta(APISERVICE_NAME, None),
        "spec": {
            "service": {"name": ADAPTER_NAME, "namespace": NAMESPACE, "port": 443},
            "group": "external.metrics.k8s.io",
            "version": "v1beta1",
            "caBundle": _b64(certs.ca_crt),
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    return [
        namespace,
        *upstream.crds,
        sa,
        *upstream.rbac,
        secret,
        _service(OPERATOR_NAME, [("metricsservice", GRPC_PORT, GRPC_PORT),
                                 ("metrics", OPERATOR_METRICS_PORT, OPERATOR_METRICS_PORT)]),
        _service(ADAPTER_NAME, [("https", 443, ADAPTER_SECURE_PORT),
                                ("metrics", ADAPTER_METRICS_PORT, ADAPTER_METRICS_PORT)]),
        operator,
        adapter,
        apiservice,
    ]
