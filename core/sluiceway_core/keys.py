"""Tenant API keys: the one hashing rule shared by the operator (writes the key-hash Secret) and the
pod (checks presented keys). Keys themselves are never stored, logged or exported."""

from __future__ import annotations

import hashlib

__all__ = ["hash_key"]


def hash_key(key: str) -> str:
    """SHA-256 of the UTF-8 key, lower-case hex (64 characters)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()
