"""The adaptive permit limit of ``permits: auto``: memory-bounded, throughput-checked, both ways.

:class:`LimitController` is pure (an injected clock, no threads, no I/O) and returns a frozen
:class:`LimitDecision` for every change. It holds two numbers:

* the **memory bound**: permits that fit the device-memory budget measured at warm-up, divided by
  the peak of one batch. The peak is the larger of the warm-up probe's (at the largest declared
  shape) and the online estimate (:class:`~sluiceway_pod.sizing.PeakTracker`) over the last
  interval, so measured peaks above the warm-up's shrink the bound at once and the bound comes back
  when they fall. An OOM caps the bound at the permits in use minus one; the cap is lifted one
  permit per ``cooldown`` while peaks show room.
* the **limit** in force, never above the memory bound. It starts at the warm-up probe's choice
  and is checked every ``interval`` against what the pod measures, in the spirit of TCP Vegas
  (Netflix concurrency-limits' ``VegasLimit``): with ``rtt0`` the batch time at one permit and
  ``rtt`` the mean batch time of the interval, ``queue = limit * (1 - rtt0 / rtt)`` is how many
  permits only wait on each other inside the device. Above ``beta`` the limit drops by one; below
  ``alpha``, when the pod used every permit in the interval, it grows by one (if memory allows).
  ``rtt0`` is the warm-up's time of the largest batch, so smaller live requests read as room.

:class:`AdaptiveLimit` wires a controller to the pod: it wraps the runner's ``predict`` (worker
threads: peak tracking and batch timing) and applies decisions to the admission core on the event
loop that owns it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .sizing import MemoryProbe, PeakTracker, bound_from_budget

log = logging.getLogger("sluiceway.adaptive")


@dataclass(frozen=True)
class LimitDecision:
    at: float
    old_limit: int
    new_limit: int
    memory_bound: int
    reason: str  # start | oom | peak-rose | peak-room | vegas-grow | vegas-shrink
    peak_per_batch: float | None = None
    rtt: float | None = None
    queue_estimate: float | None = None


class LimitController:
    def __init__(
        self,
        *,
        limit: int,
        budget: float,
        warmup_peak: float,
        rtt0: float,
        max_permits: int,
        clock: Callable[[], float],
        interval: float = 1.0,
        cooldown: float | None = None,
    ) -> None:
        self.budget = budget
        self.warmup_peak = max(1.0, warmup_peak)
        self.rtt0 = rtt0
        self.max_permits = max_permits
        self.clock = clock
        self.interval = interval
        self.cooldown = 5 * interval if cooldown is None else cooldown
        self.oom_cap: int | None = None
        self._cap_moved = clock()
        self.peak_estimate = self.warmup_peak
        self.memory_bound = bound_from_budget(budget, self.warmup_peak, max_permits)
        self.limit = max(1, min(limit, self.memory_bound))
        self.decisions: deque[LimitDecision] = deque(maxlen=256)
        self._window_start = clock()
        self._reset_window()
        self._record(self.limit, "start")

    def _reset_window(self) -> None:
        self._peaks: list[float] = []
        self._times: list[float] = []
        self._saturated = False

    def _record(self, old: int, reason: str, rtt: float | None = None, queue: float | None = None) -> LimitDecision:
        d = LimitDecision(self.clock(), old, self.limit, self.memory_bound, reason, self.peak_estimate, rtt, queue)
        self.decisions.append(d)
        return d

    def _bound(self) -> int:
        bound = bound_from_budget(self.budget, max(self.warmup_peak, self.peak_estimate), self.max_permits)
        return bound if self.oom_cap is None else min(bound, self.oom_cap)

    # ---------------------------------------------------------------- events
    def observe(self, seconds: float, peak_per_batch: float | None, in_use: int) -> LimitDecision | None:
        """One batch finished: its device time, the tracker's estimate, permits held when it ended
        (this batch included). A peak above the one the bound was sized with acts at once."""
        self._times.append(seconds)
        if in_use >= self.limit:
            self._saturated = True
        if peak_per_batch is not None:
            self._peaks.append(peak_per_batch)
            if peak_per_batch > max(self.warmup_peak, self.peak_estimate):
                self.peak_estimate = peak_per_batch
                return self._apply_bound("peak-rose")
        if self.clock() - self._window_start >= self.interval:
            return self.tick()
        return None

    def on_oom(self, in_use: int, limit_now: int) -> LimitDecision:
        """The device ran out of memory with ``in_use`` batches running; the core has already
        dropped to ``limit_now``. Cap the bound below what failed."""
        self.oom_cap = max(1, min(in_use - 1, limit_now)) if in_use > 1 else 1
        self._cap_moved = self.clock()
        old = self.limit
        self.memory_bound = self._bound()
        self.limit = max(1, min(limit_now, self.memory_bound))
        return self._record(old, "oom")

    def _apply_bound(self, reason: str) -> LimitDecision | None:
        old_bound = self.memory_bound
        self.memory_bound = self._bound()
        old = self.limit
        self.limit = min(self.limit, self.memory_bound)
        if self.limit == old and self.memory_bound == old_bound:
            return None
        return self._record(old, reason)

    def tick(self) -> LimitDecision | None:
        """End of an interval: refresh the memory bound from this interval's peaks, then check
        the limit against the measured batch times."""
        now = self.clock()
        peaks, times, saturated = self._peaks, self._times, self._saturated
        self._window_start = now
        self._reset_window()
        if peaks:
            self.peak_estimate = max(peaks)
        # lift an OOM cap by one per cooldown while the measured peaks leave room for it
        if self.oom_cap is not None and now - self._cap_moved >= self.cooldown:
            room = bound_from_budget(self.budget, max(self.warmup_peak, self.peak_estimate), self.max_permits)
            if room > self.oom_cap:
                self.oom_cap += 1
                self._cap_moved = now
        old_bound, old = self.memory_bound, self.limit
        self.memory_bound = self._bound()
        if self.limit > self.memory_bound:
            self.limit = self.memory_bound
            return self._record(old, "peak-rose")
        if not times:
            return self._record(old, "peak-room") if self.memory_bound != old_bound else None
        rtt = sum(times) / len(times)
        queue = self.limit * max(0.0, 1.0 - self.rtt0 / rtt) if rtt > 0 else 0.0
        alpha, beta = vegas_thresholds(self.limit)
        if queue > beta and self.limit > 1:
            self.limit -= 1
            return self._record(old, "vegas-shrink", rtt, queue)
        if queue < alpha and saturated and self.limit < self.memory_bound:
            self.limit += 1
            return self._record(old, "vegas-grow", rtt, queue)
        if self.memory_bound != old_bound:
            return self._record(old, "peak-room", rtt, queue)
        return None


def vegas_thresholds(limit: int) -> tuple[float, float]:
    """(alpha, beta): grow below alpha permits queued inside the device, shrink above beta. Vegas's
    small constants, widened in proportion for large limits so timing noise of a few percent
    does not walk a large limit down."""
    return max(1.0, limit / 20), max(3.0, limit / 10)


class _Core(Protocol):
    limit: int
    in_use: int

    @property
    def obs(self) -> Any: ...


class AdaptiveLimit:
    """Binds a :class:`LimitController` to the running pod (one event loop, many worker threads)."""

    def __init__(self, controller: LimitController, tracker: PeakTracker | None,
                 on_change: Callable[[LimitDecision], None] | None = None) -> None:
        self.controller = controller
        self.tracker = tracker
        self._listeners: list[Callable[[LimitDecision], None]] = [on_change] if on_change else []
        self._core: _Core | None = None
        self._wake: Callable[[], None] = lambda: None
        self._loop: Any = None
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        return self.controller.limit

    @property
    def memory_bound(self) -> int:
        return self.controller.memory_bound

    def listen(self, fn: Callable[[LimitDecision], None]) -> None:
        self._listeners.append(fn)
        if self.controller.decisions:
            fn(self.controller.decisions[-1])

    def attach(self, core: _Core, wake: Callable[[], None], loop: Any) -> None:
        """Call on the core's loop, once it exists. Its limit becomes the controller's."""
        self._core, self._wake, self._loop = core, wake, loop
        self._set(self.controller.limit)

    def wrap(self, predict: Callable[[Sequence[Any]], Sequence[Any]]) -> Callable[[Sequence[Any]], Sequence[Any]]:
        """``predict`` with peak tracking and timing around it (runs in the worker threads)."""

        def run(requests: Sequence[Any]) -> Sequence[Any]:
            if self.tracker is not None:
                self.tracker.begin()
            t0 = time.perf_counter()
            ok = False
            try:
                out = predict(requests)
                ok = True
                return out
            finally:
                seconds = time.perf_counter() - t0
                peak = self.tracker.end()[0] if self.tracker is not None else None
                if ok and self._loop is not None:
                    self._loop.call_soon_threadsafe(self._observed, seconds, peak)

        return run

    # ---------------------------------------------------------------- on the loop
    def _observed(self, seconds: float, peak: float | None) -> None:
        core = self._core
        if core is None:
            return
        self._publish(self.controller.observe(seconds, peak, core.in_use))

    def oom(self) -> None:
        """The dispatcher saw an OOM (loop thread; the core has already shrunk by one)."""
        core = self._core
        if core is None:
            return
        self._publish(self.controller.on_oom(core.in_use, core.limit))

    def _publish(self, d: LimitDecision | None) -> None:
        if d is None:
            return
        self._set(d.new_limit)
        log.info("permits %d -> %d (%s; memory bound %d, peak/batch %s, rtt %s)", d.old_limit, d.new_limit,
                 d.reason, d.memory_bound, None if d.peak_per_batch is None else int(d.peak_per_batch),
                 None if d.rtt is None else round(d.rtt, 5))
        for fn in self._listeners:
            fn(d)

    def _set(self, limit: int) -> None:
        core = self._core
        if core is None:
            return
        if core.limit != limit:
            core.limit = limit
            core.obs.permits(core.limit, core.in_use)
            self._wake()


def build_adaptive(sizing: Any, cfg: Any, probe: MemoryProbe | None,
                   clock: Callable[[], float] = time.monotonic) -> AdaptiveLimit | None:
    """The adaptive limit for ``permits: auto`` on a device with a memory probe, else None."""
    cc = cfg.concurrency
    if cc.permits != "auto" or not cc.adaptive or probe is None or sizing.memory_bound is None:
        return None
    if sizing.budget_bytes is None or sizing.peak_bytes_per_batch is None or sizing.base_bytes is None:
        return None
    controller = LimitController(
        limit=sizing.permits, budget=sizing.budget_bytes, warmup_peak=float(sizing.peak_bytes_per_batch),
        rtt0=sizing.service_time, max_permits=cc.max_permits, clock=clock,
        interval=cc.adaptive_interval_seconds,
    )
    tracker = PeakTracker(probe, sizing.base_bytes, window=cc.adaptive_interval_seconds, clock=clock)
    return AdaptiveLimit(controller, tracker)
