"""The Grafana dashboard (charts/sluiceway/files/dashboard.json): every panel query is PromQL that
``promtool`` parses, it shows what the issue asks for, and every metric it reads is one the core
names AND a live ``sluiceway-pod`` exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from chart_support import CHART
from sluiceway_core import metric_names

DASHBOARD: dict[str, Any] = json.loads((CHART / "files" / "dashboard.json").read_text())
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
HISTOGRAMS = {metric_names.QUEUE_WAIT_SECONDS, metric_names.INFERENCE_SECONDS, metric_names.BATCH_SIZE}
CORE_NAMES = {v for k, v in vars(metric_names).items() if k.isupper() and isinstance(v, str)}
#: Grafana's built-in interval variables, replaced as Grafana does before the query reaches Prometheus.
GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "15s"}


def _panel_queries() -> list[tuple[str, str]]:
    out = []
    for panel in DASHBOARD["panels"]:
        for target in panel["targets"]:
            out.append((panel["title"], target["expr"]))
    return out


def _variable_selectors() -> list[str]:
    """The series selector inside each ``label_values(<selector>, label)`` template variable."""
    out = []
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["query"]["query"])
            assert m, var["query"]
            out.append(m.group(1))
    return out


def _promql(expr: str) -> str:
    for var, value in GRAFANA_INTERVALS.items():
        expr = expr.replace(var, value)
    return expr


def _series_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(sluiceway_[a-z0-9_]+)", expr))


def _base_name(series: str) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if series.endswith(suffix) and series.removesuffix(suffix) in HISTOGRAMS:
            return series.removesuffix(suffix)
    return series


def test_dashboard_queries_parse_with_promtool(tmp_path: Path) -> None:
    if not Path(PROMTOOL).exists():
        pytest.skip(f"promtool not found at {PROMTOOL}: apt-get install -y prometheus")
    exprs = [_promql(e) for _, e in _panel_queries()] + _variable_selectors()
    rules = {
        "groups": [
            {
                "name": "dashboard-queries",
                "rules": [{"record": f"dashboard:query_{n}:check", "expr": e} for n, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    out = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(exprs)} rules found" in out.stdout
    # The check can fail: a broken query is reported.
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "r:x", "expr": "sum(("}]}]}))
    bad = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0


def test_dashboard_shows_what_operators_need() -> None:
    used = {_base_name(s) for _, e in _panel_queries() for s in _series_names(e)}
    for name in (
        metric_names.QUEUE_DEPTH,
        metric_names.QUEUE_WAIT_SECONDS,
        metric_names.REJECTED,
        metric_names.CONCURRENCY_IN_USE,
        metric_names.GPU_MEMORY_ALLOCATED,
        metric_names.READY,  # replicas: ready and scraped pods
    ):
        assert name in used, name
    exprs = dict((e, t) for t, e in _panel_queries())
    assert any("histogram_quantile(0.95" in e and "sluiceway_queue_wait_seconds_bucket" in e for e in exprs)
    assert any("sluiceway_rejected_total" in e and "reason" in e.split("(")[1] for e in exprs)
    # Per-tenant admitted rate: every admitted request leaves the queue once (queue wait observed).
    assert any("tenant" in e and "sluiceway_queue_wait_seconds_count" in e and "rate(" in e for e in exprs)
    # Every query is scoped by the dashboard's namespace / inferenceservice variables.
    for _, e in _panel_queries():
        assert 'namespace=~"$namespace"' in e and 'inferenceservice=~"$inferenceservice"' in e, e


def test_dashboard_metric_names_are_the_cores() -> None:
    for title, expr in _panel_queries():
        for series in _series_names(expr):
            assert _base_name(series) in CORE_NAMES, f"{title}: {series} is not in sluiceway_core.metric_names"
    for selector in _variable_selectors():
        assert _series_names(selector) <= CORE_NAMES


@pytest.mark.slow
def test_dashboard_metric_names_are_exported_by_a_live_pod(pod_factory: Any) -> None:
    """Start a real pod (demo model) and read its metrics endpoint: every series the dashboard
    queries is declared there (``# TYPE`` lines exist before the first request)."""
    pod = pod_factory()
    url = getattr(pod, "metrics_url", None) or f"{pod.url}/metrics"
    text = httpx.get(url, timeout=10).text
    declared = {m.group(1): m.group(2) for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, flags=re.M)}
    assert declared, text[:500]
    needed = {s for _, e in _panel_queries() for s in _series_names(e)}
    needed |= {s for sel in _variable_selectors() for s in _series_names(sel)}
    for series in sorted(needed):
        base = _base_name(series)
        assert base in declared, f"{series}: the pod does not export {base} ({sorted(declared)})"
        if base != series:
            assert declared[base] == "histogram", series
