"""The reasons the scaler's demand term leaves out of the offered rate are the pod's own reasons,
and none of them is a refusal for lack of capacity (those are demand more replicas would serve)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from sluiceway_core import metric_names as m
from sluiceway_core.signals import Queries
from sluiceway_pod import errors

RULES = Path(__file__).resolve().parents[2] / "operator" / "sluiceway_scaler" / "rules.yaml"


def _pod_reasons() -> set[str]:
    return {c.reason for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.SluicewayError)}


def _capacity_reasons() -> set[str]:
    rules = yaml.safe_load(RULES.read_text())
    record = "sluiceway:rejected_capacity:rate5m"
    expr = next(r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("record") == record)
    found = re.search(r'reason=~"([^"]+)"', expr)
    assert found is not None
    return set(found.group(1).split("|"))


def test_not_demand_reasons_are_pod_reasons_and_never_capacity() -> None:
    left_out = set(m.NOT_DEMAND_REASONS)
    assert left_out <= _pod_reasons(), left_out - _pod_reasons()
    assert not left_out & _capacity_reasons()
    # a tenant's own limits and a missing key never ask for replicas
    assert {"rate_limited", "tenant_queue_full", "unauthenticated", "invalid_input"} <= left_out


def test_offered_rate_subtracts_exactly_those_reasons() -> None:
    q = Queries.build("team-a", "demo", "1m").offered_rate
    found = re.search(r'sluiceway_rejected_total\{[^}]*reason=~"([^"]+)"', q)
    assert found is not None
    assert set(found.group(1).split("|")) == set(m.NOT_DEMAND_REASONS)
    assert q.startswith("sum(rate(sluiceway_requests_total{") and " - (" in q and "or vector(0))" in q
