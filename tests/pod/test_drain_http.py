"""Issue 10, item 5 and the SIGTERM fault: readiness goes false first, the pod keeps serving and
admitting (within the budget) while endpoints are removed, then drains; under twice the load it can
serve, every accepted request is answered, no connection is reset, and the process exits 0 in budget.

The load generator plays the endpoints controller: it polls readiness and stops sending new requests
``LAG`` seconds after readiness turned false (less than ``drainDelaySeconds``)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from podtools import infer_body

pytestmark = pytest.mark.slow

SERVICE_MS = 50
PERMITS = 2
CAPACITY = PERMITS * 1000 / SERVICE_MS  # requests per second
LAG = 0.6
DELAY = 1.5
BUDGET = 10.0


def test_sigterm_under_twice_the_load_answers_everyone_resets_nothing_and_exits_0(pod_factory: Any) -> None:
    pod = pod_factory(
        "--model",
        f"synthetic:{SERVICE_MS}",
        "--concurrency",
        str(PERMITS),
        "--max-queue",
        "40",
        "--queue-timeout",
        "5",
        config={"server": {"drainDelaySeconds": DELAY, "drainSeconds": BUDGET}},
    )
    outcomes: Counter[str] = Counter()
    late: Counter[str] = Counter()  # requests sent after SIGTERM (the endpoint-removal lag)
    errors: list[str] = []

    async def scenario() -> tuple[float, float | None]:
        sigterm_at: float | None = None
        unready_at: float | None = None
        tasks: list[asyncio.Task[None]] = []
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=500)) as c:

            async def one(after_sigterm: bool) -> None:
                try:
                    r = await c.post(pod.infer_url, json=infer_body())
                except httpx.ConnectError:
                    outcomes["refused (never accepted)"] += 1
                    return
                except httpx.HTTPError as e:
                    errors.append(f"{type(e).__name__}: {e}")
                    return
                key = f"{r.status_code} {r.json().get('reason', '')}".strip()
                outcomes[key] += 1
                if after_sigterm:
                    late[key] += 1

            start = time.monotonic()
            interval = 1.0 / (2 * CAPACITY)  # twice what the pod can serve
            nxt = start
            while True:
                now = time.monotonic()
                if sigterm_at is None and now - start > 2.0:
                    pod.proc.send_signal(signal.SIGTERM)
                    sigterm_at = now
                if sigterm_at is not None and unready_at is None:
                    r = await c.get(f"{pod.url}/v2/health/ready")
                    if r.status_code == 503:
                        unready_at = time.monotonic()
                if unready_at is not None and time.monotonic() - unready_at > LAG:
                    break  # the endpoints are gone: no new traffic reaches this pod
                tasks.append(asyncio.create_task(one(sigterm_at is not None)))
                nxt += interval
                await asyncio.sleep(max(0.0, nxt - time.monotonic()))
            await asyncio.gather(*tasks)
        assert sigterm_at is not None
        return sigterm_at, unready_at

    t0 = time.monotonic()
    sigterm_at, unready_at = asyncio.run(scenario())
    code = pod.proc.wait(DELAY + BUDGET + 10)
    exited_after = time.monotonic() - sigterm_at
    print(f"outcomes {dict(outcomes)}; sent after SIGTERM {dict(late)}; exit {code} {exited_after:.1f}s after SIGTERM")
    assert not errors, errors[:5]  # zero connection resets / protocol errors
    assert unready_at is not None and unready_at - sigterm_at < 1.0  # readiness went false first, at once
    assert sum(late.values()) > 0 and late["200"] > 0  # still served while the endpoints were going
    assert not any(k.startswith("503 draining") for k in late), late  # nobody refused inside the delay
    assert set(outcomes) <= {"200", "429 queue_full"}, outcomes  # answered: served or shed at once
    assert code == 0 and exited_after < DELAY + BUDGET + 6
    assert time.monotonic() - t0 < 60
    assert "drain complete" in pod.logs()
