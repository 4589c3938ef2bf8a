"""The asynchronous driver of the admission core.

Concurrency model
-----------------
One :class:`Dispatcher` belongs to one asyncio event loop (the server's). Batches start wherever a
permit may have become free, on the loop thread: in :meth:`Dispatcher.submit` (a request arriving
at a free permit with nothing queued is dispatched at once, without waking any task), when a batch
finishes, and in the single background task. That task only keeps the core's timers: it sleeps until
the next queue deadline, the end of a filling batch's wait or the moment a timed-out batch turns
stuck, and is woken only when that moment moves earlier (or by :meth:`wake`, after a permit change).
Each batch runs ``run_batch`` in a worker thread of a private
:class:`~concurrent.futures.ThreadPoolExecutor` whose size equals the permit limit, so the event
loop never blocks on the device, even for a tiny model (the hop is kept on purpose: the loop cannot
know that a model is short before it has run it). All
:class:`~sluiceway_pod.admission.AdmissionCore` calls happen on the loop thread; worker threads only
compute and report back through the loop (``call_soon_threadsafe``).

Timeouts: a batch that exceeds ``exec_timeout`` (a loop timer armed at its start) is answered 504 at
once, but its permit is released only when the worker thread really returns, so the device is never
double-booked.

Stuck permits: a batch still running ``stuck_grace`` seconds after its execution budget ran out holds
a *stuck* permit (a hung device or a model in an endless loop). :attr:`stuck` counts them (the main
task wakes when the next one turns stuck and reports the count through ``on_stuck``); when every
permit is stuck nothing can ever dispatch again, :attr:`wedged` is true and the pod's liveness probe
fails so that Kubernetes restarts it.

Start signal: a ticket submitted with ``on_start`` has it called on the loop thread in
:meth:`Dispatcher._launch`, when its batch is handed to a worker thread (alone or with others), and
never for a ticket answered before that (refused, expired, withdrawn, displaced). The pod's protocol
writes its ``103`` from it (:mod:`~sluiceway_pod.transport`); a failing callback is logged and
does not stop the batch.

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
import math
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


class _Running:
    """One batch whose device work has started: its execution timer, and whether its tickets have
    already been answered (504 or shutdown) while the worker thread still runs."""

    __slots__ = ("answered", "batch", "timer")

    def __init__(self, batch: Batch[Any], timer: asyncio.TimerHandle) -> None:
        self.batch = batch
        self.timer = timer
        self.answered = False


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
        self._running: dict[int, _Running] = {}  # id(batch) -> its record, while its device work runs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        # when the main task wakes by itself: inf = never, -inf = it is awake and will look anyway
        self._sleep_until = -math.inf
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._main(), name="sluiceway-dispatcher")

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for run in self._running.values():
            run.timer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        """Let the main task re-examine the core (after a permit change or a removal)."""
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
        on_start: Callable[[], None] | None = None,
    ) -> tuple[Ticket[P], asyncio.Future[Any]]:
        """Admit (or raise the refusal), and start it at once if a permit is free and it is next.
        The future resolves to the result or raises the error; ``on_start`` is called (on the loop)
        when it starts executing, never if it is answered before."""
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
        ticket.on_start = on_start  # before the pump below may launch it
        self._idle.clear()
        self._pump()
        return ticket, fut

    def withdraw(self, ticket: Ticket[P], error: SluicewayError) -> bool:
        """The client went away: drop the ticket if it is still queued."""
        removed = self.core.cancel(ticket, error)
        if removed:
            self._pump()
        return removed

    # ------------------------------------------------------------------ dispatch
    def _pump(self) -> None:
        """On the loop: expire what is due, start batches while permits are free, and wake the main
        task only if the core's next timer is now earlier than the main task's own wake-up."""
        if self._stopped:
            return
        core = self.core
        core.expire()
        while (batch := core.next_batch()) is not None:
            self._launch(batch)
        if core.idle:
            self._idle.set()
        if core.depth:
            nxt = core.next_wakeup()
            if nxt is not None and nxt < self._sleep_until:
                self._wake.set()

    def _launch(self, batch: Batch[P]) -> None:
        loop = self._loop
        assert loop is not None
        self._started[id(batch)] = self.clock.now()  # before check_stuck sees the batch
        timer = loop.call_later(self.exec_timeout, self._timed_out, batch)
        self._running[id(batch)] = _Running(batch, timer)
        self._pool.submit(self._work, loop, batch)
        for t in batch.tickets:
            signal = t.on_start
            if signal is not None:
                t.on_start = None
                try:
                    signal()
                except Exception:  # a connection's write failing must not stop the batch
                    log.exception("the start signal of a request failed")

    def _work(self, loop: asyncio.AbstractEventLoop, batch: Batch[P]) -> None:
        """In a worker thread: run the batch and hand the outcome to the loop."""
        outcome: tuple[Sequence[Any], float] | BaseException
        try:
            outcome = self._call([t.payload for t in batch.tickets])
        except BaseException as e:
            outcome = e
        with contextlib.suppress(RuntimeError):  # the loop is closed: the pod is gone
            loop.call_soon_threadsafe(self._done, batch, outcome)

    def _timed_out(self, batch: Batch[P]) -> None:
        """The execution budget ran out: answer 504 now; the permit waits for the thread."""
        run = self._running.get(id(batch))
        if run is None or run.answered:
            return
        self._answer_all(run, ExecTimeout(f"inference did not finish within {self.exec_timeout:.3f}s"))
        self._wake.set()  # the main task times the moment this permit turns stuck

    def _answer_all(self, run: _Running, err: SluicewayError) -> None:
        run.answered = True
        for t in run.batch.tickets:
            if t.state != "done":
                self.core.obs.rejected(err.reason, t.tenant, t.priority_label)
                t.resolve(error=err)

    def _done(self, batch: Batch[P], outcome: tuple[Sequence[Any], float] | BaseException) -> None:
        """On the loop: the worker thread has returned (the permit is free now)."""
        run = self._running.pop(id(batch), None)
        if run is None:
            return
        run.timer.cancel()
        elapsed: float | None = None
        if run.answered:  # 504 or shutdown answered it already: the outcome goes nowhere
            pass
        elif isinstance(outcome, SluicewayError):
            if isinstance(outcome, DeviceOutOfMemory) and outcome.retry_after is None:
                outcome.retry_after = self.core.retry_after()
            self._answer_all(run, outcome)
        elif isinstance(outcome, BaseException):
            eid = new_error_id()
            log.error(
                "model failed on a batch of %d (error id %s)",
                len(batch.tickets),
                eid,
                exc_info=(type(outcome), outcome, outcome.__traceback__),
            )
            self._answer_all(run, ModelError(f"the model failed; error id {eid} (see the pod's log)", error_id=eid))
        else:
            results, elapsed = outcome
            if len(results) != len(batch.tickets):
                self._answer_all(
                    run, ModelError(f"the model returned {len(results)} results for a batch of {len(batch.tickets)}")
                )
            else:
                for t, r in zip(batch.tickets, results, strict=True):
                    t.resolve(result=r)
        self._started.pop(id(batch), None)
        self.core.finish(batch, elapsed)
        self._pump()

    # ------------------------------------------------------------------ main loop
    async def _main(self) -> None:
        while True:
            self._wake.clear()
            self._pump()
            nxt = self.core.next_wakeup()
            turns_stuck = self.check_stuck()
            if turns_stuck is not None:
                nxt = turns_stuck if nxt is None else min(nxt, turns_stuck)
            self._sleep_until = math.inf if nxt is None else nxt
            timeout = None if nxt is None else max(0.0, nxt - self.clock.now())
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that races a wake-up
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._sleep_until = -math.inf

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
            for run in list(self._running.values()):
                if not run.answered:
                    self._answer_all(run, ExecTimeout("the server shut down before inference finished"))
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
