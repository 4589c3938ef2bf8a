"""Issue 18 item 9: tenant key hashes are HMAC-SHA256 with a per-service random salt, checked in
constant time; the one rule (sluiceway_core.keys) for the operator and every checker."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sluiceway_core.keys import SALT_BYTES, hash_key, key_matches, keys_text, new_salt, parse_keys_text


def test_salted_hashes_differ_per_service_and_are_hmac() -> None:
    a, b = new_salt(), new_salt()
    assert len(a) == SALT_BYTES and a != b
    assert hash_key("k", a) != hash_key("k", b)
    assert hash_key("k", a) == hmac.new(a, b"k", hashlib.sha256).hexdigest()
    assert hash_key("k", a) != hashlib.sha256(b"k").hexdigest()  # no unsalted table applies


@settings(deadline=None)  # a scheduling stall is not a failure of the property
@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True), st.text(min_size=1), max_size=5))
def test_the_keys_file_round_trips(keys: dict[str, str]) -> None:
    salt = new_salt()
    text = keys_text(salt, {t: hash_key(k, salt) for t, k in keys.items()})
    parsed = parse_keys_text(text)
    assert parsed.salt == salt
    for key in keys.values():
        found = parsed.lookup(key)
        assert found is not None and keys[found] == key
        assert key_matches(key, salt, hash_key(key, salt))
    assert parsed.lookup("\x00not-a-key") is None or "\x00not-a-key" in keys.values()


def test_legacy_plain_sha256_files_still_parse() -> None:
    parsed = parse_keys_text(f"# comment\n{hashlib.sha256(b'k').hexdigest()} t\n")
    assert parsed.salt is None and parsed.lookup("k") == "t" and parsed.lookup("x") is None


@pytest.mark.parametrize(
    "text",
    [
        "hmac-sha256 zz\n",
        "hmac-sha256 00\n",  # too short
        f"{'a' * 64} t\nhmac-sha256 {'00' * 32}\n",  # salt after entries
        "sk-my-secret-key tenant extra\n",
    ],
)
def test_malformed_files_are_refused_without_echoing_a_line(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_keys_text(text)
    assert "sk-my-secret-key" not in str(err.value)
