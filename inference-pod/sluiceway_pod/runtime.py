"""Start-up measurements: warm-up, service time, peak memory per request and the sizes derived from them.

Runs once, before readiness turns true, in the calling thread (the server runs it in a worker
thread so the event loop stays responsive for liveness probes).

Sizing rules (documented in docs/pod.md):
    permits   = floor((free - reserve) / peak_per_request * safety), clamped to [1, maxPermits]
                on CPU, ``auto`` -> ``concurrency.cpuDefault``
    batch     = largest B <= maxAutoBatchSize whose predicted peak (linear in B, from B=1 and
                B=maxAutoBatchSize probes) fits (free - reserve) * safety; on CPU -> maxAutoBatchSize
    max queue = N*T/S (permits * target wait / measured service time), see :mod:`.queueing`
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from sluiceway_core.config import PodConfig
from sluiceway_core.queueing import queue_bound

from .models import Runner, batchable, example_request


@dataclass(frozen=True)
class Sizing:
    device: str
    permits: int
    max_batch_size: int
    max_depth: int
    service_time: float
    peak_bytes_per_request: int | None
    free_bytes: int | None
    total_bytes: int | None


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


def _peak_for(runner: Runner, rows: int) -> int:
    import torch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    runner.predict([example_request(runner.inputs, rows)])
    torch.cuda.synchronize()
    return max(1, int(torch.cuda.max_memory_allocated() - base))


def permits_from_memory(free: int, reserve: int, peak: int, safety: float, cap: int) -> int:
    return max(1, min(cap, math.floor(max(0, free - reserve) / peak * safety)))


def measure(runner: Runner, cfg: PodConfig) -> Sizing:
    """Warm the model up and derive permits, batch size and queue bound."""
    iters = cfg.model.warmup_iterations
    sample = example_request(runner.inputs, 1)
    runner.predict([sample])  # first call: lazy init, kernels, allocator pools
    t0 = time.perf_counter()
    for _ in range(iters):
        runner.predict([sample])
    service = max(1e-4, (time.perf_counter() - t0) / iters)

    cc, bc = cfg.concurrency, cfg.batching
    mem = device_memory() if runner.device.startswith("cuda") else None
    can_batch = batchable(runner.inputs)
    peak1: int | None = None
    free = total = None
    if mem is not None:
        free, total = mem
        peak1 = _peak_for(runner, 1)
        free = device_memory()[0]  # type: ignore[index]

    # batch size
    if not can_batch:
        batch = 1
    elif bc.max_batch_size == "auto":
        cap = bc.max_auto_batch_size
        if mem is None or peak1 is None or free is None:
            batch = cap
        else:
            peak_cap = _peak_for(runner, cap) if cap > 1 else peak1
            slope = (peak_cap - peak1) / (cap - 1) if cap > 1 else 0.0
            budget = max(0, free - cc.memory_reserve_bytes) * cc.safety_factor
            batch = 1
            for b in range(cap, 0, -1):
                if peak1 + slope * (b - 1) <= budget:
                    batch = b
                    break
    else:
        batch = int(bc.max_batch_size)

    # permits
    if cc.permits != "auto":
        permits = int(cc.permits)
    elif mem is None or peak1 is None or free is None:
        permits = cc.cpu_default
    else:
        peak = peak1 if batch == 1 else _peak_for(runner, batch)
        free = device_memory()[0]  # type: ignore[index]
        permits = permits_from_memory(free, cc.memory_reserve_bytes, peak, cc.safety_factor, cc.max_permits)

    qc = cfg.queue
    if qc.max_depth == "auto":
        depth = queue_bound(
            permits * batch, qc.target_wait_seconds, service, lo=qc.min_auto_depth, hi=qc.max_auto_depth
        )
    else:
        depth = int(qc.max_depth)
    return Sizing(runner.device, permits, batch, depth, service, peak1, free, total)
