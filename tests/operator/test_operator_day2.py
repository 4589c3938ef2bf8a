"""Issue 23, the operator's parts: ServiceMonitor labels, pollingInterval, the metrics Service.

Pure builders and settings (no cluster); the metrics condition over a real Prometheus is in
``test_operator_metrics_available.py``.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from operator_support import TEST_SALT, load_case
from sluiceway_operator.render import Environment, Owner, render
from sluiceway_operator.settings import config_from_env
from sluiceway_operator.spec import SpecError, parse_spec

K8S_VERSION = "1.34.0"
ENV = Environment(keda=True, service_monitor=True)


def _render(name: str, env: Environment = ENV, **spec_overrides: Any) -> dict[str, list[dict[str, Any]]]:
    cr = load_case(name)
    spec = parse_spec({**cr["spec"], **spec_overrides})
    owner = Owner(cr["metadata"]["name"], cr["metadata"]["namespace"], f"uid-{name}")
    hashes = {t.name: "x" * 64 for t in spec.keyed_tenants}
    out: dict[str, list[dict[str, Any]]] = {}
    for m in render(owner, spec, hashes, env, replicas=2, salt=TEST_SALT).manifests:
        out.setdefault(m["kind"], []).append(m)
    return out


# -- 1. ServiceMonitor labels ----------------------------------------------------------------------


def test_service_monitor_carries_the_operator_default_and_the_spec_labels() -> None:
    """kube-prometheus-stack selects ServiceMonitors by a ``release`` label: the operator-wide default
    (SLUICEWAY_SERVICEMONITOR_LABELS) and the spec's ``monitoring.serviceMonitorLabels`` both reach it;
    the spec wins on a shared key; the labels the operator manages cannot be replaced."""
    env = Environment(keda=True, service_monitor=True, service_monitor_labels={"release": "kps", "team": "ml"})
    kinds = _render(
        "minimal",
        env,
        monitoring={"serviceMonitorLabels": {"team": "vision", "sluiceway.io/inferenceservice": "other"}},
    )
    (sm,) = kinds["ServiceMonitor"]
    labels = sm["metadata"]["labels"]
    assert labels["release"] == "kps"
    assert labels["team"] == "vision"
    assert labels["sluiceway.io/inferenceservice"] == sm["metadata"]["name"]
    kubernetes_validate.validate(kinds["Deployment"][0], K8S_VERSION, strict=True)
    # the other children keep their own labels only
    assert "release" not in kinds["Deployment"][0]["metadata"]["labels"]


def test_service_monitor_labels_from_env() -> None:
    cfg = config_from_env({"SLUICEWAY_SERVICEMONITOR_LABELS": " release=kube-prometheus-stack , team=ml"})
    assert dict(cfg.service_monitor_labels) == {"release": "kube-prometheus-stack", "team": "ml"}
    assert dict(config_from_env({}).service_monitor_labels) == {}
    for bad in ("release", "release=", "=x", "bad key=x", "k=bad value", "k=" + "v" * 64):
        with pytest.raises(ValueError, match="SLUICEWAY_SERVICEMONITOR_LABELS"):
            config_from_env({"SLUICEWAY_SERVICEMONITOR_LABELS": bad})


@pytest.mark.parametrize("labels", [{"bad key": "x"}, {"k": "bad value"}, {"k": "v" * 64}])
def test_spec_service_monitor_labels_are_label_pairs(labels: dict[str, str]) -> None:
    cr = load_case("minimal")
    with pytest.raises(SpecError, match="serviceMonitorLabels"):
        parse_spec({**cr["spec"], "monitoring": {"serviceMonitorLabels": labels}})


# -- 3. pollingInterval ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["full", "minimal", "promtriggers"])
def test_polling_interval_is_how_often_keda_reads_the_signals(name: str) -> None:
    """``autoscaling.pollingInterval`` is rendered, and every trigger has ``useCachedMetrics``: KEDA
    reads each trigger every pollingInterval and answers the HPA from that reading (without it KEDA
    uses pollingInterval only for 0 <-> 1 and its webhook warns that it is not relevant)."""
    (so,) = _render(name)["ScaledObject"]
    spec = so["spec"]
    want = int(parse_spec(load_case(name)["spec"]).autoscaling.polling_interval.rstrip("s"))
    assert spec["pollingInterval"] == want
    assert spec["triggers"] and all(t["useCachedMetrics"] is True for t in spec["triggers"])
    assert "cooldownPeriod" not in spec  # only scale to zero uses it, which is refused


def test_polling_interval_two_seconds_is_rendered_as_two() -> None:
    (so,) = _render("minimal", autoscaling={"pollingInterval": "2s"})["ScaledObject"]
    assert so["spec"]["pollingInterval"] == 2


# -- 4. the metrics port ---------------------------------------------------------------------------


def test_metrics_port_is_not_on_the_client_service() -> None:
    """Issue 23: ``/metrics`` names every tenant; the Service clients call serves ``http`` only. A
    headless ``<name>-metrics`` Service (no cluster IP) carries ``metrics`` for the ServiceMonitor."""
    kinds = _render("minimal")
    by_name = {s["metadata"]["name"]: s for s in kinds["Service"]}
    name = load_case("minimal")["metadata"]["name"]
    client = by_name[name]
    assert [p["name"] for p in client["spec"]["ports"]] == ["http"]
    metrics = by_name[f"{name}-metrics"]
    assert metrics["spec"]["clusterIP"] == "None"
    assert [(p["name"], p["port"]) for p in metrics["spec"]["ports"]] == [("metrics", 9091)]
    (sm,) = kinds["ServiceMonitor"]
    selector = sm["spec"]["selector"]["matchLabels"]
    # the ServiceMonitor selects the metrics Service and not the client one
    assert all(metrics["metadata"]["labels"].get(k) == v for k, v in selector.items())
    assert not all(client["metadata"]["labels"].get(k) == v for k, v in selector.items())
    for svc in kinds["Service"]:
        kubernetes_validate.validate(svc, K8S_VERSION, strict=True)
