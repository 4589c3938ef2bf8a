"""The periodic loops (no cluster): one job per object per tick, never two at once for one object,
a failing object does not stop the others, deleted objects drop out."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sluiceway_operator.ticker import Debouncer, SecretVersions, Ticker, Tracker

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


# -- the tenant-key watch: which objects, which events, and the debounce (issue 22 follow-up) --------


def _with_keys(uid: str, *secrets: str, namespace: str = "ns") -> dict[str, Any]:
    body = _body(uid)
    body["metadata"]["namespace"] = namespace
    body["spec"] = {"tenants": [{"name": f"t{i}", "keySecretRef": {"name": s}} for i, s in enumerate(secrets)]}
    return body


def test_only_the_objects_of_the_namespace_that_name_the_secret() -> None:
    t = Tracker()
    t.seen("ADDED", _with_keys("a", "k1", "k2"))
    t.seen("ADDED", _with_keys("b", "k2"))
    t.seen("ADDED", _with_keys("c", "k1", namespace="other"))
    t.seen("ADDED", _body("d"))  # no tenants
    t.seen("ADDED", {"metadata": {"uid": "e", "namespace": "ns"}, "spec": {"tenants": "bad"}})
    t.seen("MODIFIED", {**_with_keys("f", "k1"), "metadata": {**_body("f", deleting=True)["metadata"]}})
    assert t.using_key_secret("ns", "k1") == ["a"]
    assert sorted(t.using_key_secret("ns", "k2")) == ["a", "b"]
    assert t.using_key_secret("ns", "k3") == []
    assert t.get("a") is not None and t.get("f") is None and t.get("zz") is None


def test_secret_versions_tell_a_change_from_a_relist() -> None:
    v = SecretVersions()

    def meta(rv: str, name: str = "k") -> dict[str, Any]:
        return {"namespace": "ns", "name": name, "resourceVersion": rv}

    assert not v.changed(None, meta("1"))  # the first listing at a start: the resume handlers apply
    assert not v.changed(None, meta("1"))  # a relist, unchanged
    assert v.changed(None, meta("2"))  # changed while the watch was down
    assert v.changed("MODIFIED", meta("3"))
    assert not v.changed("MODIFIED", meta("3"))  # the same version again
    assert v.changed("ADDED", meta("9", "new"))  # a Secret created (or labelled) later
    assert v.changed("DELETED", meta("4"))  # deleted, or its label removed
    assert len(v) == 1


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_debouncer_joins_pokes_and_runs_each_object_once_after_the_delay() -> None:
    clock = _Clock()
    tracker = Tracker()
    for uid in ("a", "b"):
        tracker.seen("ADDED", _body(uid))
    ran: list[str] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        d = Debouncer(1.0, tracker.get, lambda b: ran.append(b["metadata"]["uid"]), pool, clock=clock)
        d.poke("a")
        clock.now += 0.5
        d.poke("a")  # joins the pending one: still due at 101.0
        d.poke("b")
        d.poke("gone")  # no longer tracked when due: dropped
        assert d.run_due() == pytest.approx(0.5)
        assert ran == []
        clock.now += 0.5
        assert d.run_due() == pytest.approx(0.5)  # a ran; b is due at 101.5
        for f in list(d._running.values()):
            f.result(timeout=10)
        assert ran == ["a"]
        clock.now += 0.5
        assert d.run_due() is None
        for f in list(d._running.values()):
            f.result(timeout=10)
    assert ran == ["a", "b"]


def test_debouncer_defers_a_busy_object_and_retries_a_failure_a_bounded_number_of_times() -> None:
    clock = _Clock()
    tracker = Tracker()
    tracker.seen("ADDED", _body("slow"))
    tracker.seen("ADDED", _body("bad"))
    release = threading.Event()
    calls = {"slow": 0, "bad": 0}

    def job(body: Mapping[str, Any]) -> None:
        uid = body["metadata"]["uid"]
        calls[uid] += 1
        if uid == "slow":
            release.wait(30)
        else:
            raise RuntimeError("API server unavailable")

    with ThreadPoolExecutor(max_workers=2) as pool:
        d = Debouncer(1.0, tracker.get, job, pool, retry=5.0, attempts=3, clock=clock)
        d.poke("slow")
        clock.now += 1.0
        d.run_due()
        d.poke("slow")  # a change while the first pass runs: it may have read the old Secret
        clock.now += 1.0
        d.run_due()  # still running: pushed back, not dropped
        assert "slow" in d.pending() and calls["slow"] == 1
        release.set()
        d._running["slow"].result(timeout=10)
        clock.now += 1.0
        d.run_due()
        d._running["slow"].result(timeout=10)
        assert calls["slow"] == 2 and "slow" not in d.pending()

        d.poke("bad")
        for _ in range(6):
            clock.now += 5.0
            d.run_due()
            if "bad" in d._running:
                d._running["bad"].result(timeout=10)
        assert calls["bad"] == 3  # attempts; then the drift tick repairs
        assert d.pending() == {}


def test_debouncer_thread_runs_a_poke_and_stops() -> None:
    tracker = Tracker()
    tracker.seen("ADDED", _body("a"))
    done = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        d = Debouncer(0.05, tracker.get, lambda b: done.set(), pool)
        d.start()
        d.poke("a")
        assert done.wait(10)
        d.stop()
        assert not d._thread.is_alive()


def test_the_secret_watch_asks_the_api_server_for_labelled_secrets_only() -> None:
    """The label selector goes into kopf's watch and list requests for core Secrets (RBAC cannot
    select by label), and into nothing else the operator watches."""
    import kopf
    from sluiceway_operator.settings import apply_kopf_settings

    settings = kopf.OperatorSettings()
    apply_kopf_settings(settings)
    selectors = settings.watching.label_selectors
    assert selectors.collect(kopf.Resource("", "v1", "secrets", namespaced=True)) == ["sluiceway.io/tenant-key=true"]
    assert selectors.collect(kopf.Resource("sluiceway.io", "v1alpha1", "inferenceservices", namespaced=True)) == []
