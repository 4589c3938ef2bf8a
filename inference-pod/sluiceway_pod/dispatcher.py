"""The asynchronous driver of the admission core.

Concurrency model
-----------------
One :class:`Dispatcher` belongs to one asyncio event loop (the server's). Its single background
task wakes on new arrivals, finished batches and the core's next deadline, expires queued tickets
and starts batches while permits are free. Each batch runs ``run_batch`` in a worker thread of a
private :class:`~concurrent.futures.ThreadPoolExecutor` whose size equals the permit limit, so the
event loop never blocks on the device. All :class:`~sluiceway_pod.admission.AdmissionCore` calls
happen on the loop thread; worker threads only compute and report back through the loop
(``call_soon_threadsafe``).

Timeouts: a batch that exceeds ``exec_timeout`` is answered 504 at once, but its permit is released
only when the worker thread really returns, so the device is never double-booked.

Stuck permits: a batch still running ``stuck_grace`` seconds after its execution budget ran out holds
a *stuck* permit (a hung device or a model in an endless loop). :attr:`stuck` counts them (the main
task wakes when the next one turns stuck and reports the count through ``on_stuck``); when every
permit is stuck nothing can ever dispatch again, :attr:`wedged` is true and the pod's liveness probe
fails so that Kubernetes restarts it.

Futures: every answer future gets a done-callback that retrieves its exception, so a request whose
client went away (and whose coroutine no longer awaits the future) never logs "Future exception was
never retrieved".

Model exceptions: logged with a short error id (:func:`~sluiceway_pod.errors.new_error_id`); the
client gets a :class:`~sluiceway_pod.errors.ModelError` naming only that id, never the exception text.

OOM: ``run_batch`` raising :class:`DeviceOOMSignal` makes the worker report the OOM (the core loses
one permit, not below 1), free cached device memory and retry the same batch once. A second OOM
answers every ticket in the batch with :class:`~sluiceway_pod.errors.DeviceOutOfMemory` (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from .admission import AdmissionCore, Batch, Ticket
from .clock import Clock
from .errors import (
    DeviceOutOfMemory,
    Draining,
    ExecTimeout,
    ModelError,
    SluicewayError,
    new_error_id,
)
from .models import DeviceOOMSignal
from .tenancy import Tenant

log = logging.getLogger("sluiceway.dispatcher")

P = TypeVar("P")


class Dispatcher(Generic[P]):
    def __init__(
        self,
        core: AdmissionCore[P],
        run_batch: Callable[[Sequence[P]], Sequence[Any]],
        *,
        exec_timeout: float,
        clock: Clock,
        on_oom: Callable[[], None] | None = None,
        release_device_cache: Callable[[], None] | None = None,
        max_threads: int | None = None,
        stuck_grace: float = 30.0,
        on_stuck: Callable[[int], None] | None = None,
    ) -> None:
        self.core = core
        self._run_batch = run_batch
        self.exec_timeout = exec_timeout
        self.stuck_grace = stuck_grace
        self._on_stuck = on_stuck or (lambda _n: None)
        self._started: dict[int, float] = {}  # id(batch) -> start time, while its device work runs
        self.stuck = 0
        self.clock = clock
        self._on_oom = on_oom or (lambda: None)
        self._release_cache = release_device_cache or (lambda: None)
        self._pool = ThreadPoolExecutor(max_workers=max_threads or core.limit, thread_name_prefix="sluiceway-device")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._main(), name="sluiceway-dispatcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pool.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------ submission
    def submit(
        self,
        tenant: Tenant,
        rank: int,
        payload: P,
        *,
        priority_label: str,
        batch_key: Hashable,
        client_budget: float | None,
        check_rate: bool = True,
    ) -> tuple[Ticket[P], asyncio.Future[Any]]:
        """Admit (or raise the refusal). The future resolves to the result or raises the error."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieve)

        def answer(result: Any, error: SluicewayError | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        ticket = self.core.admit(
            tenant,
            rank,
            payload,
            answer,
            priority_label=priority_label,
            batch_key=batch_key,
            client_budget=client_budget,
            check_rate=check_rate,
        )
        self._idle.clear()
        self.wake()
        return ticket, fut

    def withdraw(self, ticket: Ticket[P], error: SluicewayError) -> bool:
        """The client went away: drop the ticket if it is still queued."""
        removed = self.core.cancel(ticket, error)
        if removed:
            self.wake()
        return removed

    # ------------------------------------------------------------------ main loop
    async def _main(self) -> None:
        while True:
            self._wake.clear()
            self.core.expire()
            while (batch := self.core.next_batch()) is not None:
                self._started[id(batch)] = self.clock.now()  # before check_stuck below sees the batches
                task = asyncio.create_task(self._execute(batch))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
            if self.core.idle:
                self._idle.set()
            nxt = self.core.next_wakeup()
            turns_stuck = self.check_stuck()
            if turns_stuck is not None:
                nxt = turns_stuck if nxt is None else min(nxt, turns_stuck)
            timeout = None if nxt is None else max(0.0, nxt - self.clock.now())
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that races a wake-up
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    # ------------------------------------------------------------------ stuck permits
    def check_stuck(self) -> float | None:
        """Recount stuck permits now (reporting a change); returns when the next one turns stuck."""
        now = self.clock.now()
        budget = self.exec_timeout + self.stuck_grace
        n = 0
        nxt: float | None = None
        for started in self._started.values():
            at = started + budget
            if at <= now:
                n += 1
            elif nxt is None or at < nxt:
                nxt = at
        if n != self.stuck:
            if n > self.stuck:
                log.error(
                    "%d of %d permits are held by device work running over %.1fs (execution budget %.1fs "
                    "+ grace %.1fs)",
                    n,
                    self.core.limit,
                    budget,
                    self.exec_timeout,
                    self.stuck_grace,
                )
            self.stuck = n
            self._on_stuck(n)
        return nxt

    @property
    def wedged(self) -> bool:
        """Every permit is held by stuck device work: nothing can dispatch again."""
        self.check_stuck()
        return self.stuck > 0 and self.stuck >= self.core.limit

    def _call(self, payloads: Sequence[P]) -> tuple[Sequence[Any], float]:
        """Runs in a worker thread. Returns the results and the device seconds of the call that
        produced them, timed in this thread: the event loop's own delays (scheduling the future,
        waking up) are not device time, and fair queueing charges tenants by device time."""
        try:
            t0 = time.perf_counter()
            return self._run_batch(payloads), time.perf_counter() - t0
        except DeviceOOMSignal:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._oom)
            self._release_cache()
            try:
                t0 = time.perf_counter()
                return self._run_batch(payloads), time.perf_counter() - t0
            except DeviceOOMSignal:  # Retry-After is filled in on the loop (the core is loop-owned)
                raise DeviceOutOfMemory("the device ran out of memory twice for this batch") from None

    def _oom(self) -> None:
        limit = self.core.shrink()
        log.warning("device out of memory: permits shrunk to %d, retrying the batch once", limit)
        self._on_oom()

    async def _execute(self, batch: Batch[P]) -> None:
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._pool, self._call, [t.payload for t in batch.tickets])
        try:
            done, _ = await asyncio.wait({work}, timeout=self.exec_timeout)
        except asyncio.CancelledError:  # drain budget exhausted: answer, then let the task end
            err0 = ExecTimeout("the server shut down before inference finished")
            for t in batch.tickets:
                self.core.obs.rejected(err0.reason, t.tenant, t.priority_label)
                t.resolve(error=err0)
            work.add_done_callback(lambda f: self._late_finish(f, batch))
            raise
        if not done:
            err = ExecTimeout(f"inference did not finish within {self.exec_timeout:.3f}s")
            for t in batch.tickets:
                self.core.obs.rejected(err.reason, t.tenant, t.priority_label)
                t.resolve(error=err)

            work.add_done_callback(lambda f: self._late_finish(f, batch))
            return
        elapsed: float | None = None
        try:
            results, elapsed = work.result()
            if len(results) != len(batch.tickets):
                raise ModelError(f"the model returned {len(results)} results for a batch of {len(batch.tickets)}")
        except SluicewayError as e:
            if isinstance(e, DeviceOutOfMemory) and e.retry_after is None:
                e.retry_after = self.core.retry_after()
            for t in batch.tickets:
                self.core.obs.rejected(e.reason, t.tenant, t.priority_label)
                t.resolve(error=e)
        except Exception:
            eid = new_error_id()
            log.exception("model failed on a batch of %d (error id %s)", len(batch.tickets), eid)
            failure = ModelError(f"the model failed; error id {eid} (see the pod's log)", error_id=eid)
            for t in batch.tickets:
                self.core.obs.rejected(failure.reason, t.tenant, t.priority_label)
                t.resolve(error=failure)
        else:
            for t, r in zip(batch.tickets, results, strict=True):
                t.resolve(result=r)
        self._finish(batch, elapsed)

    def _late_finish(self, f: asyncio.Future[tuple[Sequence[Any], float]], batch: Batch[P]) -> None:
        """Device work whose tickets were already answered (504) has really ended: free the permit."""
        if not f.cancelled():
            f.exception()  # retrieve, so it is not logged as unhandled
        self._finish(batch, None)

    def _finish(self, batch: Batch[P], elapsed: float | None) -> None:
        self._started.pop(id(batch), None)
        self.core.finish(batch, elapsed)
        self.wake()

    # ------------------------------------------------------------------ drain
    async def drain(self, budget: float) -> bool:
        """Refuse new work, let queued and running work finish within ``budget`` seconds.

        Returns True if everything finished. Otherwise whatever is still queued is answered 503
        and running tickets 504, so every admitted request still gets exactly one answer.
        """
        self.core.draining = True
        self.wake()
        try:
            await asyncio.wait_for(self._wait_idle(), budget)
            return True
        except TimeoutError:
            self.core.reject_all_queued(lambda: Draining("drain budget exhausted before this request ran"))
            for task in list(self._running):
                task.cancel()
            return False

    async def _wait_idle(self) -> None:
        while not self.core.idle:
            self._idle.clear()
            self.wake()
            await self._idle.wait()


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception as retrieved (its request may have stopped waiting for it)."""
    if not fut.cancelled():
        fut.exception()
