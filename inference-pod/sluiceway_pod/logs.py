"""The pod's logs: plain or JSON lines, the request id, and the sampled access log.

* ``server.logFormat`` (``--log-format``): ``plain`` (``time level logger: message``) or ``json``,
  one object per line: ``time`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger``,
  ``message``, ``requestId`` when the line was logged while serving a request, the access log's
  fields, and ``exception`` when there is a traceback.
* The request id: a client's ``X-Request-Id`` is kept when it is 1 to 128 characters of
  ``[A-Za-z0-9._:/+=@-]`` (nothing that could break a header or a log line); otherwise (absent or
  not so) the pod makes one (16 hex digits: a per-process random prefix and a serial number). It
  is returned on every answer and logged.
* The access log (``server.accessLog``, logger ``sluiceway.access``, off by default): one line per
  sampled infer request, refusals included: tenant, model, status, reason, queue wait and execution
  time (ms), request id, bytes in and out. Never the API key, never the body.

Concurrency model: formatters run in the thread that logs, under the handler's lock. The request id
of the request being served lives in a :class:`~contextvars.ContextVar` (one asyncio task per
request; worker threads started with ``asyncio.to_thread`` copy it). :class:`AccessLog` is used on
the event loop only.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import re
import sys
from collections.abc import Callable
from contextvars import ContextVar
from typing import IO, Any

import orjson
from sluiceway_core import logformat
from sluiceway_core.config import AccessLogConfig

#: The id of the request being served (set by the fast path for the task that serves it).
REQUEST_ID: ContextVar[str | None] = ContextVar("sluiceway_request_id", default=None)

REQUEST_ID_HEADER = "x-request-id"
_RID_OK = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")

PLAIN_FORMAT = logformat.PLAIN_FORMAT


def request_id(raw: str | None) -> str:
    """The client's ``X-Request-Id`` when it is acceptable (module doc), else a new one."""
    if raw is not None and len(raw) <= 128 and _RID_OK.fullmatch(raw) is not None:
        return raw
    return f"{_PREFIX}{next(_SERIAL):08x}"


#: Made ids: a random per-process prefix and a serial number (16 hex digits for the first 2**32),
#: cheaper than random bytes per request and unique across the pod's replicas in practice.
_PREFIX = os.urandom(4).hex()
_SERIAL = itertools.count(1)


class JsonFormatter(logformat.JsonFormatter):
    """One JSON object per line (module doc): the shared fields (:mod:`sluiceway_core.logformat`),
    plus the request id and an access line's fields; serialised with orjson."""

    def extra_fields(self, record: logging.LogRecord) -> dict[str, Any]:
        out: dict[str, Any] = {}
        rid = REQUEST_ID.get()
        if rid is not None:
            out["requestId"] = rid
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        return out

    def format(self, record: logging.LogRecord) -> str:
        return orjson.dumps(self.document(record), default=str).decode()


class PlainFormatter(logging.Formatter):
    """``time level logger: message``, plus `` request_id=...`` when serving a request."""

    def __init__(self) -> None:
        super().__init__(PLAIN_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = REQUEST_ID.get()
        if rid is not None and getattr(record, "fields", None) is None:  # access lines carry it already
            line += f" request_id={rid}"
        return line


def build_formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else PlainFormatter()


def configure_logging(level: str, fmt: str, stream: IO[str] | None = None) -> None:
    """The root logger: one handler on ``stream`` (stderr) with the chosen format. Replaces any
    handler set before (``logging.basicConfig`` would keep them)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(build_formatter(fmt))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # uvicorn's loggers keep their own handlers and formats unless told to propagate to ours
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True


access_logger = logging.getLogger("sluiceway.access")


class AccessLog:
    """The sampled access log (module doc). ``sampled()`` decides per request; ``emit`` writes."""

    __slots__ = ("random", "rate")

    def __init__(self, rate: float, rand: Callable[[], float] = random.random) -> None:
        self.rate = rate
        self.random = rand

    def sampled(self) -> bool:
        return self.rate >= 1.0 or self.random() < self.rate

    def emit(
        self,
        *,
        model: str,
        tenant: str | None,
        status: int,
        reason: str | None,
        queue_wait_ms: float | None,
        exec_ms: float | None,
        request_id: str,
        bytes_in: int,
        bytes_out: int,
    ) -> None:
        fields = {
            "tenant": tenant,
            "model": model,
            "status": status,
            "reason": reason,
            "queueWaitMs": None if queue_wait_ms is None else round(queue_wait_ms, 3),
            "execMs": None if exec_ms is None else round(exec_ms, 3),
            "requestId": request_id,
            "bytesIn": bytes_in,
            "bytesOut": bytes_out,
        }
        msg = " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())
        access_logger.info("access %s", msg, extra={"fields": fields})


def build_access_log(cfg: AccessLogConfig, rand: Callable[[], float] = random.random) -> AccessLog | None:
    """None when off (``enabled: false`` or a sample rate of 0): the hot path then checks one
    attribute."""
    if not cfg.enabled or cfg.sample_rate <= 0:
        return None
    return AccessLog(cfg.sample_rate, rand)
