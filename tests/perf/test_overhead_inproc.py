"""``python -m bench.overhead --in-process``: the harness drives both real apps (the pod's ASGI app on
a started data plane, the plain FastAPI app) with real OIP requests and reports CPU per request. It
raises on any answer that is not 200, so this checks that both apps answered every call."""

from __future__ import annotations

import pytest

from bench.overhead import _inproc_worker


@pytest.mark.parametrize("app", ["sluiceway", "fastapi"])
@pytest.mark.parametrize("callers", [1, 8])
def test_in_process_harness_answers_every_call(app: str, callers: int) -> None:
    r = _inproc_worker(app, 64, callers)
    assert r["cpu_us"] > 0 and r["wall_us"] > 0
