"""How the components authenticate to Prometheus: the one file format, loaded with one call. Pure
parsing plus file reads; no network.

The scaler reads it from ``--prometheus-auth-file``, the operator from ``SLUICEWAY_PROMETHEUS_AUTH_FILE``
(the chart renders it into a ConfigMap and mounts the Secrets it names). YAML or JSON (JSON is YAML)::

    prometheus:
      - url: https://mimir.example:443/prometheus   # a base URL, compared after normalise_url
        bearerTokenFile: /etc/sluiceway/prometheus-auth/secrets/mimir/token
        headers: {X-Scope-OrgID: team-a}          # custom headers (Mimir/Cortex tenants)
      - url: https://prometheus.monitoring.svc:9090
        basicAuth:
          username: sluiceway                      # or usernameFile
          passwordFile: /etc/.../password
        tls:
          caFile: /etc/.../ca.crt                  # verify the server with this CA (else the system's)
          certFile: /etc/.../tls.crt               # client certificate (TLS client auth) ...
          keyFile: /etc/.../tls.key                # ... and its key, together

What KEDA's Prometheus trigger offers (bearer, basic, TLS client auth, custom headers, a CA), per
Prometheus base URL. An entry applies only to an address the caller's allow-list also admits: this
file adds credentials, never addresses. Secrets are never in the file, only the paths of files
mounted from Secrets; they are read when used (a rotated Secret takes effect without a restart)
and never appear in an error message, a log line or a ``repr``. Unknown keys, a bearer token
together with basic auth, an ``Authorization`` header beside either, a header with a line break,
TLS settings for an ``http://`` URL, a certificate without its key and a file that cannot be read
are refused at load time with a message naming the entry and the key.

Concurrency: :class:`PromAuth` is immutable after :func:`load_prom_auth`; :meth:`Credentials.request`
may be called from any number of threads (the TLS context cache is guarded by a lock).
"""

from __future__ import annotations

import base64
import os
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sluiceway_core.urls import normalise_url

__all__ = ["Credentials", "PromAuth", "PromAuthError", "load_prom_auth", "parse_prom_auth"]

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
_ENTRY_KEYS = {"url", "bearerTokenFile", "basicAuth", "tls", "headers"}
_BASIC_KEYS = {"username", "usernameFile", "passwordFile"}
_TLS_KEYS = {"caFile", "certFile", "keyFile"}
#: Larger secret files are refused (a token, a password or a PEM bundle is far smaller).
MAX_SECRET_BYTES = 1 << 20


class PromAuthError(ValueError):
    """The auth file is malformed or names a file that cannot be read. The message names the entry
    and the key, never a secret's content."""


def _read_secret(path: Path, what: str) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except OSError as e:
        raise PromAuthError(f"{what}: cannot read {path}: {e.strerror or type(e).__name__}") from None
    if len(data) > MAX_SECRET_BYTES:
        raise PromAuthError(f"{what}: {path} is larger than {MAX_SECRET_BYTES} bytes")
    try:
        text = data.decode().strip()
    except UnicodeDecodeError:
        raise PromAuthError(f"{what}: {path} is not UTF-8") from None
    if not text or "\n" in text or "\r" in text:
        raise PromAuthError(f"{what}: {path} must hold one non-empty line")
    return text


