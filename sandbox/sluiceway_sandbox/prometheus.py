"""Prometheus in the sandbox: the real ``prometheus`` built from its Go module
(``tools/build-prometheus.sh``; Debian's package is built without Kubernetes service discovery),
discovering the inference pods through
``kubernetes_sd_configs`` (role ``pod``) against the sandbox API server with the token of its own
ServiceAccount ``monitoring/prometheus`` (get/list/watch pods, nothing else). No static targets.

Relabeling is the one the chart's PodMonitor asks of a real cluster (``charts/sluiceway/templates/
monitoring.yaml``): keep pods labelled ``app.kubernetes.io/name=sluiceway-pod`` (and the gateways,
``sluiceway-gateway``, marked ``component="gateway"``) on their container port named ``metrics``;
set ``namespace``, ``inferenceservice`` (from the pod label ``sluiceway.io/inferenceservice``) and
``pod``. A second job scrapes the scaler's ``metrics`` port
(pods labelled ``app.kubernetes.io/name=sluiceway-scaler``).

:func:`prometheus_config` and :func:`prometheus_manifests` are pure; :func:`start_prometheus` runs
the process.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from sluiceway_core.metric_names import SCRAPE_LABELS

__all__ = [
    "NAMESPACE",
    "POD_APP_LABEL",
    "SCALER_APP_LABEL",
    "SERVICE_ACCOUNT",
    "PrometheusError",
    "prometheus_bin_dir",
    "prometheus_config",
    "prometheus_manifests",
    "start_prometheus",
]

NAMESPACE = "monitoring"
SERVICE_ACCOUNT = "prometheus"
POD_APP_LABEL = "sluiceway-pod"
#: The operator-rendered gateways are scraped by the pods' job, their series marked
#: ``component="gateway"`` (the chart's PodMonitor does the same): the scaler's activation reads
#: their hold queue, and its counts of pods (``up``) leave them out.
GATEWAY_APP_LABEL = "sluiceway-gateway"
SCALER_APP_LABEL = "sluiceway-scaler"
METRICS_PORT_NAME = "metrics"

Obj = dict[str, Any]


ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "tools" / "build-prometheus.sh"


class PrometheusError(RuntimeError):
    """Bad arguments, or the prometheus binary is missing."""


def _sd(api_server: str, ca_file: str, token_file: str) -> list[Obj]:
    return [
        {
            "role": "pod",
            "api_server": api_server,
            "tls_config": {"ca_file": ca_file, "insecure_skip_verify": False},
            "authorization": {"type": "Bearer", "credentials_file": token_file},
        }
    ]


def _keep(label: str, value: str) -> Obj:
    return {"source_labels": [label], "regex": value, "action": "keep"}


def _copy(label: str, target: str) -> Obj:
    return {"source_labels": [label], "target_label": target, "action": "replace"}


def prometheus_config(
    api_server: str,
    ca_file: str | Path,
    token_file: str | Path,
    scrape_interval: str = "2s",
    *,
    scrape_scaler: bool = True,
) -> str:
    """The Prometheus configuration (YAML text). ``api_server`` must be an https URL; the CA and the
    token files are read by Prometheus itself (the token on every request, so a renewed token is
    picked up)."""
    if not api_server.startswith("https://"):
        raise PrometheusError(f"api_server must be an https:// URL, got {api_server!r}")
    if not scrape_interval or not scrape_interval[0].isdigit():
        raise PrometheusError(f"scrape_interval must be a Prometheus duration such as 2s, got {scrape_interval!r}")
    namespace, inference_service, pod = SCRAPE_LABELS
    sd = _sd(api_server, str(ca_file), str(token_file))
    common = [
        _keep("__meta_kubernetes_pod_container_port_name", METRICS_PORT_NAME),
        _keep("__meta_kubernetes_pod_phase", "Running"),
        _copy("__meta_kubernetes_namespace", namespace),
        _copy("__meta_kubernetes_pod_name", pod),
    ]
    jobs: list[Obj] = [
        {
            "job_name": "sluiceway-pods",
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "metrics_path": "/metrics",
            "kubernetes_sd_configs": sd,
            "relabel_configs": [
                _keep("__meta_kubernetes_pod_label_app_kubernetes_io_name", f"{POD_APP_LABEL}|{GATEWAY_APP_LABEL}"),
                *common,
                _copy("__meta_kubernetes_pod_label_sluiceway_io_inferenceservice", inference_service),
                {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                 "regex": GATEWAY_APP_LABEL, "target_label": "component", "replacement": "gateway",
                 "action": "replace"},
            ],
        }
    ]
    if scrape_scaler:
        jobs.append(
            {
                "job_name": "sluiceway-scaler",
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "metrics_path": "/metrics",
                "kubernetes_sd_configs": sd,
                "relabel_configs": [
                    _keep("__meta_kubernetes_pod_label_app_kubernetes_io_name", SCALER_APP_LABEL),
                    *common,
                ],
            }
        )
    cfg = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": jobs,
    }
    return yaml.safe_dump(cfg, sort_keys=False)


def prometheus_manifests(namespace: str = NAMESPACE, service_account: str = SERVICE_ACCOUNT) -> list[Obj]:
    """Namespace, ServiceAccount and the least RBAC that pod discovery needs (get/list/watch pods)."""
    labels = {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "sluiceway-sandbox"}
    name = f"sluiceway-sandbox-{service_account}"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace, "labels": labels},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    ]


def prometheus_bin_dir(*, build: bool = True, script: Path = BUILD_SCRIPT) -> Path:
    """The directory holding ``prometheus`` and ``promtool`` built by ``tools/build-prometheus.sh``
    (built on first use, minutes, progress on stderr, unless ``build`` is False: then a missing
    build raises :class:`PrometheusError`)."""
    out = subprocess.run(["bash", str(script)] + ([] if build else ["--dir"]),
                         stdout=subprocess.PIPE, text=True, check=False)
    lines = out.stdout.strip().splitlines()
    bindir = Path(lines[-1]) if lines else None
    if out.returncode != 0 or bindir is None:
        how = "build failed (see its output above)" if build else f"not built yet: run {script}"
        raise PrometheusError(f"prometheus {how} (expected in {bindir})")
    for name in ("prometheus", "promtool"):
        if not os.access(bindir / name, os.X_OK):
            raise PrometheusError(f"{bindir / name} missing")
    return bindir


def prometheus_binary(*, build: bool = True) -> Path:
    return prometheus_bin_dir(build=build) / "prometheus"


def prometheus_command(
    config_file: Path, data_dir: Path, listen: str, *, binary: Path | None = None, retention: str = "2h",
    extra: Sequence[str] = (),
) -> list[str]:
    return [
        str(binary or prometheus_binary()),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data_dir}",
        f"--storage.tsdb.retention.time={retention}",
        f"--web.listen-address={listen}",
        "--log.level=warn",
        *extra,
    ]


def start_prometheus(
    config_text: str,
    workdir: Path,
    listen: str,
    log_file: Path,
    *,
    binary: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Write ``config_text`` to ``<workdir>/prometheus.yml`` and start Prometheus listening on
    ``listen`` (``host:port``: loopback or the sandbox bridge address). Returns the process; the
    caller records its PID and stops it."""
    host = listen.rpartition(":")[0]
    if not (host.startswith("127.") or host.startswith("198.18.") or host == "localhost"):
        raise PrometheusError(f"listen on loopback or the sandbox bridge only, got {listen!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    cfg.write_text(config_text)
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            prometheus_command(cfg, data, listen, binary=binary),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
