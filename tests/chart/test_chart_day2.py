"""The chart's day-two settings reach the operator (through the real helm): the ServiceMonitor labels
(``operator.serviceMonitorLabels`` -> ``SLUICEWAY_SERVICEMONITOR_LABELS``), and the inference pods'
observability defaults (``logFormat`` -> ``SLUICEWAY_POD_LOG_FORMAT``, ``tracing.endpoint`` ->
``SLUICEWAY_POD_TRACING_ENDPOINT``). Each rendered environment is read back by the operator's own
:func:`sluiceway_operator.settings.config_from_env`, so the chart and the operator agree on the format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_support import CHART, find, helm_binary, run_helm, template
from sluiceway_operator.settings import config_from_env


@pytest.fixture(scope="module")
def helm() -> str:
    path, why = helm_binary()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-day2")


def _env(docs: list[dict[str, Any]]) -> dict[str, str]:
    deployment = find(docs, "Deployment", "sluiceway-operator")
    return {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_defaults_render_no_labels_plain_logs_and_no_tracing(helm: str, home: Path) -> None:
    env = _env(template(helm, home, None))
    assert env["SLUICEWAY_SERVICEMONITOR_LABELS"] == ""
    assert env["SLUICEWAY_POD_LOG_FORMAT"] == "plain"
    assert env["SLUICEWAY_POD_TRACING_ENDPOINT"] == ""
    cfg = config_from_env(env)
    assert cfg.service_monitor_labels == () and cfg.pod_log_format == "plain" and cfg.pod_tracing_endpoint is None


def test_service_monitor_labels_and_pod_defaults_reach_the_operator(helm: str, home: Path) -> None:
    values = {
        "logFormat": "json",
        "tracing": {"endpoint": "http://otel-collector.observability.svc:4318/v1/traces"},
        "operator": {"serviceMonitorLabels": {"release": "kube-prometheus-stack", "team.example.com/owner": "ml"}},
    }
    env = _env(template(helm, home, values))
    print(f"rendered: {env['SLUICEWAY_SERVICEMONITOR_LABELS']!r}")
    assert env["SLUICEWAY_SERVICEMONITOR_LABELS"] == "release=kube-prometheus-stack,team.example.com/owner=ml"
    assert env["SLUICEWAY_POD_LOG_FORMAT"] == "json"
    cfg = config_from_env(env)
    assert dict(cfg.service_monitor_labels) == values["operator"]["serviceMonitorLabels"]
    assert cfg.pod_log_format == "json"
    assert cfg.pod_tracing_endpoint == "http://otel-collector.observability.svc:4318/v1/traces"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "operator.serviceMonitorLabels.release=a b"], "at '/operator/serviceMonitorLabels/release'"),
        (["--set-json", 'operator.serviceMonitorLabels={"bad key":"x"}'], "invalid propertyName 'bad key'"),
        (["--set", "tracing.endpoint=otel:4318"], "at '/tracing/endpoint'"),
        (["--set", "tracing.sampleRatio=1"], "at '/tracing': additional properties 'sampleRatio' not allowed"),
    ],
)
def test_bad_day2_values_are_refused_by_the_schema(helm: str, home: Path, args: list[str], message: str) -> None:
    out = run_helm(helm, home, "template", "sw", str(CHART), *args)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
