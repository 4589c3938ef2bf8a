"""``spec.observability`` and the operator's pod defaults (issue 23 §3): what reaches the pod config.

The pure builder (:func:`sluiceway_operator.render.build_pod_config`, validated by the pod's own
model) with the operator-wide defaults of ``SLUICEWAY_POD_LOG_FORMAT`` / ``SLUICEWAY_POD_TRACING_ENDPOINT``
and the spec's overrides; the config hash moves with them (the pods roll). A real ``sluiceway-pod``
process started with the rendered config writes JSON lines and the sampled access log. The CRD's
schema and CEL for the section: ``test_operator_apiserver.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from podtools import infer_body, start_pod
from sluiceway_operator.render import Environment, Owner, build_pod_config, render
from sluiceway_operator.settings import config_from_env
from sluiceway_operator.spec import SpecError, parse_spec

OWNER = Owner("obs", "ml", "uid-obs")
MODEL = {"image": "registry.example/p:1", "format": "synthetic", "source": "synthetic:5"}
COLLECTOR = "http://otel-collector.observability.svc:4318/v1/traces"


def _env(**kw: Any) -> Environment:
    return Environment(scaler_address="s:9090", prometheus_url=None, keda=True, service_monitor=False, **kw)


def _cfg(observability: dict[str, Any] | None = None, **env: Any) -> Any:
    spec: dict[str, Any] = {"model": MODEL}
    if observability is not None:
        spec["observability"] = observability
    return build_pod_config(OWNER, parse_spec(spec), _env(**env))


def test_nothing_set_keeps_the_pods_defaults() -> None:
    cfg = _cfg()
    assert cfg.server.log_format == "plain"
    assert cfg.server.access_log.enabled is False
    assert cfg.tracing.endpoint is None
    assert "log_format" not in cfg.server.model_fields_set and "tracing" not in cfg.model_fields_set


def test_operator_defaults_reach_the_pod() -> None:
    cfg = _cfg(pod_log_format="json", pod_tracing_endpoint=COLLECTOR)
    assert cfg.server.log_format == "json"
    assert (cfg.tracing.endpoint, cfg.tracing.sample_ratio, cfg.tracing.service_name) == (COLLECTOR, 1.0, "obs")


def test_the_spec_overrides_the_operator_defaults() -> None:
    own = "https://traces.example:4318/v1/traces"
    cfg = _cfg(
        {
            "logFormat": "plain",
            "accessLog": {"enabled": True, "samplePercent": 25},
            "tracing": {"endpoint": own, "samplePercent": 5, "serviceName": "fraud-model"},
        },
        pod_log_format="json",
        pod_tracing_endpoint=COLLECTOR,
    )
    assert cfg.server.log_format == "plain"
    assert (cfg.server.access_log.enabled, cfg.server.access_log.sample_rate) == (True, 0.25)
    assert (cfg.tracing.endpoint, cfg.tracing.sample_ratio, cfg.tracing.service_name) == (own, 0.05, "fraud-model")
    off = _cfg({"tracing": {"enabled": False}}, pod_tracing_endpoint=COLLECTOR)
    assert off.tracing.endpoint is None


@pytest.mark.parametrize(
    ("observability", "message"),
    [
        ({"accessLog": {"samplePercent": 10}}, "accessLog.samplePercent needs accessLog.enabled"),
        ({"tracing": {"enabled": False, "samplePercent": 3}}, "tracing.enabled: false turns tracing off"),
        ({"tracing": {"endpoint": "otel:4318"}}, "endpoint"),
        ({"accessLog": {"enabled": True, "samplePercent": 101}}, "samplePercent"),
        ({"logFormat": "full"}, "logFormat"),
    ],
)
def test_the_model_refuses_what_the_crd_refuses(observability: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"model": MODEL, "observability": observability})
    assert message in str(info.value)


def test_changing_them_rolls_the_pods() -> None:
    spec = parse_spec({"model": MODEL})

    def hash_of(**env: Any) -> str:
        return render(OWNER, spec, {}, _env(**env), replicas=1, salt=b"s" * 16).config_hash

    plain = hash_of()
    assert hash_of(pod_log_format="plain") == plain  # the pod's default: no roll on an operator upgrade
    assert hash_of(pod_log_format="json") != plain
    assert hash_of(pod_tracing_endpoint=COLLECTOR) != plain


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLUICEWAY_POD_LOG_FORMAT": "full"}, "SLUICEWAY_POD_LOG_FORMAT must be one of plain, json"),
        ({"SLUICEWAY_POD_TRACING_ENDPOINT": "otel:4318"}, "SLUICEWAY_POD_TRACING_ENDPOINT must be an http(s) URL"),
    ],
)
def test_bad_operator_defaults_stop_the_operator(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_from_env(env)


def test_a_real_pod_runs_with_the_rendered_config(tmp_path: Path) -> None:
    """JSON logs and a full access log from the rendered config (the ``server`` and ``tracing``
    sections as the operator renders them; host and ports are the test's)."""
    cfg = _cfg({"accessLog": {"enabled": True}}, pod_log_format="json")
    raw = cfg.model_dump(mode="json", by_alias=True, exclude_unset=True)
    pod = start_pod(tmp_path, config=raw)
    try:
        answer = httpx.post(pod.infer_url, json=infer_body(1, 4), timeout=30)
        assert answer.status_code == 200, answer.text
    finally:
        pod.terminate(30)
    lines = [ln for ln in pod.logs().splitlines() if ln.startswith("{")]
    records = [json.loads(ln) for ln in lines]
    print(f"{len(records)} JSON lines; access: {[r for r in records if r.get('logger') == 'sluiceway.access']}")
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert any(r["logger"] == "sluiceway.access" for r in records), yaml.safe_dump(records)
