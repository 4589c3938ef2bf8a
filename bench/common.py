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

from .loadgen import RunResult
from .servers import CLIENT_CORE, RESULTS, SERVER_CORE, ServerProc, load_average, pin_self, pinning_possible


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

        loop = f"uvloop {getattr(uvloop, '__version__', '?')}"
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
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs)
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


def window_probes(
    srv: ServerProc, warmup: float, duration: float, *, computed: bool = False
) -> dict[str, Any]:
    """Probes at the measured window's edges: the server's CPU use and run-queue wait, and
    optionally how many requests it has started computing."""
    end = warmup + duration
    probes: dict[str, Any] = {"cpu_start": (warmup, srv.cpu_probe), "cpu_end": (end, srv.cpu_probe)}
    if computed:
        probes["computed_start"] = (warmup, srv.computed)
        probes["computed_end"] = (end, srv.computed)
    return probes


def server_load(res: RunResult) -> dict[str, float | None]:
    """Server CPU use and run-queue wait during the window, as shares of the window's length."""
    a, b = res.probes.get("cpu_start"), res.probes.get("cpu_end")
    if not (isinstance(a, dict) and isinstance(b, dict) and "cpu_s" in a and "cpu_s" in b):
        return {"server_cpu": None, "server_runq_wait": None}
    return {"server_cpu": (b["cpu_s"] - a["cpu_s"]) / res.duration,
            "server_runq_wait": (b["runq_wait_s"] - a["runq_wait_s"]) / res.duration}
