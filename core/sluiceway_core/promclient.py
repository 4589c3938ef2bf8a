"""The one Prometheus client of every component: instant queries with a total deadline, a size cap
and an allow-list, and errors that never carry what the server answered.

Used by the scaler and by the operator (status readings and the builtin engine). Each call is one
GET through :func:`sluiceway_core.httpget.http_get` (hard deadline over the whole exchange, answer
capped at ``max_bytes``, no proxies, no redirects). The address must be on the caller's
:class:`~sluiceway_core.urls.UrlAllowList`, checked before any connection is made.

**Credentials.** ``auth`` (:class:`~sluiceway_core.promauth.PromAuth`, loaded with
:func:`~sluiceway_core.promauth.load_prom_auth`) gives an allowed address its bearer token or basic
auth, custom headers (``X-Scope-OrgID``) and TLS settings (CA, client certificate). The secret
files are read for each query; their content never reaches a message. 401/403 answers say the
credentials were refused.

**No echo.** An address may come from an object its author writes; whatever answers there is not
Prometheus' to vouch for. Error messages name the address and the kind of failure (connection, HTTP
status code, not JSON, wrong shape) and never include the answer's bytes, so nothing read from an
arbitrary server can reach a status, an Event or a log line.

Concurrency: blocking, stateless; safe from any number of threads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from sluiceway_core.httpget import FetchError, FetchTimeout, http_get
from sluiceway_core.promauth import PromAuth, PromAuthError
from sluiceway_core.urls import UrlAllowList

__all__ = [
    "MAX_ANSWER_BYTES",
    "PromAddressNotAllowed",
    "PromError",
    "PromGarbage",
    "PromUnavailable",
    "instant_query",
]

#: Larger answers are garbage for the instant queries Sluiceway makes.
MAX_ANSWER_BYTES = 4 << 20


class PromError(Exception):
    """A query failed. The message is safe to show: it never contains the server's answer."""


class PromAddressNotAllowed(PromError):
    """The address is not on the allow-list; no connection was made."""


class PromUnavailable(PromError):
    """Connection failure, deadline passed, or an HTTP status other than 200."""


class PromTimeout(PromUnavailable):
    """No complete answer within the deadline."""


class PromGarbage(PromError):
    """An answer that is not a successful Prometheus instant-query result."""


def instant_query(
    address: str,
    promql: str,
    *,
    allow: UrlAllowList,
    timeout: float,
    max_bytes: int = MAX_ANSWER_BYTES,
    headers: Mapping[str, str] | None = None,
    auth: PromAuth | None = None,
) -> list[dict[str, Any]]:
    """The ``data.result`` list of one instant query (each item a dict with ``metric`` and ``value``).
    ``headers`` are sent as given; ``auth``'s entry for ``address`` (if any) adds its credentials,
    headers and TLS context on top.

    Raises :class:`PromAddressNotAllowed` (before any connection), :class:`PromUnavailable`
    (:class:`PromTimeout` for the deadline) or :class:`PromGarbage`.
    """
    if not allow.allows(address):
        raise PromAddressNotAllowed(f"Prometheus address is not on the allow-list (it allows {allow.describe()})")
    url = f"{address.rstrip('/')}/api/v1/query?{urlencode({'query': promql})}"
    where = f"Prometheus at {address}"
    sent = dict(headers or {})
    context = None
    creds = auth.for_url(address) if auth is not None else None
    if creds is not None:
        try:
            extra, context = creds.request()
        except PromAuthError as e:
            raise PromUnavailable(f"{where}: credentials unavailable: {e}") from None
        sent.update(extra)
    try:
        status, body = http_get(url, timeout, max_bytes, sent, ssl_context=context)
    except FetchTimeout as e:
        raise PromTimeout(f"{where}: no complete answer within {timeout:g}s") from e
    except FetchError as e:
        raise PromUnavailable(f"{where}: {type(e.__cause__ or e).__name__}") from e
    if status in (401, 403):
        sent_auth = any(k.lower() == "authorization" for k in sent)
        how = "refused the credentials" if sent_auth else "wants credentials (no bearer token or basic auth for it)"
        raise PromUnavailable(f"{where}: HTTP {status}: Prometheus {how}")
    if status != 200:
        raise PromUnavailable(f"{where}: HTTP {status}")
    try:
        doc = json.loads(body)
    except ValueError:
        raise PromGarbage(f"{where}: the answer is not JSON") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise PromGarbage(f"{where}: the answer is not a successful query result")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise PromGarbage(f"{where}: the answer is not an instant vector")
    result: list[dict[str, Any]] = []
    for item in data["result"]:
        if not isinstance(item, dict) or not isinstance(item.get("value"), list) or len(item["value"]) != 2:
            raise PromGarbage(f"{where}: a sample of the answer has the wrong shape")
        result.append(item)
    return result
