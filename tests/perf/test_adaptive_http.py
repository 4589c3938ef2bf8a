"""The adaptive permit limit in a real pod over HTTP: a CPU model whose device memory is simulated
through the runtime's MemoryProbe interface (tests/perf/perfmodels.py).

The model holds 1000 bytes per input element for 30 ms. ``maxShape`` [1, 1000] makes the warm-up
peak 1 MB per request; the simulated device has 12 MB and the safety factor is 0.5, so the budget
is 6 MB and the memory bound 6. Requests whose first value is 2 need twice as much memory (still
within the device: no OOM), so the measured peaks rise and the limit must shrink at once to 3; when
normal requests come back, the limit must grow back to the bound, one step per interval, and never
exceed it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from podtools import PodProcess, start_pod

LIMIT = "sluiceway_concurrency_limit"
BOUND = "sluiceway_concurrency_memory_bound"


def _body(value: float) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "shape": [1, 1000], "datatype": "FP32", "data": [value] * 1000}]}


async def _load(pod: PodProcess, value: float, seconds: float, clients: int) -> dict[int, int]:
    codes: dict[int, int] = {}
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=30) as client:

        async def one() -> None:
            while time.monotonic() < end:
                r = await client.post(pod.infer_url, json=_body(value))
                codes[r.status_code] = codes.get(r.status_code, 0) + 1

        await asyncio.gather(*(one() for _ in range(clients)))
    return codes


@pytest.fixture
def hungry_pod(tmp_path: Path) -> Any:
    config = {
        "model": {"spec": "perf.perfmodels:hungry", "name": "hungry", "warmupIterations": 1,
                  "inputs": [{"name": "INPUT0", "shape": [-1, -1], "maxShape": [1, 1000]}]},
        "concurrency": {"permits": "auto", "memoryReserveBytes": 0, "safetyFactor": 0.5, "probeSeconds": 0,
                        "adaptiveIntervalSeconds": 0.3},
        "queue": {"maxDepth": 200, "timeoutSeconds": 20},
    }
    env = {"HUNGRY_TOTAL_BYTES": str(12 * 1000 * 1000), "HUNGRY_BYTES_PER_ELEMENT": "1000", "HUNGRY_HOLD_MS": "30"}
    pod = start_pod(tmp_path, config=config, env=env)
    yield pod
    pod.terminate(30)


@pytest.mark.timeout(180)
async def test_permits_shrink_when_peaks_rise_and_grow_back(hungry_pod: PodProcess) -> None:
    pod = hungry_pod
    async with httpx.AsyncClient(timeout=10) as client:
        meta = (await client.get(f"{pod.url}/v2/models/hungry")).json()["parameters"]
        too_big = {"inputs": [{"name": "INPUT0", "shape": [1, 1001], "datatype": "FP32", "data": [1.0] * 1001}]}
        r = await client.post(pod.infer_url, json=too_big)
    assert meta["concurrency_memory_bound"] == 6 and meta["concurrency"] == 6
    assert meta["peak_memory_bytes_per_request"] == 1000 * 1000
    assert pod.metric(BOUND) == 6 and pod.metric(LIMIT) == 6

    # beyond maxShape: refused before it reaches the model
    assert r.status_code == 400 and "maxShape" in r.json()["error"]

    # 2x the memory per request: 3 fit the 6 MB budget
    codes = await _load(pod, 2.0, 3.0, clients=8)
    assert set(codes) == {200}, codes
    assert pod.metric(LIMIT) == 3 and pod.metric(BOUND) == 3
    assert pod.metric("sluiceway_oom_total") == 0  # measured peaks, not OOMs, moved it

    # back to normal requests: the limit climbs back to the bound, never above it
    seen: list[float] = []
    task = asyncio.create_task(_load(pod, 1.0, 8.0, clients=10))
    while not task.done():
        seen.append(await asyncio.to_thread(pod.metric, LIMIT))
        await asyncio.sleep(0.1)
    codes = task.result()
    assert set(codes) == {200}, codes
    # back at the bound, never above it (the latency check may take a permit off again on a loaded box)
    assert max(seen) == 6 and pod.metric(BOUND) == 6
    rising = [b for a, b in itertools.pairwise(seen) if b > a]
    assert rising and all(b - a <= 2 for a, b in itertools.pairwise(seen))  # gradual
