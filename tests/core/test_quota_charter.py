"""The operator's signed quota charter: what verifies, what does not, and what the errors never say."""

from __future__ import annotations

from pathlib import Path

import pytest
from sluiceway_core.quota import QuotaError, TenantQuota
from sluiceway_core.quota_charter import QuotaCharter, load_key, sign_charter, verify_charter

KEY = b"k" * 32
CHARTER = QuotaCharter("ns/svc", {"a": TenantQuota(10.0, 20, 3), "b": TenantQuota(None, None, 2)}, 5)


def test_a_signed_charter_verifies_and_round_trips() -> None:
    sig = sign_charter(KEY, CHARTER)
    assert verify_charter(KEY, CHARTER.to_json(), sig) == CHARTER
    assert verify_charter(KEY, CHARTER.to_json(), sig.upper()) == CHARTER  # hex is case-blind


@pytest.mark.parametrize(
    "change",
    [
        {"service": "other/svc"},
        {"maxPods": 6},
        {"quotas": {"a": {"rate": 1e6, "burst": 20, "maxConcurrent": 3}, "b": {"maxConcurrent": 2}}},
    ],
)
def test_any_change_breaks_the_signature_and_the_error_never_shows_it(change: dict[str, object]) -> None:
    sig = sign_charter(KEY, CHARTER)
    with pytest.raises(QuotaError) as err:
        verify_charter(KEY, {**CHARTER.to_json(), **change}, sig)
    assert sig not in str(err.value) and KEY.decode() not in str(err.value)


def test_another_key_does_not_verify() -> None:
    with pytest.raises(QuotaError, match="does not match"):
        verify_charter(b"x" * 32, CHARTER.to_json(), sign_charter(KEY, CHARTER))


@pytest.mark.parametrize("sig", [None, "", "zz", 42, "0" * 63])
def test_a_malformed_signature_is_refused(sig: object) -> None:
    with pytest.raises(QuotaError, match="missing or malformed"):
        verify_charter(KEY, CHARTER.to_json(), sig)


@pytest.mark.parametrize(
    "doc",
    [
        {"service": "no-slash", "quotas": {}, "maxPods": 1},
        {"service": "ns/s", "quotas": {}, "maxPods": 0},
        {"service": "ns/s", "quotas": {}, "maxPods": True},
        {"service": "ns/s", "quotas": {"has space": {"rate": 1}}, "maxPods": 1},
        {"service": "ns/s", "quotas": [], "maxPods": 1},
    ],
)
def test_malformed_charters_are_refused_before_any_signature_check(doc: dict[str, object]) -> None:
    with pytest.raises(QuotaError):
        QuotaCharter.from_json(doc)


def test_short_keys_are_refused(tmp_path: Path) -> None:
    with pytest.raises(QuotaError):
        sign_charter(b"short", CHARTER)
    f = tmp_path / "key"
    f.write_bytes(b"  " + b"s" * 31 + b"\n")
    with pytest.raises(ValueError, match="fewer than 32") as err:
        load_key(f)
    assert "sss" not in str(err.value)  # names the path, never the content
    f.write_bytes(b"s" * 40 + b"\n")
    assert load_key(f) == b"s" * 40
