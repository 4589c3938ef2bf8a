"""Tenant API keys: the one hashing rule shared by the operator (writes the key-hash Secret), the pod
(checks presented keys) and any other component that checks a key. Keys themselves are never
stored, logged or exported.

A stored hash is ``HMAC-SHA256(salt, key)`` with a random per-service ``salt`` (:func:`new_salt`,
:data:`SALT_BYTES`), so one key used by two services hashes differently and no table computed in
advance applies. The salt is not secret (the pod needs it); it is kept across reconciles (the
operator reads it back from the Secret it rendered) so that the hashes, and the pods, do not
change on every reconcile.

The keys file (``keys.txt``)::

    hmac-sha256 <salt, hex>
    <hmac hex> <tenant>
    ...

A file without the ``hmac-sha256`` line holds plain SHA-256 hashes (the legacy, hand-written form;
the operator never renders it). Pure: no I/O, safe from any thread.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["SALT_BYTES", "KeyFile", "hash_key", "key_matches", "keys_text", "new_salt", "parse_keys_text"]

SALT_BYTES = 32
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SALT_LINE = "hmac-sha256"


def new_salt() -> bytes:
    """A fresh random salt for one service."""
    return secrets.token_bytes(SALT_BYTES)


def hash_key(key: str, salt: bytes | None) -> str:
    """``HMAC-SHA256(salt, key)`` in lower-case hex; plain SHA-256 when ``salt`` is None (legacy)."""
    data = key.encode("utf-8")
    if salt is None:
        return hashlib.sha256(data).hexdigest()
    return hmac.new(salt, data, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class KeyFile:
    """A parsed keys file: the salt (None: legacy plain SHA-256) and ``(hash bytes, tenant)`` pairs."""

    salt: bytes | None
    entries: tuple[tuple[bytes, str], ...]

    def lookup(self, key: str) -> str | None:
        """The tenant whose hash matches ``key``. Every entry is compared with
        :func:`hmac.compare_digest` (no early exit): the time does not depend on which one matched."""
        digest = bytes.fromhex(hash_key(key, self.salt))
        found: str | None = None
        for stored, tenant in self.entries:
            if hmac.compare_digest(stored, digest):
                found = tenant
        return found


def key_matches(key: str, salt: bytes | None, digest_hex: str) -> bool:
    """Whether ``key`` hashes to ``digest_hex`` under ``salt`` (constant time)."""
    return hmac.compare_digest(hash_key(key, salt), digest_hex.lower())


def keys_text(salt: bytes, hashes: Mapping[str, str]) -> str:
    """The salted keys file: the salt line, then ``<hash> <tenant>`` sorted by tenant."""
    return f"{_SALT_LINE} {salt.hex()}\n" + "".join(f"{h} {t}\n" for t, h in sorted(hashes.items()))


def parse_keys_text(text: str) -> KeyFile:
    """Parse a keys file. Raises ValueError naming the line (never its content: a line may be a key
    pasted by mistake)."""
    salt: bytes | None = None
    entries: list[tuple[bytes, str]] = []
    lines: Iterable[tuple[int, str]] = enumerate(text.splitlines(), 1)
    for n, raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) == 2 and parts[0] == _SALT_LINE:
            if salt is not None or entries:
                raise ValueError(f"keys file line {n}: the '{_SALT_LINE} <salt>' line must come first, once")
            try:
                salt = bytes.fromhex(parts[1])
            except ValueError:
                raise ValueError(f"keys file line {n}: the salt must be hex") from None
            if len(salt) < 16:
                raise ValueError(f"keys file line {n}: the salt must be at least 16 bytes")
            continue
        if len(parts) != 2 or not _HEX64.fullmatch(parts[0].lower()):
            raise ValueError(f"keys file line {n}: expected '<hash-hex> <tenant>'")
        entries.append((bytes.fromhex(parts[0]), parts[1]))
    return KeyFile(salt, tuple(entries))
