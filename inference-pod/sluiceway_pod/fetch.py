"""The storage initializer: ``sluiceway-pod fetch`` downloads a model into a directory before the pod starts.

    sluiceway-pod fetch --uri URI --dest DIR [--sha256 HEX | --sha256 NAME=HEX ...] [--max-bytes N]

Stores:
    ``http(s)://host/path/file``   one file; ``Range`` resumes a broken download
    ``s3://bucket/key``            one object, or every object under ``key/`` (ListObjectsV2), kept
                                   relative to the prefix; any S3-compatible store: ``--endpoint``
                                   (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``), ``--region``
                                   (``AWS_REGION``/``AWS_DEFAULT_REGION``, default us-east-1),
                                   ``--addressing path|virtual``; requests are signed with SigV4
    ``oci://host[:port]/repo[/more]:tag``  an OCI artifact (``@sha256:<hex>`` in place of ``:tag``
                                   pins the manifest) from a registry speaking the OCI distribution
                                   API, in the layout ``oras push`` writes: each layer with an
                                   ``org.opencontainers.image.title`` annotation is one file of that
                                   name, its blob verified against the layer's digest. Anonymous,
                                   Basic or Bearer (the token dance) auth; https unless the URI is
                                   ``oci+http://`` (a registry without TLS, on a trusted network)
    https: the system's CAs, or ``--ca-file`` (``AWS_CA_BUNDLE``) for a private store's CA

Credentials: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN`` from the
environment, or from files of those names in ``--credentials-dir`` (a mounted Secret whose keys
are those names). None -> unsigned requests (a public bucket). A registry's: ``REGISTRY_USERNAME``/
``REGISTRY_PASSWORD``, from the same directory or the environment. They never appear in any output:
store messages are reduced to their code and message and scrubbed of every credential (and of a
registry's token), and URLs are printed without user info or query string.

Each file is written to ``NAME.part`` and renamed when complete and verified. A broken transfer is
retried (``--retries``, exponential backoff) from where it stopped with ``Range``; a ``.part`` left by
an earlier run (an init container restarted on the same ``emptyDir``) resumes too. A finished fetch
writes ``.sluiceway-fetched`` (the URI and each file's sha256), and a later fetch of the same URI into
the same directory is a no-op (a node cache directory). Every successful fetch, a no-op included,
also writes ``.sluiceway-fetch-times.json`` (its wall-clock start and end), which the pod reports as
its ``fetched`` start phase (:mod:`sluiceway_pod.startphases`).

Failures print one line, ``sluiceway-pod fetch: failed (REASON): DETAIL``, and exit with the
reason's code (:data:`EXIT_CODES`); ``--termination-log`` also writes that line there, for the
operator's ``ModelFetchFailed`` condition.

Concurrency: one thread, one file at a time; time comes from an injected clock and sleep.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import errno
import hashlib
import hmac
import http.client
import json
import os
import re
import socket
import ssl
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO
from urllib.parse import quote, unquote, urljoin, urlsplit

from .startphases import FETCH_RECORD

EXIT_CODES = {
    "no-such-key": 10,
    "access-denied": 11,
    "digest-mismatch": 12,
    "out-of-space": 13,
    "store-unreachable": 14,
    "store-error": 15,
    "bad-request": 2,
}
MARKER = ".sluiceway-fetched"
CHUNK = 256 * 1024


class FetchError(Exception):
    """A fetch that cannot finish. ``reason`` is a key of :data:`EXIT_CODES`; ``retry`` marks the
    transient kind (connection refused or reset, timeout, 5xx, a short body)."""

    def __init__(self, reason: str, detail: str, retry: bool = False) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.retry = retry

    def line(self) -> str:
        return f"sluiceway-pod fetch: failed ({self.reason}): {self.detail}"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None = None

    def scrub(self, text: str) -> str:
        for s in (self.secret_key, self.access_key, self.token):
            if s:
                text = text.replace(s, "***")
        return text


def load_credentials(env: Mapping[str, str], credentials_dir: str | None) -> Credentials | None:
    """From ``credentials_dir`` files when given (a mounted Secret), else the environment."""
    values: dict[str, str] = {}
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    if credentials_dir:
        for n in names:
            f = Path(credentials_dir) / n
            if f.is_file():
                values[n] = f.read_text().strip()
    else:
        values = {n: env[n] for n in names if env.get(n)}
    if not values.get("AWS_ACCESS_KEY_ID") or not values.get("AWS_SECRET_ACCESS_KEY"):
        if values:
            raise FetchError("bad-request", "credentials need both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        return None
    return Credentials(values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"], values.get("AWS_SESSION_TOKEN"))


@dataclass(frozen=True)
class RegistryCredentials:
    """A registry's user and password (Basic, or Basic to its token service)."""

    username: str
    password: str

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def secrets(self) -> list[str]:
        return [self.password, self.username, self.basic().split(" ", 1)[1]]


