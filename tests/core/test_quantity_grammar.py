"""One quantity grammar everywhere (issue 18): the CRD's pattern, the operator's model and
``sluiceway_core.units.parse_quantity`` accept exactly the same strings.

Before the fix ``memoryReserve: 1e9`` and ``+1Gi`` passed the CRD pattern and the operator's model,
then ``parse_quantity`` raised ``UnitError`` while rendering, outside the ConfigValid path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sluiceway_core.units import QUANTITY_PATTERN, UnitError, parse_quantity

CRD = Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.sluiceway.io.yaml"


#: The other int-or-string kind: a count or a percentage (``rollout.maxSurge``/``maxUnavailable``, as
#: the Deployment's own fields), not a quantity.
INT_OR_PERCENT = "^([0-9]+%?)$"


def _quantity_patterns(node: Any, out: list[str]) -> list[str]:
    if isinstance(node, dict):
        if node.get("x-kubernetes-int-or-string") and node.get("pattern", INT_OR_PERCENT) != INT_OR_PERCENT:
            out.append(node["pattern"])
        for v in node.values():
            _quantity_patterns(v, out)
    elif isinstance(node, list):
        for v in node:
            _quantity_patterns(v, out)
    return out


PATTERNS = _quantity_patterns(yaml.safe_load(CRD.read_text()), [])
CRD_RE = re.compile(PATTERNS[0])


def test_every_quantity_field_of_the_crd_has_the_one_pattern() -> None:
    assert len(PATTERNS) >= 3  # resources.cpu, resources.memory, concurrency.memoryReserve
    assert set(PATTERNS) == {f"^{QUANTITY_PATTERN}$"}


def _parses(text: str) -> bool:
    try:
        parse_quantity(text)
    except UnitError:
        return False
    return True


_chars = st.sampled_from(list("0123456789.+-eEKMGTPEimnuk i"))
_near = st.lists(_chars, min_size=1, max_size=8).map("".join)


@settings(max_examples=2000, deadline=None)
@given(text=st.one_of(st.from_regex(CRD_RE), _near))
@example(text="1e9")
@example(text="+1Gi")
@example(text="1e-3")
@example(text="1E+2")
@example(text=".5")
@example(text="5.")
@example(text="1e999999")
@example(text="0E3000000")  # zero with an exponent past Decimal's Emax: decimal.InvalidOperation before
@example(text="1e1.5")
@example(text="-1")
def test_the_crd_pattern_and_parse_quantity_agree(text: str) -> None:
    """Strings the pattern accepts parse (within Kubernetes' range); the rest are refused by both."""
    if CRD_RE.fullmatch(text):
        try:
            value = parse_quantity(text)
        except UnitError as err:  # only for a value beyond what Kubernetes can hold
            assert "too large" in str(err), text
        else:
            assert value >= 0
    else:
        assert not _parses(text), text


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e9", 10**9), ("+1Gi", 2**30), ("1e-3", 1), ("1E+2", 100), ("500m", 1), ("1.5Gi", 3 * 2**29), ("0", 0)],
)
def test_values(text: str, value: int) -> None:
    assert parse_quantity(text) == value


def test_the_operator_reports_it_as_config_invalid_never_a_crash() -> None:
    from sluiceway_operator.render import Owner, build_pod_config
    from sluiceway_operator.spec import SpecError, parse_spec

    for text, expect in (("1e9", 10**9), ("+1Gi", 2**30)):
        spec = parse_spec(
            {"model": {"image": "i:1", "source": "demo", "format": "demo"}, "concurrency": {"memoryReserve": text}}
        )
        cfg = build_pod_config(Owner("a", "n", "u"), spec)
        assert cfg.concurrency.memory_reserve_bytes == expect
    with pytest.raises(SpecError, match="memoryReserve"):
        parse_spec(
            {"model": {"image": "i:1", "source": "demo", "format": "demo"}, "concurrency": {"memoryReserve": "1e99"}}
        )
