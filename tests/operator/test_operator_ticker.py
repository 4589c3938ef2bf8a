"""The periodic loops (no cluster): one job per object per tick, never two at once for one object,
a failing object does not stop the others, deleted objects drop out."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sluiceway_operator.ticker import Ticker, Tracker

pytestmark = pytest.mark.timeout(60)


def _body(uid: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid, "name": uid, "namespace": "ns"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def test_tracker_follows_events() -> None:
    t = Tracker()
    t.seen(None, _body("a"))
    t.seen("ADDED", _body("b"))
    t.seen("MODIFIED", _body("c", deleting=True))
    assert sorted(b["metadata"]["uid"] for b in t.live()) == ["a", "b"]
    t.seen("DELETED", _body("a"))
    assert "a" not in t and [b["metadata"]["uid"] for b in t.live()] == ["b"]


def test_a_busy_object_is_skipped_and_a_failing_one_does_not_stop_the_others() -> None:
    tracker = Tracker()
    for uid in ("slow", "bad", "ok"):
        tracker.seen("ADDED", _body(uid))
    release = threading.Event()
    calls: dict[str, int] = {"slow": 0, "bad": 0, "ok": 0}
    lock = threading.Lock()

    def job(body: Mapping[str, Any]) -> None:
        uid = body["metadata"]["uid"]
        with lock:
            calls[uid] += 1
        if uid == "slow":
            release.wait(30)
        if uid == "bad":
            raise RuntimeError("boom")

    with ThreadPoolExecutor(max_workers=3) as pool:
        ticker = Ticker("test", 3600, tracker, job, pool)
        for _ in range(3):
            ticker.tick()
            pool.submit(lambda: None).result()  # let the quick jobs run
            for f in list(ticker._running.values()):
                if f is not ticker._running.get("slow"):
                    f.result(timeout=10)
        assert calls == {"slow": 1, "bad": 3, "ok": 3}
        release.set()
        ticker._running["slow"].result(timeout=10)
        ticker.tick()
        ticker._running["slow"].result(timeout=10)
    assert calls["slow"] == 2
