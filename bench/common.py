"""Shared pieces of the benchmark drivers: measuring mu, the machine note, tables and result files.

Plain synchronous helpers, called from a driver's main thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluiceway_pod.models import SyntheticRunner, TensorSpec, example_request

from .servers import CLIENT_CORE, RESULTS, SERVER_CORE, load_average, pin_self, pinning_possible


def measure_mu(service_ms: float, seconds: float) -> dict[str, float]:
    """Service rate of the stand-in alone (no HTTP), timed on the server's core for ``seconds``."""
    runner = SyntheticRunner(service_ms, [TensorSpec("INPUT0", "FP32", (-1, -1))],
                             [TensorSpec("OUTPUT0", "FP32", (-1, -1))], "cpu")
    sample = [example_request(runner.inputs, 1)]
    pinned = pinning_possible() and pin_self(SERVER_CORE)
    try:
        runner.predict(sample)
        times: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            runner.predict(sample)
            times.append(time.perf_counter() - t)
    finally:
        if pinned:
            pin_self(CLIENT_CORE)
    mean = statistics.fmean(times)
    return {"mu": 1.0 / mean, "nominal_mu": 1000.0 / service_ms, "mean_service_ms": mean * 1000,
            "max_service_ms": max(times) * 1000, "samples": len(times)}


def setup_client(nice: int | None) -> dict[str, Any]:
    """Pin the generator to its core and optionally renice it. Returns what was done."""
    possible = pinning_possible()
    pinned = possible and pin_self(CLIENT_CORE)
    applied = None
    if nice:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            applied = nice
    return {"client_core": CLIENT_CORE if pinned else None, "server_core": SERVER_CORE if pinned else None,
            "nice": applied, "pinning_possible": possible}


def machine_info() -> dict[str, Any]:
    try:
        import uvloop

        loop = f"uvloop {uvloop.__version__}"
    except ImportError:
        loop = "asyncio"
    return {
        "cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform(),
        "client_loop": loop, "load_average_start": load_average(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def save_results(kind: str, doc: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    return path


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def median(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
