"""Helpers shared by the operator tests: the CRD, its structural defaulting, the example cases."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "inferenceservices.sluiceway.io.yaml"
CASES = Path(__file__).parent / "cases"
GOLDEN = Path(__file__).parent / "golden"

#: Test keys of the tenants in cases/full.yaml (Secret name -> key -> value).
TEST_KEYS = {"search": "search-secret-key-1", "reports": "reports-secret-key-2"}
#: The key salt of the golden renders (a real service gets a random one, kept across reconciles).
TEST_SALT = bytes(range(32))
#: The quota key of the tests (the chart makes a random one).
TEST_QUOTA_KEY = b"test-quota-key-0123456789abcdef-0123456789"
#: The edge token of the golden renders without a quota key (a real service gets a random one, kept
#: in its <name>-edge Secret).
TEST_EDGE_TOKEN = "golden-edge-token-" + "0" * 46


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def crd_schema() -> dict[str, Any]:
    return load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it (defaults of absent fields, recursively)."""
    value = copy.deepcopy(value)
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(value[key], sub)
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(v, schema["items"]) for v in value]
    return value


def load_case(name: str) -> dict[str, Any]:
    return yaml.safe_load((CASES / f"{name}.yaml").read_text())


def case_names() -> list[str]:
    return sorted(p.stem for p in CASES.glob("*.yaml"))
