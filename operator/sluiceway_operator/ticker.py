"""Periodic work without finalizers (drift repair, the signals refresh) and the debounced
re-apply that a tenant-key Secret's change triggers.

kopf's own timers always put a finalizer on the object (so that deletion waits for the timer to
stop), and turning that off needs kopf's private registry. These loops need no finalizer - they
hold no external state and children go by garbage collection - so they run here instead, over the
InferenceServices that :class:`Tracker` has seen through kopf's public ``@kopf.on.event`` handler.

Concurrency model: one daemon thread per :class:`Ticker`; each tick submits one job per object to a
shared, bounded :class:`~concurrent.futures.ThreadPoolExecutor` and skips objects whose previous job
of the same ticker is still running (so a slow Prometheus never piles up work). One daemon thread
for the :class:`Debouncer`, which submits to the same pool. The jobs call
:class:`~.reconcile.Reconciler`, which serialises all work on one object with its lock.
:class:`Tracker`, :class:`SecretVersions` and :class:`Debouncer` are each guarded by their own lock
(kopf's event handlers call them from its thread pool).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["Debouncer", "SecretVersions", "Ticker", "Tracker", "uses_key_secret"]

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

    def get(self, uid: str) -> Mapping[str, Any] | None:
        """The latest body of ``uid`` if it exists and is not being deleted."""
        with self._lock:
            body = self._bodies.get(uid)
        return None if body is None or body["metadata"].get("deletionTimestamp") else body

    def using_key_secret(self, namespace: str, secret: str) -> list[str]:
        """The uids of the live InferenceServices of ``namespace`` that name ``secret`` in a
        ``tenants[].keySecretRef``."""
        return [
            b["metadata"]["uid"]
            for b in self.live()
            if b["metadata"].get("namespace") == namespace and uses_key_secret(b, secret)
        ]


def uses_key_secret(body: Mapping[str, Any], secret: str) -> bool:
    """Whether an InferenceService's spec names ``secret`` in a ``tenants[].keySecretRef`` (pure;
    the raw spec, so an invalid one still gets its pass and its condition)."""
    tenants = (body.get("spec") or {}).get("tenants")
    if not isinstance(tenants, list):
        return False
    for tenant in tenants:
        ref = tenant.get("keySecretRef") if isinstance(tenant, Mapping) else None
        if isinstance(ref, Mapping) and ref.get("name") == secret:
            return True
    return False


class SecretVersions:
    """The ``resourceVersion`` of every watched Secret, to tell a change from a repeat.

    kopf reports each Secret once with ``type=None`` when its watch (re)lists, after an operator
    start or a watch that expired: at a start the spec path runs anyway (kopf's resume handlers),
    so only a Secret whose version differs from the one seen before counts; ``ADDED``,
    ``MODIFIED`` and ``DELETED`` (also sent when the Secret loses the label the watch selects)
    count when the version is new."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def changed(self, event_type: str | None, meta: Mapping[str, Any]) -> bool:
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        version = str(meta.get("resourceVersion") or "")
        with self._lock:
            previous = self._seen.pop(key, None) if event_type == "DELETED" else self._seen.get(key)
            if event_type != "DELETED":
                self._seen[key] = version
        if event_type is None:
            return previous is not None and previous != version
        return event_type == "DELETED" or previous != version

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)


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


class Debouncer:
    """Runs ``job(body)`` once for each poked object, ``delay`` seconds after its first poke.

    Pokes that come while one is pending join it (a rotation that touches several Secrets, or a
    Secret and the InferenceService, costs one pass). A job still running for the object when its
    time comes pushes the run back by ``delay`` instead of dropping it (the running pass may have
    read the Secret before the change). A job that raises is retried after ``retry`` seconds, at
    most ``attempts`` times in all; after that the drift tick repairs. Objects that are gone
    (``lookup`` answers None) are dropped. The pending map holds at most one entry per object.
    """

    def __init__(
        self,
        delay: float,
        lookup: Callable[[str], Mapping[str, Any] | None],
        job: Callable[[Mapping[str, Any]], Any],
        pool: ThreadPoolExecutor,
        *,
        retry: float = 10.0,
        attempts: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.delay = delay
        self.lookup = lookup
        self.job = job
        self.pool = pool
        self.retry = retry
        self.attempts = attempts
        self.clock = clock
        #: uid -> (when it is due, attempts made)
        self._pending: dict[str, tuple[float, int]] = {}
        self._running: dict[str, Future[Any]] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="sluiceway-keys", daemon=True)

    def poke(self, uid: str) -> None:
        with self._cond:
            if uid not in self._pending:
                self._pending[uid] = (self.clock() + self.delay, 0)
                self._cond.notify()

    def pending(self) -> dict[str, float]:
        with self._cond:
            return {uid: due for uid, (due, _) in self._pending.items()}

    def run_due(self) -> float | None:
        """Submit every due job (also called directly by tests); the seconds until the next one is
        due, or None when nothing is pending."""
        now = self.clock()
        with self._cond:
            due = [(uid, n) for uid, (at, n) in self._pending.items() if at <= now]
            for uid, _ in due:
                del self._pending[uid]
            for uid in [u for u, f in self._running.items() if f.done()]:
                del self._running[uid]
        for uid, n in due:
            body = self.lookup(uid)
            if body is None:
                continue
            with self._cond:
                busy = uid in self._running
                if busy:
                    self._pending.setdefault(uid, (now + self.delay, n))
                    continue
            try:
                future = self.pool.submit(self._run, uid, body, n + 1)
            except RuntimeError:  # the pool is shut down: the operator is stopping
                return None
            with self._cond:
                self._running[uid] = future
        with self._cond:
            if not self._pending:
                return None
            return max(0.0, min(at for at, _ in self._pending.values()) - self.clock())

    def _run(self, uid: str, body: Mapping[str, Any], attempt: int) -> None:
        meta = body["metadata"]
        try:
            self.job(body)
        except Exception as err:
            again = attempt < self.attempts
            log.warning(
                "re-applying %s/%s after a tenant-key Secret changed failed%s: %s",
                meta["namespace"],
                meta["name"],
                f", retried in {self.retry:g}s" if again else "; the drift tick repairs it",
                err,
            )
            if again:
                with self._cond:
                    self._pending.setdefault(uid, (self.clock() + self.retry, attempt))
                    self._cond.notify()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                if not self._pending:
                    self._cond.wait()
                else:
                    timeout = min(at for at, _ in self._pending.values()) - self.clock()
                    if timeout > 0:
                        self._cond.wait(timeout)
                if self._stop:
                    return
            self.run_due()
