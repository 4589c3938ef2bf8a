"""Log lines of the scaler and the gateway: ``plain`` (``time level logger: message``) or ``json``
(their ``--log-format``).

JSON: one object per line with ``time`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger``,
``message``, and ``exception`` (the formatted traceback) when there is one; line breaks inside a
message stay inside the JSON string, so a collector never splits a record. The same field names as
the inference pod's JSON logs (``sluiceway_pod.logs``), so one parser reads both.

Concurrency model: formatters run in the thread that logs, under the handler's lock; nothing shared.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["FORMATS", "PLAIN_FORMAT", "JsonFormatter", "configure_logging"]

FORMATS = ("plain", "json")
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line (module doc). Subclasses add fields with :meth:`extra_fields` (the
    pod: its request id and access-log fields) and may serialise :meth:`document` otherwise."""

    def extra_fields(self, record: logging.LogRecord) -> Mapping[str, Any]:
        return {}

    def document(self, record: logging.LogRecord) -> dict[str, Any]:
        t = record.created
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(self.extra_fields(record))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return doc

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.document(record), ensure_ascii=False, default=str)


def build_formatter(fmt: str) -> logging.Formatter:
    """``json`` or ``plain``; ValueError for anything else."""
    if fmt == "json":
        return JsonFormatter()
    if fmt == "plain":
        return logging.Formatter(PLAIN_FORMAT)
    raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def configure_logging(level: str, fmt: str, stream: IO[str] | None = None) -> None:
    """The root logger: one handler on ``stream`` (stderr) with the chosen format and level.
    Replaces any handler set before (``logging.basicConfig`` would keep them)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(build_formatter(fmt))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