@dataclass(frozen=True)
class Credentials:
    """How to call one Prometheus base URL. Holds file paths, never secret values."""

    url: str
    bearer_token_file: Path | None = None
    username: str | None = None
    username_file: Path | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    headers: tuple[tuple[str, str], ...] = ()
    _ssl: dict[tuple[float, ...], ssl.SSLContext] = field(default_factory=dict, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def uses_tls_settings(self) -> bool:
        return self.ca_file is not None or self.cert_file is not None

    def request(self) -> tuple[dict[str, str], ssl.SSLContext | None]:
        """(headers, TLS context or None) for one request, reading the secret files now. Raises
        :class:`PromAuthError` (naming the file, not its content) when one cannot be read."""
        headers = dict(self.headers)
        if self.bearer_token_file is not None:
            headers["Authorization"] = "Bearer " + _read_secret(self.bearer_token_file, f"{self.url} bearerTokenFile")
        if self.password_file is not None:
            user = self.username
            if self.username_file is not None:
                user = _read_secret(self.username_file, f"{self.url} basicAuth.usernameFile")
            password = _read_secret(self.password_file, f"{self.url} basicAuth.passwordFile")
            pair = f"{user or ''}:{password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        return headers, self._context()

    def _context(self) -> ssl.SSLContext | None:
        if not self.uses_tls_settings:
            return None
        files = [p for p in (self.ca_file, self.cert_file, self.key_file) if p is not None]
        try:
            stamp = tuple(os.stat(p).st_mtime for p in files)
        except OSError as e:
            raise PromAuthError(f"{self.url} tls: cannot read {e.filename}: {e.strerror}") from None
        with self._lock:
            ctx = self._ssl.get(stamp)
            if ctx is None:
                ctx = self._build_context()
                self._ssl.clear()  # one context per credentials: the newest files
                self._ssl[stamp] = ctx
            return ctx

    def _build_context(self) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file is not None else None)
            if self.cert_file is not None and self.key_file is not None:
                ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (OSError, ssl.SSLError) as e:
            raise PromAuthError(
                f"{self.url} tls: the CA, certificate or key cannot be loaded ({type(e).__name__})"
            ) from None
        return ctx

    def check(self) -> None:
        """Read every file once (at load time): a missing Secret fails at start, not at the first query."""
        self.request()


@dataclass(frozen=True)
class PromAuth:
    """Credentials by normalised base URL. Empty: every Prometheus is called without credentials."""

    by_url: Mapping[str, Credentials] = field(default_factory=dict)

    def for_url(self, address: str) -> Credentials | None:
        """The credentials of ``address`` (compared after :func:`normalise_url`), or None."""
        try:
            return self.by_url.get(normalise_url(address))
        except ValueError:
            return None

    def describe(self) -> str:
        """For start-up logs: the URLs and what each uses (kinds, never values)."""
        parts = []
        for url, c in sorted(self.by_url.items()):
            kinds = [
                k
                for k, on in (
                    ("bearer", c.bearer_token_file is not None),
                    ("basic", c.password_file is not None),
                    ("ca", c.ca_file is not None),
                    ("client-cert", c.cert_file is not None),
                    (f"headers {','.join(n for n, _ in c.headers)}", bool(c.headers)),
                )
                if on
            ]
            parts.append(f"{url} ({'; '.join(kinds) or 'none'})")
        return ", ".join(parts) or "none"


def _path(entry: Mapping[str, Any], key: str, where: str, base: Path) -> Path | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise PromAuthError(f"{where}.{key}: must be a file path")
    p = Path(value)
    return p if p.is_absolute() else base / p