def load_registry_credentials(env: Mapping[str, str], credentials_dir: str | None) -> RegistryCredentials | None:
    """``REGISTRY_USERNAME``/``REGISTRY_PASSWORD`` from ``credentials_dir`` files when given (a
    mounted Secret), else the environment; both or neither."""
    names = ("REGISTRY_USERNAME", "REGISTRY_PASSWORD")
    values: dict[str, str] = {}
    if credentials_dir:
        for n in names:
            f = Path(credentials_dir) / n
            if f.is_file():
                values[n] = f.read_text().strip()
    else:
        values = {n: env[n] for n in names if env.get(n)}
    if not values:
        return None
    if not values.get("REGISTRY_USERNAME") or not values.get("REGISTRY_PASSWORD"):
        raise FetchError("bad-request", "registry credentials need both REGISTRY_USERNAME and REGISTRY_PASSWORD")
    return RegistryCredentials(values["REGISTRY_USERNAME"], values["REGISTRY_PASSWORD"])


# ---------------------------------------------------------------- OCI references and manifests (pure)

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_ARTIFACT = "application/vnd.oci.artifact.manifest.v1+json"
OCI_INDEXES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
TITLE = "org.opencontainers.image.title"
MAX_MANIFEST = 4 * 1024 * 1024  # what the distribution registry itself accepts
_REPO = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class OciRef:
    """``oci://host[:port]/repo:tag`` or ``…/repo@sha256:<hex>`` (``oci+http://``: no TLS)."""

    scheme: str  # the registry's: https, or http for oci+http://
    host: str  # host[:port]
    repository: str
    reference: str  # a tag, or sha256:<hex>

    @property
    def pinned(self) -> bool:
        return self.reference.startswith("sha256:")


def parse_oci(uri: str, insecure: bool = False) -> OciRef:
    """Parse an ``oci://`` URI; :class:`FetchError` ``bad-request`` names what is wrong."""
    u = urlsplit(uri)
    if u.scheme not in ("oci", "oci+http"):
        raise FetchError("bad-request", f"not an oci:// URI: {u.scheme!r}")
    if "@" in u.netloc:
        raise FetchError("bad-request", "oci:// URI with user info: give REGISTRY_USERNAME/REGISTRY_PASSWORD instead")
    if not u.netloc or u.query or u.fragment:
        raise FetchError("bad-request", "oci:// URI must be oci://host[:port]/repository:tag (or @sha256:<hex>)")
    path = u.path.lstrip("/")
    if "@" in path:
        repo, _, ref = path.partition("@")
        if not _SHA256.fullmatch(ref):
            raise FetchError("bad-request", f"oci:// digest {ref!r}: expected sha256:<64 lowercase hex>")
    else:
        repo, sep, ref = path.rpartition(":")
        if not sep or "/" in ref:
            raise FetchError(
                "bad-request", f"oci://{u.netloc}/{path}: name a tag (repository:tag) or a digest (@sha256:...)"
            )
        if not _TAG.fullmatch(ref):
            raise FetchError("bad-request", f"oci:// tag {ref!r} is not a valid tag")
    if not _REPO.fullmatch(repo):
        raise FetchError("bad-request", f"oci:// repository {repo!r} is not a valid name (lowercase, '/'-separated)")
    scheme = "http" if insecure or u.scheme == "oci+http" else "https"
    return OciRef(scheme, u.netloc, repo, ref)


@dataclass(frozen=True)
class OciFile:
    name: str  # the layer's title: the file's name under dest
    digest: str  # sha256 hex of the blob
    size: int


