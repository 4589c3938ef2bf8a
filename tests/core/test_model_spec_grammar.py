"""One model grammar for the CRD's CEL rules, the operator's model and the pod's parser (issue 18).

Before the fix ``model.fallback.source: "synthetic:fast"`` matched the CRD's 'package.module:factory'
branch and was rendered (ConfigValid=True), and the pod failed at start. The CEL expressions are
read from the CRD and evaluated here with Python's re (the same regular expressions; the real API
server runs them in tests/operator/test_operator_apiserver.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sluiceway_core.config import FallbackModelConfig, ModelConfig

CRD = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.sluiceway.io.yaml").read_text())
MODEL = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"]
(FALLBACK_RULE,) = [r["rule"] for r in MODEL["properties"]["fallback"]["x-kubernetes-validations"]]


def crd_fallback_accepts(source: str) -> bool:
    """The fallback rule, evaluated: its parts are ==, matches(), startsWith() and ! joined by ||/&&."""
    regexes = re.findall(r"matches\('([^']*)'\)", FALLBACK_RULE)
    assert len(regexes) == 2 and "!self.source.startsWith('synthetic:')" in FALLBACK_RULE
    synthetic, python = regexes
    return (
        source == "demo"
        or re.search(synthetic, source) is not None
        or source.startswith("/")
        or (not source.startswith("synthetic:") and re.search(python, source) is not None)
    )


def pod_accepts(source: str) -> bool:
    try:
        FallbackModelConfig(spec=source)
        ModelConfig(spec=source)
    except ValidationError:
        return False
    return True


@settings(deadline=None)  # a scheduling stall is not a failure of the property
@given(
    st.one_of(
        st.text(max_size=12).map(lambda t: "synthetic:" + t),
        st.from_regex(r"synthetic:[0-9]{1,6}(\.[0-9]{1,3})?", fullmatch=True),
    )
)
@example("synthetic:fast")
@example("synthetic:1e3")
@example("synthetic: 5")
@example("synthetic:2.5")
@example("synthetic:nan")
@example("synthetic:")
def test_synthetic_sources_are_accepted_alike(source: str) -> None:
    if crd_fallback_accepts(source):
        ms = float(source.split(":", 1)[1])
        assert pod_accepts(source) == (ms <= 600_000), source  # the pod's own bound (ConfigValid=False)
    else:
        assert not pod_accepts(source), source


@pytest.mark.parametrize("source", ["demo", "/models/m.pt", "pkg.mod:make", "synthetics:make", "synthetic:20"])
def test_what_the_crd_accepts_the_pod_loads(source: str) -> None:
    assert crd_fallback_accepts(source) and pod_accepts(source)


def test_synthetic_fast_is_refused_by_both() -> None:
    assert not crd_fallback_accepts("synthetic:fast")
    with pytest.raises(ValidationError, match="synthetic spec needs milliseconds"):
        FallbackModelConfig(spec="synthetic:fast")
