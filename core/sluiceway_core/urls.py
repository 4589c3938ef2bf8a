"""Base URLs that a component may read, and how two spellings of one URL are compared. Pure.

An address that comes from an object someone else writes (a ScaledObject's trigger metadata, an
InferenceService's ``spec.autoscaling.prometheusAddress``) is a request to fetch: without a check its
author makes the scaler or the operator fetch any URL (SSRF) and read the answer. Both components
hold an allow-list of normalised base URLs (:class:`UrlAllowList`) and fetch an address only when
:func:`normalise_url` of it equals an entry. Nothing is allowed by default, loopback included.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["UrlAllowList", "normalise_all", "normalise_url"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalise_url(url: str) -> str:
    """``scheme://host:port[/path]``, lower-cased, explicit port, no trailing slash. Raises ValueError
    for anything but a plain http(s) URL (no credentials, query or fragment)."""
    u = urlsplit(url.strip())
    scheme = u.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not u.hostname:
        raise ValueError(f"must be an http(s) URL with a host, got {url!r}")
    if u.username is not None or u.password is not None:
        raise ValueError(f"must not carry credentials, got {url!r}")
    if u.query or u.fragment:
        raise ValueError(f"must not have a query or fragment, got {url!r}")
    port = u.port or _DEFAULT_PORTS[scheme]  # u.port raises ValueError when out of range
    host = u.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}{u.path.rstrip('/')}"


def normalise_all(flag: str, urls: Iterable[str]) -> frozenset[str]:
    """Every URL normalised. Raises ValueError naming ``flag`` (the setting they came from)."""
    out = set()
    for url in urls:
        try:
            out.add(normalise_url(url))
        except ValueError as e:
            raise ValueError(f"{flag}: {e}") from None
    return frozenset(out)


@dataclass(frozen=True)
class UrlAllowList:
    """Normalised base URLs that may be read. Empty allows nothing."""

    urls: frozenset[str] = frozenset()

    @classmethod
    def build(cls, flag: str, urls: Iterable[str]) -> UrlAllowList:
        """From a setting's values. Raises ValueError naming ``flag`` for a malformed URL."""
        return cls(normalise_all(flag, urls))

    def allows(self, url: str) -> bool:
        """True when ``url`` is well-formed and, normalised, equal to an entry."""
        try:
            return normalise_url(url) in self.urls
        except ValueError:
            return False

    def describe(self) -> str:
        """For error messages: which URLs are allowed (these are configuration, not secrets)."""
        return f"only {', '.join(sorted(self.urls))}" if self.urls else "none"
