"""Issue 13 (a faster data plane), at the unit level: the dispatcher starts a request at a free
permit inside ``submit`` (no wake-up of its background task), starts queued work from the finishing
batch, and still keeps every timer: queue deadlines (also one earlier than the task's current
sleep), the execution budget (504 at once, the permit held until the thread returns)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from sluiceway_core.config import TenantsConfig
from sluiceway_pod.admission import AdmissionCore, AdmissionSettings
from sluiceway_pod.clock import MonotonicClock
from sluiceway_pod.dispatcher import Dispatcher
from sluiceway_pod.errors import DeadlineExpired, ExecTimeout, QueueTimeout
from sluiceway_pod.tenancy import TenantRegistry

KW: dict[str, Any] = {"priority_label": "standard", "batch_key": None}


def _setup(
    run_batch: Any, *, permits: int = 1, queue_timeout: float = 30.0, exec_timeout: float = 30.0
) -> tuple[AdmissionCore[int], Dispatcher[int], Any]:
    clock = MonotonicClock()
    core: AdmissionCore[int] = AdmissionCore(
        AdmissionSettings(permits=permits, max_depth=16, queue_timeout=queue_timeout, num_classes=1, aging_seconds=1),
        clock,
    )
    disp = Dispatcher(core, run_batch, exec_timeout=exec_timeout, clock=clock)
    tenant = TenantRegistry(TenantsConfig(), ["standard"], clock, default_priority="standard").tenant("anonymous")
    return core, disp, tenant


def test_a_free_permit_starts_the_request_inside_submit_without_waking_the_task() -> None:
    async def scenario() -> None:
        core, disp, tenant = _setup(lambda payloads: [p * 10 for p in payloads], permits=2)
        disp.start()
        await asyncio.sleep(0.01)  # the background task is asleep (nothing queued: no timer)
        ticket, fut = disp.submit(tenant, 0, 4, client_budget=None, **KW)
        assert ticket.state == "running" and core.in_use == 1 and core.depth == 0
        assert not disp._wake.is_set()  # the task was not needed
        assert await asyncio.wait_for(fut, 10) == 40
        assert core.in_use == 0 and core.idle
        await disp.stop()

    asyncio.run(scenario())


def test_queued_requests_start_when_a_batch_finishes_in_order() -> None:
    gate = threading.Event()
    order: list[int] = []

    def run_batch(payloads: Sequence[int]) -> list[int]:
        gate.wait(10)
        order.extend(payloads)
        return list(payloads)

    async def scenario() -> None:
        core, disp, tenant = _setup(run_batch)
        disp.start()
        futs = [disp.submit(tenant, 0, i, client_budget=None, **KW)[1] for i in range(4)]
        assert core.in_use == 1 and core.depth == 3
        gate.set()
        assert await asyncio.wait_for(asyncio.gather(*futs), 10) == [0, 1, 2, 3]
        assert order == [0, 1, 2, 3] and core.idle
        await disp.stop()

    asyncio.run(scenario())


def test_queue_deadlines_fire_even_one_earlier_than_the_task_sleeps_for() -> None:
    gate = threading.Event()

    def run_batch(payloads: Sequence[int]) -> list[int]:
        gate.wait(10)
        return list(payloads)

    async def scenario() -> None:
        _, disp, tenant = _setup(run_batch, queue_timeout=3.0)
        disp.start()
        _, running = disp.submit(tenant, 0, 0, client_budget=None, **KW)
        _, late = disp.submit(tenant, 0, 1, client_budget=None, **KW)  # queue deadline in 3 s
        await asyncio.sleep(0.05)  # the task now sleeps until that deadline
        t0 = time.monotonic()
        _, early = disp.submit(tenant, 0, 2, client_budget=0.3, **KW)  # its own deadline is earlier
        with pytest.raises(DeadlineExpired):
            await asyncio.wait_for(early, 10)
        assert time.monotonic() - t0 < 2.5  # answered at its own deadline, not at the 3 s one
        with pytest.raises(QueueTimeout):
            await asyncio.wait_for(late, 10)
        gate.set()
        assert await asyncio.wait_for(running, 10) == 0
        await disp.stop()

    asyncio.run(scenario())


def test_exec_timeout_answers_504_and_holds_the_permit_until_the_thread_returns() -> None:
    release = threading.Event()

    def run_batch(payloads: Sequence[int]) -> list[int]:
        release.wait(10)
        return list(payloads)

    async def scenario() -> None:
        core, disp, tenant = _setup(run_batch, exec_timeout=0.2)
        disp.start()
        _, fut = disp.submit(tenant, 0, 1, client_budget=None, **KW)
        with pytest.raises(ExecTimeout):
            await asyncio.wait_for(fut, 10)
        _, queued = disp.submit(tenant, 0, 2, client_budget=None, **KW)
        await asyncio.sleep(0.1)
        assert core.in_use == 1 and core.depth == 1  # the device is still busy: nothing double-booked
        release.set()
        assert await asyncio.wait_for(queued, 10) == 2
        assert core.idle
        await disp.stop()

    asyncio.run(scenario())
