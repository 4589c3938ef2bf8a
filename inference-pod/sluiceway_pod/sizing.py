"""Device memory as the runtime sees it, and the measurements permits are sized from.

* :class:`MemoryProbe` is the one interface through which the pod reads device memory: free and
  total bytes, bytes allocated, the allocator's peak since the last reset. :class:`CudaMemoryProbe`
  reads torch's CUDA allocator; :class:`SimulatedDeviceMemory` is a device memory kept in software
  (a budget, allocations that fail like CUDA's when it is spent) for CPU test models and for
  ``bench/gpu_check.py --device cpu``. A runner may carry its own probe as ``runner.memory_probe``.
* :class:`PeakTracker` estimates, online, the peak device memory of one running batch (one permit)
  from the allocator's peak and the number of batches that ran at the same time.
* :func:`throughput_probe` is the closed-loop warm-up probe: ``k`` threads calling the model
  back to back for a short while, for k = 1, 2, 4, ... up to the memory bound;
  :func:`choose_permits` picks the smallest k within ``share`` of the best throughput.

Concurrency: probes and :class:`PeakTracker` are called from the device worker threads; both
guard their state with a lock. :func:`throughput_probe` runs in the warm-up thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol


class MemoryProbe(Protocol):
    def free_total(self) -> tuple[int, int]:
        """(free, total) bytes of the device."""
        ...

    def allocated(self) -> int: ...

    def peak(self) -> int:
        """Largest ``allocated()`` since the last :meth:`reset_peak`."""
        ...

    def reset_peak(self) -> None: ...

    def synchronize(self) -> None: ...

    def release_cache(self) -> None: ...


class CudaMemoryProbe:
    """torch's CUDA caching allocator, on the current device."""

    def __init__(self) -> None:
        import torch

        self._cuda = torch.cuda

    def free_total(self) -> tuple[int, int]:
        free, total = self._cuda.mem_get_info()
        return int(free), int(total)

    def allocated(self) -> int:
        return int(self._cuda.memory_allocated())

    def peak(self) -> int:
        return int(self._cuda.max_memory_allocated())

    def reset_peak(self) -> None:
        self._cuda.reset_peak_memory_stats()

    def synchronize(self) -> None:
        self._cuda.synchronize()

    def release_cache(self) -> None:
        self._cuda.empty_cache()


class SimulatedOOM(MemoryError):
    """An allocation the simulated device cannot hold (runners translate it to DeviceOOMSignal)."""


class SimulatedDeviceMemory:
    """A device memory of ``total`` bytes kept in software; thread-safe.

    ``allocate`` fails with :class:`SimulatedOOM` when the allocation does not fit, as CUDA's
    allocator would. ``others`` is memory held by other processes (not ours, never freed).
    """

    def __init__(self, total: int, others: int = 0) -> None:
        if total <= 0 or others < 0 or others >= total:
            raise ValueError("need total > 0 and 0 <= others < total")
        self.total = total
        self.others = others
        self._lock = threading.Lock()
        self._allocated = 0
        self._peak = 0
        self.failures = 0

    def allocate(self, n: int) -> None:
        with self._lock:
            if self.others + self._allocated + n > self.total:
                self.failures += 1
                raise SimulatedOOM(
                    f"simulated device out of memory: tried to allocate {n} bytes, "
                    f"{self.total - self.others - self._allocated} free"
                )
            self._allocated += n
            self._peak = max(self._peak, self._allocated)

    def release(self, n: int) -> None:
        with self._lock:
            self._allocated = max(0, self._allocated - n)

    def free_total(self) -> tuple[int, int]:
        with self._lock:
            return self.total - self.others - self._allocated, self.total

    def allocated(self) -> int:
        with self._lock:
            return self._allocated

    def peak(self) -> int:
        with self._lock:
            return self._peak

    def reset_peak(self) -> None:
        with self._lock:
            self._peak = self._allocated

    def synchronize(self) -> None:
        pass

    def release_cache(self) -> None:
        pass


