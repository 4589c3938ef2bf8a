"""The spec model: agrees with the CRD's defaults and rejects what the CRD's CEL rejects."""

from __future__ import annotations

from typing import Any

import pytest
from operator_support import apply_defaults, case_names, crd_schema, load_case
from sluiceway_core.units import UnitError, parse_duration, parse_quantity, parse_rate
from sluiceway_operator.spec import SpecError, parse_spec


@pytest.mark.parametrize("name", case_names())
def test_model_defaults_equal_crd_defaults(name: str) -> None:
    """What the API server stores (CRD defaults applied) parses to the same model as the raw spec."""
    spec = load_case(name)["spec"]
    defaulted = apply_defaults(spec, crd_schema()["properties"]["spec"])
    assert defaulted != spec  # defaulting did something
    assert parse_spec(defaulted) == parse_spec(spec)


def test_every_schema_field_has_a_description() -> None:
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if path.count(".") > 0 and "description" not in node and not path.endswith("metadata"):
            missing.append(path)
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{key}")
        if "items" in node and node["items"].get("properties"):
            walk(node["items"], f"{path}[]")

    walk(crd_schema(), "root")
    assert missing == []


def test_no_floats_in_spec_schema() -> None:
    found: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "number":
            found.append(path)
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{key}")
        if "items" in node:
            walk(node["items"], f"{path}[]")

    walk(crd_schema()["properties"]["spec"], "spec")
    assert found == []


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("5s", 5.0), ("1m30s", 90.0), ("2h", 7200.0), ("0s", 0.0), ("1.5m", 90.0)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5 s", "-1s", "1d", "s", "1.s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UnitError):
        parse_duration(text)


def test_units() -> None:
    assert parse_rate("30/m") == 0.5
    assert parse_rate("10/s") == 10.0
    assert parse_quantity("1Gi") == 1024**3
    assert parse_quantity("500M") == 500_000_000
    assert parse_quantity(7) == 7


BASE = {"model": {"image": "i", "format": "synthetic", "source": "synthetic:1"}}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must be <="),
        ({"timeouts": {"queue": "10s", "request": "5s"}}, "timeouts.queue must be shorter"),
        ({"priorities": {"classes": ["a", "a"], "default": "a"}}, "must be unique"),
        ({"priorities": {"classes": ["a"], "default": "b"}}, "priorities.default"),
        ({"tenants": [{"name": "x", "keySecretRef": {"name": "s"}, "maxPriority": "vip"}]}, "maxPriority"),
        (
            {
                "tenants": [
                    {"name": "x", "keySecretRef": {"name": "s"}},
                    {"name": "x", "keySecretRef": {"name": "t"}},
                ]
            },
            "tenant names must be unique",
        ),
        ({"tenants": [{"name": "x"}]}, "only the anonymous tenant"),
        ({"queue": {"targetWait": "9s"}}, "targetWait"),
        ({"surprise": 1}, "spec.surprise"),
    ],
)
def test_cross_field_errors_name_the_field(patch: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec({**BASE, **patch})
