"""Issue 22 §1, the pod's half of "cold start in phases": ``sluiceway-pod fetch`` records its start
and end in the model directory; the pod serving from that directory reports fetched, loaded, warmed
and ready as ``sluiceway_start_phase_seconds{phase}`` and on ``GET /debug/start`` (metrics port).

Real parts: a TorchScript model made here, served over HTTP by a stdlib server on loopback, fetched
by the real ``sluiceway-pod fetch`` process, then served by a real pod process."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import torch
from podtools import infer_body, start_pod
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.startphases import FETCH_RECORD, StartPhases, model_dir, read_fetch_record

PHASES = ("fetched", "loaded", "warmed", "ready")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "store"
    root.mkdir()
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    torch.jit.save(torch.jit.script(net), str(root / "model.pt"))  # type: ignore[no-untyped-call]
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_fetch_then_serve_reports_every_phase(store: str, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-m", "sluiceway_pod.cli", "fetch", "--uri", f"{store}/model.pt", "--dest", str(dest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    record = json.loads((dest / FETCH_RECORD).read_text())
    assert before <= record["started"] <= record["finished"] <= time.time() and record["cached"] is False
    assert record["bytes"] == (dest / "model.pt").stat().st_size

    pod = start_pod(
        tmp_path,
        config={
            "model": {
                "name": "m",
                "spec": str(dest / "model.pt"),
                "warmupIterations": 2,
                "inputs": [{"name": "INPUT0", "shape": [-1, 4], "maxShape": [4, 4]}],
            },
            "concurrency": {"permits": 1},
        },
    )
    try:
        assert httpx.post(pod.infer_url, json=infer_body(), timeout=30).status_code == 200
        seconds = {p: pod.metric("sluiceway_start_phase_seconds", phase=p) for p in PHASES}
        doc = httpx.get(f"{pod.admin_url}/debug/start", timeout=10).json()
        print("start phases (s):", seconds)
        print("boundaries:", doc["at"])
        assert doc["phases"] == list(PHASES)
        assert set(doc["seconds"]) == set(PHASES)
        for p in PHASES:
            assert doc["seconds"][p] == pytest.approx(seconds[p], abs=1e-6)
            assert seconds[p] >= 0
        assert seconds["fetched"] == pytest.approx(record["finished"] - record["started"], abs=1e-6)
        assert seconds["loaded"] > 0 and seconds["warmed"] > 0  # loading and two warm-up passes take time
        at = doc["at"]
        order = ["fetchStarted", "fetchFinished", "processStarted", "loaded", "warmed", "ready"]
        assert [at[k] for k in order] == sorted(at[k] for k in order)  # the boundaries come in order
        assert at["ready"] - at["processStarted"] == pytest.approx(
            seconds["loaded"] + seconds["warmed"] + seconds["ready"], abs=0.05
        )
        assert "start phases (seconds): fetched=" in pod.logs()
    finally:
        pod.terminate(30)

    # a second fetch of the same URI is a no-op, and says so in its record
    again = subprocess.run(
        [sys.executable, "-m", "sluiceway_pod.cli", "fetch", "--uri", f"{store}/model.pt", "--dest", str(dest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and "already in" in again.stdout
    assert json.loads((dest / FETCH_RECORD).read_text())["cached"] is True


def test_a_model_not_fetched_has_no_fetched_phase(pod_factory: object, tmp_path: Path) -> None:
    pod = pod_factory("--model", "synthetic:1")  # type: ignore[operator]
    doc = httpx.get(f"{pod.admin_url}/debug/start", timeout=10).json()
    assert set(doc["seconds"]) == {"loaded", "warmed", "ready"} and "fetchStarted" not in doc["at"]
    assert pod.metric("sluiceway_start_phase_seconds", phase="fetched") == 0  # no such series
    assert "sluiceway_start_phase_seconds" in httpx.get(pod.metrics_url, timeout=10).text


def test_phase_arithmetic_and_odd_records(tmp_path: Path) -> None:
    clock = ManualClock(100.0)
    seen: list[tuple[str, float]] = []
    ph = StartPhases(
        clock,
        started=(90.0, 1_000.0),
        wall=lambda: 1_000.0 + clock.now() - 90.0,
        fetch=(900.0, 950.5),
        on_phase=lambda p, s: seen.append((p, s)),
    )
    assert ph.mark("loaded") == 10.0
    clock.advance(2.5)
    assert ph.mark("warmed") == 2.5
    clock.advance(0.25)
    ph.mark("ready")
    assert ph.mark("ready") == 0.25  # a second mark changes nothing
    assert seen == [("fetched", 50.5), ("loaded", 10.0), ("warmed", 2.5), ("ready", 0.25)]
    assert ph.document()["at"] == {
        "fetchStarted": 900.0,
        "fetchFinished": 950.5,
        "processStarted": 1000.0,
        "loaded": 1010.0,
        "warmed": 1012.5,
        "ready": 1012.75,
    }
    with pytest.raises(ValueError):
        ph.mark("fetched")
    # records that are not one leave the phase out, never fail the pod
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.pt").write_bytes(b"x")
    assert model_dir(str(d / "model.pt")) == d and model_dir(str(d)) == d and model_dir("synthetic:5") is None
    for bad in ("{", '{"started": 5}', '{"started": 9, "finished": 3}', "[]", "x" * 5000):
        (d / FETCH_RECORD).write_text(bad)
        assert read_fetch_record(d) is None, bad
    (d / FETCH_RECORD).write_text('{"started": 3, "finished": 9}')
    assert read_fetch_record(d) == (3.0, 9.0)
