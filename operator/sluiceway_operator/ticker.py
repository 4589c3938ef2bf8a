"""Periodic work without finalizers: drift repair and the signals refresh.

kopf's own timers always put a finalizer on the object (so that deletion waits for the timer to
stop), and turning that off needs kopf's private registry. These loops need no finalizer - they
hold no external state and children go by garbage collection - so they run here instead, over the
InferenceServices that :class:`Tracker` has seen through kopf's public ``@kopf.on.event`` handler.

Concurrency model: one daemon thread per :class:`Ticker`; each tick submits one job per object to a
shared, bounded :class:`~concurrent.futures.ThreadPoolExecutor` and skips objects whose previous job
of the same ticker is still running (so a slow Prometheus never piles up work). The jobs call
:class:`~.reconcile.Reconciler`, which serialises all work on one object with its lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["Ticker", "Tracker"]

log = logging.getLogger(__name__)


class Tracker:
    """The latest body of every InferenceService the operator watches (thread-safe)."""

    def __init__(self) -> None:
        self._bodies: dict[str, Mapping[str, Any]] = {}
        self._lock = threading.Lock()

    def seen(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        uid = body["metadata"]["uid"]
        with self._lock:
            if event_type == "DELETED":
                self._bodies.pop(uid, None)
            else:
                self._bodies[uid] = body

    def live(self) -> list[Mapping[str, Any]]:
        """Bodies of objects that exist and are not being deleted."""
        with self._lock:
            bodies = list(self._bodies.values())
        return [b for b in bodies if not b["metadata"].get("deletionTimestamp")]

    def __contains__(self, uid: str) -> bool:
        with self._lock:
            return uid in self._bodies


class Ticker:
    """Every ``interval`` seconds, run ``job(body)`` for each tracked object."""

    def __init__(
        self,
        name: str,
        interval: float,
        tracker: Tracker,
        job: Callable[[Mapping[str, Any]], Any],
        pool: ThreadPoolExecutor,
    ) -> None:
        self.name = name
        self.interval = interval
        self.tracker = tracker
        self.job = job
        self.pool = pool
        self._stop = threading.Event()
        self._running: dict[str, Future[Any]] = {}
        self._thread = threading.Thread(target=self._loop, name=f"sluiceway-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def tick(self) -> None:
        """One round (also called directly by tests)."""
        for body in self.tracker.live():
            uid = body["metadata"]["uid"]
            running = self._running.get(uid)
            if running is not None and not running.done():
                continue
            try:
                self._running[uid] = self.pool.submit(self._run, body)
            except RuntimeError:  # the pool is shut down: the operator is stopping
                return
        for uid in [u for u, f in self._running.items() if f.done() and u not in self.tracker]:
            del self._running[uid]

    def _run(self, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        try:
            self.job(body)
        except Exception as err:
            log.warning("%s of %s/%s failed, retried next tick: %s", self.name, meta["namespace"], meta["name"], err)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()
