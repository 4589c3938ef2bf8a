"""Start-up measurements: warm-up, service time, peak memory per batch and the sizes derived from them.

Runs once, before readiness turns true, in the calling thread (the server runs it in a worker
thread so the event loop stays responsive for liveness probes).

Every probe runs at the largest request the model accepts: variable dimensions at their declared
``maxShape`` (1 where none is declared, with a warning), the batch dimension at ``maxShape[0]`` rows
per request, and batches at the batch size in force. Device memory is read through a
:class:`~sluiceway_pod.sizing.MemoryProbe` (CUDA's allocator, or a runner's own ``memory_probe``).

Sizing rules (documented in docs/pod.md):
    budget       = (free - memoryReserveBytes) * safetyFactor, free read at idle after loading
    memory bound = floor(budget / peak of one batch in force), clamped to [1, maxPermits]
    permits      = ``auto``: the smallest count in 1, 2, 4, ..., memory bound whose closed-loop
                   throughput reaches ``probeShare`` of the best (``probeSeconds: 0`` -> the bound);
                   without a memory probe (CPU) -> ``concurrency.cpuDefault``
    batch        = largest B <= maxAutoBatchSize whose predicted peak (linear in B, from B=1 and
                   B=maxAutoBatchSize probes) fits the budget; without a memory probe -> maxAutoBatchSize
    max queue    = N*B*T/S (permits * batch * target wait / service time of a batch of B), see
                   :mod:`sluiceway_core.queueing`
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sluiceway_core.config import PodConfig
from sluiceway_core.queueing import queue_bound

from .models import Runner, Tensors, batchable, example_request, max_rows, unsized_dims
from .sizing import (
    bound_from_budget,
    choose_permits,
    memory_probe_for,
    peak_of,
    permits_from_memory,
    probe_levels,
    throughput_probe,
)

__all__ = ["Sizing", "allocated_bytes", "device_memory", "measure", "permits_from_memory", "release_cache"]

log = logging.getLogger("sluiceway.runtime")


@dataclass(frozen=True)
class Sizing:
    device: str
    permits: int
    max_batch_size: int
    max_depth: int
    service_time: float  # of one batch of ``max_batch_size`` largest requests
    peak_bytes_per_request: int | None  # one largest request
    free_bytes: int | None
    total_bytes: int | None
    memory_bound: int | None = None  # permits that fit device memory (None: no memory probe)
    peak_bytes_per_batch: int | None = None  # one batch in force
    budget_bytes: float | None = None  # (free - reserve) * safety
    base_bytes: int | None = None  # allocated at idle after loading (weights)
    service_time_request: float | None = None  # one largest request alone
    probe_rates: dict[int, float] | None = None  # permits -> batches/s in the warm-up probe
    rows_per_request: int = 1


def device_memory() -> tuple[int, int] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)


def allocated_bytes() -> int:
    import torch

    return int(torch.cuda.memory_allocated()) if torch.cuda.is_available() else 0


def release_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _timed(runner: Runner, requests: Sequence[Tensors], iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        runner.predict(requests)
    return max(1e-4, (time.perf_counter() - t0) / iters)


def measure(runner: Runner, cfg: PodConfig) -> Sizing:
    """Warm the model up and derive permits, batch size and queue bound."""
    iters = cfg.model.warmup_iterations
    cc, bc = cfg.concurrency, cfg.batching
    rows = max_rows(runner.inputs)
    unsized = unsized_dims(runner.inputs)
    if unsized:
        log.warning("inputs %s have variable dimensions without maxShape: memory is probed at size 1 "
                    "there, so permits may be too many for large requests", unsized)
    one = example_request(runner.inputs, rows)
    runner.predict([one])  # first call: lazy init, kernels, allocator pools
    service1 = _timed(runner, [one], iters)

    probe = memory_probe_for(runner)
    can_batch = batchable(runner.inputs)
    peak1: int | None = None
    free = total = base = None
    budget: float | None = None
    if probe is not None:
        probe.release_cache()
        probe.synchronize()
        free, total = probe.free_total()
        base = probe.allocated()
        peak1 = peak_of(probe, lambda: runner.predict([one]))
        budget = max(0, free - cc.memory_reserve_bytes) * cc.safety_factor

    # batch size
    if not can_batch:
        batch = 1
    elif bc.max_batch_size == "auto":
        cap = bc.max_auto_batch_size
        if probe is None or peak1 is None or budget is None:
            batch = cap
        else:
            peak_cap = peak_of(probe, lambda: runner.predict([one] * cap)) if cap > 1 else peak1
            slope = (peak_cap - peak1) / (cap - 1) if cap > 1 else 0.0
            batch = 1
            for b in range(cap, 0, -1):
                if peak1 + slope * (b - 1) <= budget:
                    batch = b
                    break
    else:
        batch = int(bc.max_batch_size)
    batch_reqs = [one] * batch
    service = _timed(runner, batch_reqs, iters) if batch > 1 else service1
    peak_batch = peak1
    if probe is not None and batch > 1:
        peak_batch = peak_of(probe, lambda: runner.predict(batch_reqs))

    # permits
    memory_bound: int | None = None
    rates: dict[int, float] | None = None
    if probe is not None and budget is not None and peak_batch is not None:
        memory_bound = bound_from_budget(budget, peak_batch, cc.max_permits)
    if cc.permits != "auto":
        permits = int(cc.permits)
    elif memory_bound is None:
        permits = cc.cpu_default
    else:
        permits = memory_bound
        if cc.probe_seconds > 0 and memory_bound > 1:
            levels = probe_levels(memory_bound)
            rates = throughput_probe(lambda: runner.predict(batch_reqs), levels, cc.probe_seconds / len(levels))
            permits = choose_permits(rates, cc.probe_share)
            log.info("throughput probe (batches/s by permits): %s -> %d permits (memory bound %d)",
                     {k: round(v, 2) for k, v in rates.items()}, permits, memory_bound)

    qc = cfg.queue
    if qc.max_depth == "auto":
        depth = queue_bound(
            permits * batch, qc.target_wait_seconds, service, lo=qc.min_auto_depth, hi=qc.max_auto_depth
        )
    else:
        depth = int(qc.max_depth)
    return Sizing(
        runner.device, permits, batch, depth, service, peak1, free, total,
        memory_bound=memory_bound, peak_bytes_per_batch=peak_batch, budget_bytes=budget, base_bytes=base,
        service_time_request=service1, probe_rates=rates, rows_per_request=rows,
    )