def _entry(raw: Any, index: int, base: Path) -> Credentials:
    where = f"prometheus[{index}]"
    if not isinstance(raw, dict):
        raise PromAuthError(f"{where}: must be a mapping")
    unknown = set(raw) - _ENTRY_KEYS
    if unknown:
        raise PromAuthError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(_ENTRY_KEYS)})")
    url = raw.get("url")
    if not isinstance(url, str):
        raise PromAuthError(f"{where}.url: required, a Prometheus base URL")
    try:
        url = normalise_url(url)
    except ValueError as e:
        raise PromAuthError(f"{where}.url: {e}") from None
    where = f"{where} ({url})"
    basic = raw.get("basicAuth") or {}
    tls = raw.get("tls") or {}
    headers_raw = raw.get("headers") or {}
    for name, value, keys in (("basicAuth", basic, _BASIC_KEYS), ("tls", tls, _TLS_KEYS)):
        if not isinstance(value, dict):
            raise PromAuthError(f"{where}.{name}: must be a mapping")
        if set(value) - keys:
            raise PromAuthError(f"{where}.{name}: unknown keys {sorted(set(value) - keys)} (known: {sorted(keys)})")
    if not isinstance(headers_raw, dict):
        raise PromAuthError(f"{where}.headers: must be a mapping of header name to value")
    headers: list[tuple[str, str]] = []
    for name, value in headers_raw.items():
        if not isinstance(name, str) or not _TOKEN.match(name):
            raise PromAuthError(f"{where}.headers: {name!r} is not an HTTP header name")
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise PromAuthError(f"{where}.headers.{name}: must be a string without line breaks")
        headers.append((name, value))
    bearer = _path(raw, "bearerTokenFile", where, base)
    if bearer is not None and basic:
        raise PromAuthError(f"{where}: bearerTokenFile and basicAuth exclude each other")
    if basic and "passwordFile" not in basic:
        raise PromAuthError(f"{where}.basicAuth: passwordFile is required")
    username = basic.get("username")
    if username is not None and (not isinstance(username, str) or ":" in username):
        raise PromAuthError(f"{where}.basicAuth.username: must be a string without ':'")
    if username is not None and "usernameFile" in basic:
        raise PromAuthError(f"{where}.basicAuth: username and usernameFile exclude each other")
    if (bearer is not None or basic) and any(n.lower() == "authorization" for n, _ in headers):
        raise PromAuthError(f"{where}.headers: Authorization is set by bearerTokenFile/basicAuth")
    if tls and not url.startswith("https://"):
        raise PromAuthError(f"{where}.tls: only for an https:// URL")
    if ("certFile" in tls) != ("keyFile" in tls):
        raise PromAuthError(f"{where}.tls: certFile and keyFile go together")
    creds = Credentials(
        url=url,
        bearer_token_file=bearer,
        username=username,
        username_file=_path(basic, "usernameFile", f"{where}.basicAuth", base),
        password_file=_path(basic, "passwordFile", f"{where}.basicAuth", base),
        ca_file=_path(tls, "caFile", f"{where}.tls", base),
        cert_file=_path(tls, "certFile", f"{where}.tls", base),
        key_file=_path(tls, "keyFile", f"{where}.tls", base),
        headers=tuple(headers),
    )
    creds.check()
    return creds


def parse_prom_auth(doc: Any, base: Path = Path("/")) -> PromAuth:
    """A parsed document (see the module docstring) -> :class:`PromAuth`; every file it names is
    read once. Relative paths are taken from ``base``. Raises :class:`PromAuthError`."""
    if doc is None:
        return PromAuth()
    if not isinstance(doc, dict) or set(doc) - {"prometheus"}:
        raise PromAuthError("the Prometheus auth file must be a mapping with the one key 'prometheus'")
    entries = doc.get("prometheus") or []
    if not isinstance(entries, list):
        raise PromAuthError("prometheus: must be a list of entries")
    by_url: dict[str, Credentials] = {}
    for i, raw in enumerate(entries):
        creds = _entry(raw, i, base)
        if creds.url in by_url:
            raise PromAuthError(f"prometheus[{i}].url: {creds.url} is listed twice")
        by_url[creds.url] = creds
    return PromAuth(by_url)


def load_prom_auth(path: Path | str) -> PromAuth:
    """The one call: read and check the auth file at ``path`` (YAML or JSON). Raises
    :class:`PromAuthError` with a message naming the file and the entry."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise PromAuthError(f"Prometheus auth file {p}: {e.strerror or type(e).__name__}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise PromAuthError(f"Prometheus auth file {p}: not YAML/JSON{where}") from None
    try:
        return parse_prom_auth(doc, p.parent)
    except PromAuthError as e:
        raise PromAuthError(f"Prometheus auth file {p}: {e}") from None
