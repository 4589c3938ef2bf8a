"""Reading mounted configuration files for a hot reload, shared by the pod (``sluiceway_pod.reload``)
and the gateway (``sluiceway_gateway.reload``): bounded reads through the kubelet's ``..data``
symlink and a YAML/JSON mapping parse whose errors never quote the file's content, and the poll loop
both reloaders run (:class:`PollingReloader`).

The functions are pure plus a bounded file read, safe from any thread. A :class:`PollingReloader`
is one task on its owner's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import yaml

#: Kubernetes refuses a ConfigMap or Secret over 1 MiB, so no mounted file is larger.
MAX_FILE_BYTES = 1024 * 1024


class ReloadError(Exception):
    """A file the reload cannot use. The message names the file and the reason, never its content."""


def read_capped(path: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The file's bytes, read through any symlinks (``..data``); ReloadError when it is larger than
    ``limit`` (at most ``limit + 1`` bytes are read) or cannot be read."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise ReloadError(f"{path}: cannot be read: {e.strerror or type(e).__name__}") from None
    if len(data) > limit:
        raise ReloadError(f"{path}: larger than {limit} bytes")
    return data


def parse_mapping(path: str, data: bytes) -> dict[str, Any]:
    """The file's top-level mapping (JSON for ``*.json``, else YAML; empty: ``{}``); ReloadError naming
    the line of a syntax error, never the content."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReloadError(f"{path}: not UTF-8") from None
    try:
        doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ReloadError(f"{path}: not valid YAML/JSON{at}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ReloadError(f"{path}: the top level must be a mapping")
    return doc


log = logging.getLogger("sluiceway.reload")


class PollingReloader:
    """The poll loop of a hot reload: :meth:`poll` (the subclass's: ``unchanged``, ``applied``,
    ``rejected``) every ``period`` seconds of ``now()`` until cancelled, never ended by an exception
    of a poll; :meth:`_reject` logs a refused content once per distinct content (never the content
    itself), counts it (``result("rejected")``) and raises the ``failing`` flag. Concurrency: one
    task on the owner's event loop (:meth:`start`/:meth:`stop`)."""

    def __init__(
        self,
        *,
        now: Callable[[], float],
        period: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        result: Callable[[str], None] = lambda _r: None,
        failing: Callable[[bool], None] = lambda _f: None,
        owner: str = "process",
        logger: logging.Logger = log,
    ) -> None:
        self._log = logger
        self._now = now
        self.period = period
        self._sleep = sleep
        self._result = result
        self._failing = failing
        self._owner = owner
        self._seen: str | None = None  # digest (or reason) of the last content handled
        self._task: asyncio.Task[None] | None = None

    async def poll(self) -> str:
        raise NotImplementedError

    def _reject(self, why: str, digest: str | None) -> str:
        key = digest or why
        if key != self._seen:
            self._log.error("tenant reload rejected, keeping the keys and limits in force: %s", why)
            self._result("rejected")
            self._seen = key
        self._failing(True)
        return "rejected"

    async def run(self) -> None:
        """Poll every ``period`` seconds until cancelled. Never raises but CancelledError."""
        while True:
            due = self._now() + self.period
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:  # a defect here must not end the reloads, nor the owner
                self._log.exception("tenant reload failed (the %s goes on with what it holds)", self._owner)
            await self._sleep(max(0.0, due - self._now()))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="tenant-reload")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