def oci_layout(body: bytes, content_type: str) -> list[OciFile]:
    """The files of an ORAS-style manifest: each layer (``blobs`` of an artifact manifest) with an
    ``org.opencontainers.image.title`` annotation is one file of that name. Anything else (an
    index, a layer without a title, a title that is a path, a directory layer) is ``store-error``."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise FetchError("store-error", "the manifest is not JSON") from None
    if not isinstance(doc, dict):
        raise FetchError("store-error", "the manifest is not a JSON object")
    media = doc.get("mediaType") or content_type.split(";")[0].strip()
    if media in OCI_INDEXES:
        raise FetchError("store-error", f"the reference names an index ({media}): name one manifest by its digest")
    if media == OCI_ARTIFACT:
        layers = doc.get("blobs")
    elif media == OCI_MANIFEST:
        layers = doc.get("layers")
    else:
        raise FetchError("store-error", f"unsupported manifest media type {media!r}: expected {OCI_MANIFEST}")
    if not isinstance(layers, list) or not layers:
        raise FetchError("store-error", "the manifest has no layers")
    files: list[OciFile] = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise FetchError("store-error", f"layer {i} is not an object")
        notes = layer.get("annotations") or {}
        title = notes.get(TITLE) if isinstance(notes, dict) else None
        digest, size = layer.get("digest"), layer.get("size")
        if not isinstance(title, str) or not title:
            raise FetchError(
                "store-error", f"layer {i} ({digest}) has no {TITLE} annotation: push files with oras push"
            )
        if "/" in title or "\\" in title or title in (".", "..") or "\0" in title or title.startswith(".sluiceway"):
            raise FetchError("store-error", f"layer {i} title {title!r} is not a plain file name")
        if str(notes.get("io.deis.oras.content.unpack", "")).lower() == "true":
            raise FetchError("store-error", f"layer {i} ({title!r}) is a directory archive: push its files one by one")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise FetchError("store-error", f"layer {i} ({title!r}) digest {digest!r}: only sha256 is supported")
        if not isinstance(size, int) or size < 0:
            raise FetchError("store-error", f"layer {i} ({title!r}) has no valid size")
        if any(f.name == title for f in files):
            raise FetchError("store-error", f"two layers are titled {title!r}")
        files.append(OciFile(title, digest.split(":", 1)[1], size))
    return files


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``WWW-Authenticate: Bearer realm="…",service="…",scope="…"`` -> ("bearer", {realm: …, …})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'([A-Za-z_]+)\s*=\s*"([^"]*)"', rest)}
    for k, v in re.findall(r'([A-Za-z_]+)\s*=\s*([^",\s]+)', rest):
        params.setdefault(k.lower(), v)
    return scheme.lower(), params


# ---------------------------------------------------------------- SigV4 (pure)


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def sigv4_headers(
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    creds: Credentials,
    region: str,
    now: dt.datetime,
    service: str = "s3",
    body: bytes = b"",
) -> dict[str, str]:
    """The headers that sign a request with AWS Signature Version 4 (``path`` already URI-encoded,
    as sent; ``body`` the payload, empty for GET/HEAD)."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    payload = hashlib.sha256(body).hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    if creds.token:
        headers["x-amz-security-token"] = creds.token
    signed = ";".join(sorted(headers))
    canonical_query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items()))
    canonical = "\n".join(
        [
            method,
            path,
            canonical_query,
            "".join(f"{k}:{headers[k].strip()}\n" for k in sorted(headers)),
            signed,
            payload,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{creds.secret_key}".encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
    del headers["host"]
    return headers


# ---------------------------------------------------------------- one HTTP exchange


@dataclass
class Target:
    """One request: where, and the headers that go with it (signed ones included)."""

    scheme: str
    host: str  # host[:port]
    path: str  # URI-encoded
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def shown(self) -> str:
        """The URL for messages: no user info, no query string (signatures and tokens live there)."""
        return f"{self.scheme}://{self.host.rsplit('@', 1)[-1]}{self.path.split('?', 1)[0]}"


def _connect(t: Target, timeout: float, ca_file: str | None) -> http.client.HTTPConnection:
    host = t.host.rsplit("@", 1)[-1]
    if t.scheme == "https":
        context = ssl.create_default_context(cafile=ca_file)
        return http.client.HTTPSConnection(host, timeout=timeout, context=context)
    return http.client.HTTPConnection(host, timeout=timeout)


def _transient(e: BaseException) -> bool:
    """A failure worth retrying: the network, not a certificate nobody trusts."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return False
    return isinstance(e, (ConnectionError, TimeoutError, socket.timeout, http.client.HTTPException, OSError))


# ---------------------------------------------------------------- the fetcher


@dataclass
class Options:
    uri: str
    dest: str
    sha256: dict[str, str] = field(default_factory=dict)  # relative name (or "" for the one file) -> hex
    max_bytes: int | None = None
    endpoint: str | None = None
    region: str = "us-east-1"
    addressing: str = "path"
    credentials: Credentials | None = None
    retries: int = 5
    backoff: float = 0.5
    timeout: float = 30.0
    limit_rate: int | None = None  # bytes per second, None for unlimited
    ca_file: str | None = None  # PEM bundle trusted for https (a private store's CA)
    registry_credentials: RegistryCredentials | None = None  # oci:// Basic, or Basic to the token service
    insecure_registry: bool = False  # oci:// over plain http (as oci+http:// does)
    progress_every: float = 2.0  # seconds between progress lines


@dataclass(frozen=True)
class Item:
    name: str  # relative path under dest
    target: Target
    size: int | None
    sha256: str | None = None  # what the store itself says the content's digest is (an OCI layer's)


class Fetcher:
    """Downloads ``Options.uri`` into ``Options.dest``. One thread; ``clock``/``sleep`` injected."""

    def __init__(
        self,
        opts: Options,
        out: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        utcnow: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.o = opts
        self.out = out or sys.stdout
        self.clock, self.sleep, self.utcnow = clock, sleep, utcnow
        self.dest = Path(opts.dest)
        self._written = 0  # bytes on disk under dest for this fetch (size limit)
        self._oci: OciRef | None = None
        self._oci_auth: str | None = None  # the Authorization header the registry accepted
        self._oci_manifest: str | None = None  # sha256 hex of the manifest fetched
        self._oci_items: list[Item] | None = None

    # -- messages
    def _scrub(self, text: str) -> str:
        if self.o.credentials:
            text = self.o.credentials.scrub(text)
        secrets = self.o.registry_credentials.secrets() if self.o.registry_credentials else []
        if self._oci_auth:
            secrets.append(self._oci_auth.split(" ", 1)[-1])
        for secret in sorted(secrets, key=len, reverse=True):
            if secret:
                text = text.replace(secret, "***")
        return text

    def say(self, line: str) -> None:
        print(self._scrub(line), file=self.out, flush=True)

    def _fail(self, reason: str, detail: str, retry: bool = False) -> FetchError:
        return FetchError(reason, self._scrub(detail), retry)

    # -- addressing
    def _s3_target(self, bucket: str, key: str, query: dict[str, str] | None = None) -> Target:
        endpoint = self.o.endpoint or "https://s3.amazonaws.com"
        u = urlsplit(endpoint)
        base = u.path.rstrip("/")
        if self.o.addressing == "virtual":
            host, path = f"{bucket}.{u.netloc}", f"{base}/{quote(key, safe='/-_.~')}"
        else:
            host, path = u.netloc, f"{base}/{quote(bucket, safe='-_.~')}/{quote(key, safe='/-_.~')}"
        return Target(u.scheme, host, path, dict(query or {}))

    def _sign(self, method: str, t: Target) -> dict[str, str]:
        if self.o.credentials is None or not self.o.uri.startswith("s3://"):
            return {}
        return sigv4_headers(method, t.host, t.path, t.query, self.o.credentials, self.o.region, self.utcnow())

    # -- requests
    def _request(
        self, method: str, t: Target, extra: dict[str, str] | None = None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        q = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(t.query.items()))
        conn = _connect(t, self.o.timeout, self.o.ca_file)
        headers = {**t.headers, **(extra or {}), **self._sign(method, t), "user-agent": "sluiceway-pod-fetch"}
        if self._oci_auth and self._oci is not None and t.host == self._oci.host and t.scheme == self._oci.scheme:
            headers.setdefault("authorization", self._oci_auth)  # the registry's own host only
        try:
            conn.request(method, t.path + (f"?{q}" if q else ""), headers=headers)
            resp = conn.getresponse()
        except Exception as e:
            conn.close()
            if isinstance(e, ssl.SSLCertVerificationError):
                raise self._fail(
                    "store-error", f"{t.shown()}: TLS certificate not trusted ({e.verify_message}): see --ca-file"
                ) from None
            if _transient(e):
                raise self._fail("store-unreachable", f"{t.shown()}: {type(e).__name__}: {e}", retry=True) from None
            raise
        return conn, resp

    def _get(self, t: Target, extra: dict[str, str]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """GET, following up to 5 redirects of an http(s) store (a CDN behind a release URL). The
        basic-auth header goes only to the host that was named; signed S3 requests are not redirected.
        A registry's 401 is answered once per call with its challenge (:meth:`_authenticate`)."""
        authenticated = False
        for _ in range(7):
            conn, resp = self._request("GET", t, extra)
            if resp.status == 401 and not authenticated and self._oci is not None and t.host == self._oci.host:
                challenge = resp.getheader("www-authenticate") or ""
                resp.read()
                conn.close()
                self._authenticate(challenge, t)
                authenticated = True
                continue
            location = resp.getheader("location")
            if resp.status not in (301, 302, 303, 307, 308) or not location or self.o.uri.startswith("s3://"):
                return conn, resp
            resp.read()
            conn.close()
            u = urlsplit(urljoin(f"{t.scheme}://{t.host.rsplit('@', 1)[-1]}{t.path}", location))
            if u.scheme not in ("http", "https"):
                raise self._fail("store-error", f"{t.shown()}: redirected to a {u.scheme!r} URL")
            headers = dict(t.headers) if u.netloc == t.host.rsplit("@", 1)[-1] else {}
            t = Target(u.scheme, u.netloc, (u.path or "/") + (f"?{u.query}" if u.query else ""), {}, headers)
        raise self._fail("store-error", f"{t.shown()}: more than 5 redirects")

    def _authenticate(self, challenge: str, t: Target) -> None:
        """Answer a registry's 401: Basic with the credentials, or Bearer: GET a token from the
        challenge's realm (with the credentials as Basic when there are any, anonymous otherwise)."""
        scheme, params = parse_challenge(challenge)
        creds = self.o.registry_credentials
        if scheme == "basic":
            if creds is None:
                raise self._fail(
                    "access-denied",
                    f"{t.shown()}: the registry needs credentials (REGISTRY_USERNAME/REGISTRY_PASSWORD)",
                )
            self._oci_auth = creds.basic()
            return
        if scheme != "bearer" or not params.get("realm"):
            raise self._fail("access-denied", f"{t.shown()}: HTTP 401 with an unsupported challenge {scheme!r}")
        realm = urlsplit(params["realm"])
        if realm.scheme not in ("http", "https") or not realm.netloc:
            raise self._fail("store-error", f"{t.shown()}: the token realm {params['realm']!r} is not an http(s) URL")
        if realm.scheme == "http" and t.scheme == "https" and creds is not None:
            raise self._fail(
                "store-error", f"{t.shown()}: the token realm is plain http; not sending credentials there"
            )
        query = {k: params[k] for k in ("service", "scope") if params.get(k)}
        if "scope" not in query and self._oci is not None:
            query["scope"] = f"repository:{self._oci.repository}:pull"
        if realm.query:
            query.update(dict(p.split("=", 1) for p in realm.query.split("&") if "=" in p))
        token_target = Target(realm.scheme, realm.netloc, realm.path or "/", query)
        if creds is not None:
            token_target.headers["authorization"] = creds.basic()
        conn, resp = self._request("GET", token_target)
        try:
            if resp.status != 200:
                err = self._store_error(token_target, resp)
                raise self._fail(err.reason, f"the token service: {err.detail}", err.retry)
            try:
                doc = json.loads(resp.read(1024 * 1024))
            except ValueError:
                raise self._fail("store-error", f"{token_target.shown()}: the token service answered no JSON") from None
        finally:
            conn.close()
        token = (doc.get("token") or doc.get("access_token")) if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise self._fail("store-error", f"{token_target.shown()}: the token service answered no token")
        self._oci_auth = f"Bearer {token}"

    def _store_error(self, t: Target, resp: http.client.HTTPResponse) -> FetchError:
        body = resp.read(64 * 1024)
        code = message = ""
        if body.lstrip().startswith(b"<"):
            try:
                root = ET.fromstring(body)
                code = root.findtext("Code") or ""
                message = root.findtext("Message") or ""
            except ET.ParseError:
                pass
        elif body.lstrip().startswith(b"{"):  # the distribution API's {"errors": [{"code", "message"}]}
            try:
                first = (json.loads(body).get("errors") or [{}])[0]
                code, message = str(first.get("code") or ""), str(first.get("message") or "")
            except (ValueError, AttributeError, IndexError, TypeError):
                pass
        what = f"{t.shown()}: HTTP {resp.status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
        if resp.status == 404 or code in ("NoSuchKey", "NoSuchBucket", "MANIFEST_UNKNOWN", "NAME_UNKNOWN"):
            return self._fail("no-such-key", what)
        if resp.status in (401, 403) or code in ("UNAUTHORIZED", "DENIED"):
            return self._fail("access-denied", what)
        if resp.status >= 500 or resp.status in (408, 429):
            return self._fail("store-unreachable", what, retry=True)
        return self._fail("store-error", what)

    def _with_retries(self, what: Callable[[], None]) -> None:
        attempt = 0
        while True:
            try:
                what()
                return
            except FetchError as e:
                if not e.retry or attempt >= self.o.retries:
                    if e.retry:
                        raise self._fail(e.reason, f"{e.detail} (gave up after {attempt + 1} attempts)") from None
                    raise
                delay = self.o.backoff * (2**attempt)
                attempt += 1
                self.say(f"fetch: {e.detail}; retry {attempt}/{self.o.retries} in {delay:.1f}s")
                self.sleep(delay)

    # -- listing
    def items(self) -> list[Item]:
        u = urlsplit(self.o.uri)
        if u.scheme in ("http", "https"):
            name = PurePosixPath(u.path).name or "model"
            path = u.path or "/"
            t = Target(u.scheme, u.netloc, quote(path, safe="/-_.~%"), {})
            if u.username is not None:  # user info in the URI: HTTP basic auth, never printed
                cred = base64.b64encode(f"{unquote(u.username)}:{unquote(u.password or '')}".encode()).decode()
                t.headers["authorization"] = f"Basic {cred}"
            if u.query:  # a presigned URL: the query travels as is and is never shown
                t.path += "?" + u.query
            return [Item(name, t, None)]
        if u.scheme in ("oci", "oci+http"):
            return self._oci_resolve()
        if u.scheme != "s3":
            raise self._fail("bad-request", f"unsupported URI scheme {u.scheme!r}: use s3://, http(s):// or oci://")
        bucket, key = u.netloc, u.path.lstrip("/")
        if not bucket:
            raise self._fail("bad-request", "s3:// URI without a bucket")
        listed: list[Item] = []
        if key and not key.endswith("/"):
            one = self._head(bucket, key)
            if one is not None:
                return [one]
        prefix = key if (not key or key.endswith("/")) else key + "/"
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            page: list[tuple[str, int]] = []
            next_token: list[str | None] = [None]

            def list_once(
                query: dict[str, str] = query,
                page: list[tuple[str, int]] = page,
                next_token: list[str | None] = next_token,
            ) -> None:
                t = self._s3_target(bucket, "", query)
                conn, resp = self._request("GET", t)
                try:
                    if resp.status != 200:
                        raise self._store_error(t, resp)
                    root = ET.fromstring(resp.read())
                finally:
                    conn.close()
                ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
                page.clear()
                for c in root.iter(f"{ns}Contents"):
                    page.append((c.findtext(f"{ns}Key") or "", int(c.findtext(f"{ns}Size") or 0)))
                truncated = (root.findtext(f"{ns}IsTruncated") or "false") == "true"
                next_token[0] = root.findtext(f"{ns}NextContinuationToken") if truncated else None

            self._with_retries(list_once)
            for k, size in page:
                rel = k[len(prefix) :]
                if not rel or k.endswith("/"):
                    continue
                if ".." in PurePosixPath(rel).parts or rel.startswith("/"):
                    raise self._fail("store-error", f"object key {k!r} would land outside the destination")
                listed.append(Item(rel, self._s3_target(bucket, k), size))
            token = next_token[0]
            if not token:
                break
        if not listed:
            raise self._fail("no-such-key", f"s3://{bucket}/{key}: no such key, and no objects under {prefix!r}")
        return listed

    def _oci_resolve(self) -> list[Item]:
        """GET the manifest (once per fetch) and list its files, each with the layer's digest."""
        if self._oci_items is not None:
            return self._oci_items
        ref = self._oci = parse_oci(self.o.uri, self.o.insecure_registry)
        base = f"/v2/{ref.repository}"
        t = Target(ref.scheme, ref.host, f"{base}/manifests/{ref.reference}")
        t.headers["accept"] = f"{OCI_MANIFEST}, {OCI_ARTIFACT}, {OCI_INDEXES[0]}"
        got: list[tuple[str, bytes]] = []

        def once() -> None:
            conn, resp = self._get(t, {})
            try:
                if resp.status != 200:
                    raise self._store_error(t, resp)
                body = resp.read(MAX_MANIFEST + 1)
                ctype = resp.getheader("content-type") or ""
            except (ConnectionError, TimeoutError, http.client.HTTPException) as e:
                raise self._fail("store-unreachable", f"{t.shown()}: {type(e).__name__}", retry=True) from None
            finally:
                conn.close()
            got[:] = [(ctype, body)]

        self._with_retries(once)
        ctype, body = got[0]
        if len(body) > MAX_MANIFEST:
            raise self._fail("store-error", f"{t.shown()}: the manifest is larger than {MAX_MANIFEST} bytes")
        hexd = hashlib.sha256(body).hexdigest()
        if ref.pinned and ref.reference != f"sha256:{hexd}":
            raise self._fail("digest-mismatch", f"{t.shown()}: the manifest's sha256 is {hexd}")
        self._oci_manifest = hexd
        files = oci_layout(body, ctype)
        self.say(f"fetch: manifest sha256:{hexd}, {len(files)} file(s)")
        self._oci_items = [
            Item(f.name, Target(ref.scheme, ref.host, f"{base}/blobs/sha256:{f.digest}"), f.size, f.digest)
            for f in files
        ]
        return self._oci_items

    def _head(self, bucket: str, key: str) -> Item | None:
        t = self._s3_target(bucket, key)
        found: list[Item | None] = [None]

        def head() -> None:
            conn, resp = self._request("HEAD", t)
            try:
                resp.read()
                if resp.status == 200:
                    length = resp.getheader("content-length")
                    found[0] = Item(PurePosixPath(key).name, t, int(length) if length else None)
                elif resp.status != 404:
                    raise self._fail(
                        "access-denied"
                        if resp.status in (401, 403)
                        else "store-unreachable"
                        if resp.status >= 500
                        else "store-error",
                        f"s3://{bucket}/{key}: HTTP {resp.status}",
                        retry=resp.status >= 500,
                    )
            finally:
                conn.close()

        self._with_retries(head)
        return found[0]

    # -- downloading
    def _check_space(self, more: int) -> None:
        if self.o.max_bytes is not None and self._written + more > self.o.max_bytes:
            raise self._fail(
                "out-of-space",
                f"the model needs more than --max-bytes {self.o.max_bytes} ({self._written + more} bytes so far)",
            )

    def _download(self, item: Item) -> str:
        final = self.dest / item.name
        part = final.with_name(final.name + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        state: dict[str, str | None] = {"etag": None}
        meta = final.with_name(final.name + ".part.json")
        if part.exists() and meta.exists():
            try:
                state["etag"] = json.loads(meta.read_text()).get("etag")
            except ValueError:
                part.unlink()
        elif part.exists():
            part.unlink()

        def once() -> None:
            have = part.stat().st_size if part.exists() else 0
            extra = {"range": f"bytes={have}-"} if have else {}
            if have and state["etag"]:
                extra["if-range"] = str(state["etag"])
            conn, resp = self._get(item.target, extra)
            try:
                if have and resp.status == 416:  # the .part is already whole
                    resp.read()
                    return
                if resp.status not in (200, 206):
                    raise self._store_error(item.target, resp)
                if have and resp.status == 206:
                    self.say(f"fetch: {item.name}: resuming at {have} bytes")
                    mode = "ab"
                else:
                    have, mode = 0, "wb"
                total_hdr = resp.getheader("content-length")
                total = have + int(total_hdr) if total_hdr else item.size
                if total is not None:
                    self._check_space(total)
                state["etag"] = resp.getheader("etag")
                meta.write_text(json.dumps({"etag": state["etag"]}))
                self._copy(item, resp, part, mode, have, total)
            finally:
                conn.close()

        self._with_retries(once)
        return self._finish(item, part, meta, final)

    def _copy(
        self, item: Item, resp: http.client.HTTPResponse, part: Path, mode: str, have: int, total: int | None
    ) -> None:
        t0 = last = self.clock()
        got = 0
        try:
            with part.open(mode) as fh:
                while True:
                    try:
                        chunk = resp.read1(CHUNK)  # what has arrived: a stall loses none of it
                    except Exception as e:
                        if _transient(e):
                            raise self._fail(
                                "store-unreachable",
                                f"{item.target.shown()}: the transfer broke at {have + got} bytes: {type(e).__name__}",
                                retry=True,
                            ) from None
                        raise
                    if not chunk:
                        break
                    if self.o.max_bytes is not None and self._written + have + got + len(chunk) > self.o.max_bytes:
                        self._check_space(have + got + len(chunk))
                    fh.write(chunk)
                    got += len(chunk)
                    now = self.clock()
                    if self.o.limit_rate:
                        ahead = got / self.o.limit_rate - (now - t0)
                        if ahead > 0:
                            self.sleep(ahead)
                            now = self.clock()
                    if now - last >= self.o.progress_every:
                        last = now
                        self.say(_progress(item.name, have + got, total, got / max(1e-6, now - t0)))
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._fail("out-of-space", f"{item.name}: the destination is full: {e.strerror}") from None
            raise
        if total is not None and have + got < total:
            raise self._fail(
                "store-unreachable",
                f"{item.target.shown()}: the transfer broke at {have + got} of {total} bytes",
                retry=True,
            )

    def _finish(self, item: Item, part: Path, meta: Path, final: Path) -> str:
        digest = hashlib.sha256()
        with part.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        hexd = digest.hexdigest()
        given = self.o.sha256.get(item.name) or self.o.sha256.get("")
        for want, whose in ((item.sha256, " (the manifest's digest)"), (given, "")):
            if want is not None and want.lower() != hexd:
                part.unlink()
                meta.unlink(missing_ok=True)
                raise self._fail("digest-mismatch", f"{item.name}: sha256 is {hexd}, expected {want.lower()}{whose}")
        want = given or item.sha256
        size = part.stat().st_size
        self._written += size
        part.replace(final)
        meta.unlink(missing_ok=True)
        self.say(f"fetch: {item.name}: {size} bytes, sha256 {hexd}" + (" (verified)" if want else ""))
        return hexd

    def _record_times(self, started: float, cached: bool) -> None:
        """The fetch's start and end (wall clock) for the pod's start phases
        (:data:`sluiceway_pod.startphases.FETCH_RECORD`). Best effort: a fetch never fails on it."""
        doc = {"started": started, "finished": self.utcnow().timestamp(), "bytes": self._written, "cached": cached}
        with contextlib.suppress(OSError):
            tmp = self.dest / (FETCH_RECORD + ".tmp")
            tmp.write_text(json.dumps(doc))
            tmp.replace(self.dest / FETCH_RECORD)

    def run(self) -> dict[str, str]:
        started = self.utcnow().timestamp()
        marker = self.dest / MARKER
        if marker.is_file():
            try:
                done = json.loads(marker.read_text())
            except ValueError:
                done = {}
            files = done.get("files", {})
            same = done.get("uri") == self.o.uri and all((self.dest / n).is_file() for n in files)
            if same and self.o.uri.startswith("oci") and not self.o.uri.partition("@")[2].startswith("sha256:"):
                self._oci_resolve()  # a tag moves: the same only while it names the manifest fetched then
                same = done.get("manifest") == self._oci_manifest
            wanted = {n or next(iter(files), ""): h for n, h in self.o.sha256.items()}
            if same and all(files.get(n) == h for n, h in wanted.items()):
                self.say(f"fetch: {self._shown_uri()} is already in {self.dest}")
                self._record_times(started, cached=True)
                return dict(done["files"])
        self.dest.mkdir(parents=True, exist_ok=True)
        t0 = self.clock()
        items = self.items()
        if "" in self.o.sha256 and len(items) != 1:
            raise self._fail("bad-request", f"{len(items)} files: give --sha256 NAME=HEX for each")
        unknown = [n for n in self.o.sha256 if n and n not in {i.name for i in items}]
        if unknown:
            raise self._fail("bad-request", f"--sha256 names files the store does not have: {unknown}")
        known = sum(i.size or 0 for i in items)
        self._check_space(known)
        self.say(
            f"fetch: {self._shown_uri()} -> {self.dest}: {len(items)} file(s)" + (f", {known} bytes" if known else "")
        )
        files = {i.name: self._download(i) for i in items}
        record: dict[str, object] = {"uri": self.o.uri, "files": files}
        if self._oci_manifest:
            record["manifest"] = self._oci_manifest
        marker.write_text(json.dumps(record))
        self._record_times(started, cached=False)
        self.say(f"fetch: done, {self._written} bytes in {self.clock() - t0:.1f}s")
        return files

    def _shown_uri(self) -> str:
        u = urlsplit(self.o.uri)
        return (
            f"{u.scheme}://{u.hostname or ''}{(':' + str(u.port)) if u.port else ''}{u.path}"
            if u.scheme != "s3"
            else self.o.uri
        )


def _progress(name: str, done: int, total: int | None, rate: float) -> str:
    mib = 1024 * 1024
    if total:
        return (
            f"fetch: {name}: {done / mib:.1f} / {total / mib:.1f} MiB ({100 * done // total}%) {rate / mib:.1f} MiB/s"
        )
    return f"fetch: {name}: {done / mib:.1f} MiB {rate / mib:.1f} MiB/s"


def parse_sha256(values: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, _, hexd = v.rpartition("=")
        if len(hexd) != 64 or any(c not in "0123456789abcdefABCDEF" for c in hexd):
            raise FetchError("bad-request", f"--sha256 {v!r}: expected 64 hex digits, or NAME=HEX")
        out[name] = hexd.lower()
    return out


def options_from(ns: object, env: Mapping[str, str]) -> Options:
    """Build :class:`Options` from parsed flags and the environment (pure but for reading the
    credentials directory)."""
    g = ns.__dict__
    endpoint = g.get("endpoint") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = g.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    return Options(
        uri=g["uri"],
        dest=g["dest"],
        sha256=parse_sha256(g.get("sha256") or []),
        max_bytes=g.get("max_bytes"),
        endpoint=endpoint,
        region=region,
        addressing=g.get("addressing") or "path",
        credentials=load_credentials(env, g.get("credentials_dir")),
        retries=5 if g.get("retries") is None else int(g["retries"]),
        backoff=0.5 if g.get("backoff") is None else float(g["backoff"]),
        timeout=g.get("timeout") or 30.0,
        limit_rate=g.get("limit_rate"),
        progress_every=2.0 if g.get("progress_seconds") is None else float(g["progress_seconds"]),
        ca_file=g.get("ca_file") or env.get("AWS_CA_BUNDLE") or None,
        registry_credentials=load_registry_credentials(env, g.get("credentials_dir"))
        if str(g["uri"]).startswith("oci")
        else None,
        insecure_registry=bool(g.get("insecure_registry")),
    )


def main(ns: object, env: Mapping[str, str] | None = None, termination_log: str | None = None) -> int:
    """Run a fetch; on failure print the one-line reason and return its exit code."""
    env = os.environ if env is None else env
    try:
        Fetcher(options_from(ns, env)).run()
        return 0
    except FetchError as e:
        err = e
    except OSError as e:  # the destination itself (not writable, not a directory)
        err = FetchError("store-error", f"the destination: {type(e).__name__}: {e.strerror or e}")
    line = err.line()
    print(line, file=sys.stderr, flush=True)
    _termination(termination_log, line)
    return EXIT_CODES[err.reason]


def _termination(path: str | None, line: str) -> None:
    if path:
        with contextlib.suppress(OSError):
            Path(path).write_text(line + "\n")
