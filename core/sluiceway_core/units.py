"""Durations, rates and Kubernetes quantities: one grammar for every component. Pure.

- duration: Go notation restricted to ``h``, ``m``, ``s`` and ``ms`` parts, each a non-negative
  decimal, e.g. ``500ms``, ``5s``, ``1m30s``, ``1.5m``. A bare number is refused (a unit is always
  named). The CRD's patterns are stricter (integers only); every string the CRD accepts parses here.
- rate: ``<integer>/<s|m|h>`` (``30/m`` is 0.5 per second).
- quantity: a non-negative Kubernetes quantity such as ``1Gi``, ``500M``, ``1e9``, ``+2`` (rounded up to
  an integer), the grammar of :data:`QUANTITY_PATTERN`, which the CRD's quantity fields carry verbatim
  (tests/core/test_quantity_grammar.py checks that both accept the same strings).
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, localcontext

__all__ = [
    "QUANTITY_PATTERN",
    "UnitError",
    "format_duration",
    "parse_duration",
    "parse_quantity",
    "parse_rate",
    "parse_seconds",
]


class UnitError(ValueError):
    """A string that is not a duration, rate or quantity. ``str()`` says what was expected."""


_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_FULL = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h))+$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_BARE_SECONDS = re.compile(r"^[0-9]+(?:\.[0-9]+)?$")
_RATE = re.compile(r"^([0-9]+)/(s|m|h)$")
#: A non-negative Kubernetes quantity (k8s.io/apimachinery resource.Quantity without a sign other than
#: ``+``): digits with an optional fraction, then a binary suffix, a decimal suffix or an integer
#: exponent. The CRD's ``pattern`` is ``^`` + this + ``$``.
QUANTITY_PATTERN = r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?"
_QUANTITY = re.compile(r"\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:([KMGTPE]i|[numkMGTPE])|[eE]([+-]?[0-9]+))?")
#: The largest quantity Kubernetes holds (an int64).
MAX_QUANTITY = 2**63 - 1
_QUANTITY_FACTOR: dict[str, float] = {
    "": 1,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
#: The fractional suffixes as exact decimals (floats would round 1m * 1000 off an integer).
_DECIMAL_FRACTIONS = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3")}


def parse_duration(text: str) -> float:
    """``"1m30s"`` -> 90.0 seconds. Raises :class:`UnitError`."""
    t = text.strip()
    if not _DURATION_FULL.match(t):
        raise UnitError(f"{text!r} is not a duration like 500ms, 5s, 1m30s")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(t))


def parse_seconds(text: str) -> float:
    """A duration, or a bare non-negative number of seconds (``"300"``): for keys and flags whose
    name says seconds (``scaleDownWindowSeconds``, ``--target-wait-p95 1``). Raises :class:`UnitError`."""
    t = text.strip()
    if _BARE_SECONDS.match(t):
        return float(t)
    return parse_duration(t)


def format_duration(seconds: float) -> str:
    """The inverse for rendering: whole seconds as ``Ns``, anything finer as ``Nms``."""
    if seconds < 0:
        raise UnitError(f"a duration cannot be negative: {seconds}")
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def parse_rate(text: str) -> float:
    """``"30/m"`` -> 0.5 tokens per second. Raises :class:`UnitError`."""
    m = _RATE.match(text.strip())
    if not m:
        raise UnitError(f"{text!r} is not a rate like 10/s or 30/m")
    return int(m.group(1)) / _UNIT_SECONDS[m.group(2)]


def parse_quantity(value: int | str) -> int:
    """A Kubernetes quantity (``"1Gi"``, ``"500M"``, ``"1e9"``, ``2``) -> an integer, rounded up.
    Raises :class:`UnitError` for anything outside :data:`QUANTITY_PATTERN` or above
    :data:`MAX_QUANTITY`."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a quantity like 1Gi or 500M")
    if isinstance(value, int):
        if not 0 <= value <= MAX_QUANTITY:
            raise UnitError(f"{value} is not a quantity within 0..{MAX_QUANTITY}")
        return value
    m = _QUANTITY.fullmatch(value)
    if not m:
        raise UnitError(f"{value!r} is not a quantity like 1Gi, 500M or 1e9")
    with localcontext() as ctx:
        ctx.prec = 100  # exact for every value up to MAX_QUANTITY times the largest suffix
        number = Decimal(m.group(1))
        suffix, exponent = m.group(2), m.group(3)
        if exponent is not None:
            exp = int(exponent)
            if number != 0 and number.adjusted() + exp > 18:  # >= 1e19: beyond an int64
                raise UnitError(f"{value!r} is too large a quantity (at most {MAX_QUANTITY})")
            # zero stays zero whatever its exponent ("0E3000000" would overflow Decimal's Emax)
            number = number.scaleb(max(exp, -60)) if number != 0 else Decimal(0)
        elif suffix in _DECIMAL_FRACTIONS:
            number *= _DECIMAL_FRACTIONS[suffix]
        else:
            number *= int(_QUANTITY_FACTOR[suffix or ""])
        result = int(number.to_integral_value(rounding=ROUND_CEILING))
    if result > MAX_QUANTITY:
        raise UnitError(f"{value!r} is too large a quantity (at most {MAX_QUANTITY})")
    return result


