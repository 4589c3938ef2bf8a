"""Issue 10, item 4, at the unit level (an extra to the HTTP tests): a request withdrawn because its
client went away leaves a future with an exception nobody awaits. It must be retrieved, so asyncio
never reports "Future exception was never retrieved" when the future is collected."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Sequence
from typing import Any

from sluiceway_core.config import TenantsConfig
from sluiceway_pod.admission import AdmissionCore, AdmissionSettings
from sluiceway_pod.clock import MonotonicClock
from sluiceway_pod.dispatcher import Dispatcher
from sluiceway_pod.errors import ClientGone
from sluiceway_pod.tenancy import TenantRegistry


def test_a_withdrawn_request_leaves_no_unretrieved_future_exception() -> None:
    reports: list[str] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: reports.append(str(ctx.get("message"))))
        clock = MonotonicClock()
        gate = threading.Event()

        def run_batch(payloads: Sequence[Any]) -> list[Any]:
            gate.wait(10)
            return list(payloads)

        core: AdmissionCore[int] = AdmissionCore(
            AdmissionSettings(permits=1, max_depth=8, queue_timeout=30, num_classes=1, aging_seconds=1), clock
        )
        disp = Dispatcher(core, run_batch, exec_timeout=30, clock=clock)
        disp.start()
        tenant = TenantRegistry(TenantsConfig(), ["standard"], clock, default_priority="standard").tenant("anonymous")
        kw: dict[str, Any] = {"priority_label": "standard", "batch_key": None, "client_budget": None}
        _, running = disp.submit(tenant, 0, 1, **kw)
        await asyncio.sleep(0.05)
        for i in range(5):  # queued behind the running one, then their clients go away
            ticket, fut = disp.submit(tenant, 0, 2 + i, **kw)
            assert disp.withdraw(ticket, ClientGone("the client disconnected while queued"))
            assert fut.done()
            del ticket, fut
        gate.set()
        assert await running == 1
        await disp.stop()
        del core, disp, running
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(scenario())
    gc.collect()
    assert not [r for r in reports if "never retrieved" in r], reports