def memory_probe_for(runner: Any) -> MemoryProbe | None:
    """The runner's own probe (``runner.memory_probe``), CUDA's on a CUDA device, else None."""
    own = getattr(runner, "memory_probe", None)
    if own is not None:
        return own  # type: ignore[no-any-return]
    if str(getattr(runner, "device", "cpu")).startswith("cuda"):
        return CudaMemoryProbe()
    return None


def permits_from_memory(free: int, reserve: int, peak: int, safety: float, cap: int) -> int:
    """floor((free - reserve) / peak * safety), clamped to [1, cap]."""
    return max(1, min(cap, math.floor(max(0, free - reserve) / max(1, peak) * safety)))


def bound_from_budget(budget: float, peak_per_permit: float, cap: int) -> int:
    """Permits that fit ``budget`` bytes (already net of reserve and safety), in [1, cap]."""
    return max(1, min(cap, math.floor(budget / max(1.0, peak_per_permit))))


def peak_of(probe: MemoryProbe, call: Callable[[], object]) -> int:
    """Device bytes ``call`` needed above what was allocated before it (at least 1)."""
    probe.synchronize()
    base = probe.allocated()
    probe.reset_peak()
    call()
    probe.synchronize()
    return max(1, probe.peak() - base)


class PeakTracker:
    """Online estimate of the peak memory of one running batch.

    Each batch calls :meth:`begin` before and :meth:`end` after it runs (in its worker thread).
    Over a window, the allocator's peak above ``base`` (model weights and everything allocated at
    idle), divided by the most batches that ran at once in that window, estimates the peak of one
    batch. The window restarts (and the allocator's peak is reset) when the device goes idle or
    ``window`` seconds have passed, so a peak that has passed stops counting.
    """

    def __init__(self, probe: MemoryProbe, base: int, *, window: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.probe = probe
        self.base = base
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._running = 0
        self._max_running = 0
        self._since = clock()

    def begin(self) -> None:
        with self._lock:
            self._running += 1
            self._max_running = max(self._max_running, self._running)

    def end(self) -> tuple[float, int]:
        """Returns (estimated peak bytes per batch, batches that ran at once in the window)."""
        with self._lock:
            peak = self.probe.peak()
            concurrent = max(1, self._max_running)
            estimate = max(0.0, (peak - self.base) / concurrent)
            self._running -= 1
            now = self._clock()
            if self._running == 0 or now - self._since >= self.window:
                self.probe.reset_peak()
                self._max_running = self._running
                self._since = now
            return estimate, concurrent


def probe_levels(bound: int) -> list[int]:
    """1, 2, 4, ... below ``bound``, then ``bound`` itself."""
    levels = []
    k = 1
    while k < bound:
        levels.append(k)
        k *= 2
    levels.append(bound)
    return levels


def throughput_probe(
    call: Callable[[], object], levels: Sequence[int], seconds_per_level: float, *, min_calls: int = 2
) -> dict[int, float]:
    """Closed loop: for each level k, k threads call ``call`` back to back for about
    ``seconds_per_level`` (each thread at least ``min_calls`` times). Returns calls per second."""
    out: dict[int, float] = {}
    for k in levels:
        counts = [0] * k
        stop_at = time.perf_counter() + seconds_per_level
        errors: list[BaseException] = []

        def worker(i: int, stop_at: float = stop_at, counts: list[int] = counts,
                   errors: list[BaseException] = errors) -> None:
            try:
                while counts[i] < min_calls or time.perf_counter() < stop_at:
                    call()
                    counts[i] += 1
            except BaseException as e:  # reported to the caller, which decides
                errors.append(e)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise errors[0]
        out[k] = sum(counts) / elapsed
    return out


def choose_permits(rates: dict[int, float], share: float) -> int:
    """The smallest level whose throughput is at least ``share`` of the best one."""
    best = max(rates.values())
    return min(k for k, r in rates.items() if r >= share * best)
