"""Issue 10, pod defects, over real HTTP against a real ``sluiceway-pod`` process: a hung device fails
liveness, disconnects log no unretrieved-future errors, ``/metrics`` lives on its own port, model
exception text never reaches the client, and a 404 before authentication names no model."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from podtools import infer_body

pytestmark = pytest.mark.slow


def wait_until(cond: Any, timeout: float = 30.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.05)


def test_a_hung_device_fails_liveness_and_readiness_and_is_counted(pod_factory: Any) -> None:
    """Every permit held by a thread stuck in the model past execTimeout + grace: liveness 503, so the
    kubelet restarts the pod; readiness 503; ``sluiceway_stuck_permits`` counts the stuck permits."""
    pod = pod_factory(
        "--model",
        "podmodels:hang_runner",
        "--model-name",
        "hang",
        "--concurrency",
        "1",
        "--exec-timeout",
        "0.3",
        config={"queue": {"stuckGraceSeconds": 0.5}, "server": {"drainSeconds": 1}},
    )
    ok = httpx.post(pod.infer_url, json=infer_body(value=1.0), timeout=30)
    assert ok.status_code == 200
    assert httpx.get(f"{pod.url}/v2/health/live", timeout=5).status_code == 200
    hung = httpx.post(pod.infer_url, json=infer_body(value=666.0), timeout=30)
    assert hung.status_code == 504 and hung.json()["reason"] == "exec_timeout"
    # the permit is still held by the stuck thread; after 0.3 s + 0.5 s grace it counts as stuck
    wait_until(lambda: httpx.get(f"{pod.url}/v2/health/live", timeout=5).status_code == 503, what="liveness 503")
    live = httpx.get(f"{pod.url}/v2/health/live", timeout=5)
    assert live.json()["live"] is False and "stuck" in live.json()["reason"]
    assert httpx.get(f"{pod.admin_url}/v2/health/live", timeout=5).status_code == 503
    assert httpx.get(f"{pod.url}/v2/health/ready", timeout=5).status_code == 503
    assert pod.metric("sluiceway_stuck_permits") == 1
    assert pod.metric("sluiceway_concurrency_in_use") == 1
    # the process still exits when told to (the stuck thread cannot hold it hostage)
    assert pod.terminate(30) == 0


def test_stuck_but_not_all_permits_keeps_the_pod_live(pod_factory: Any) -> None:
    pod = pod_factory(
        "--model",
        "podmodels:hang_runner",
        "--model-name",
        "hang",
        "--concurrency",
        "2",
        "--exec-timeout",
        "0.3",
        config={"queue": {"stuckGraceSeconds": 0.3}, "server": {"drainSeconds": 1}},
    )
    assert httpx.post(pod.infer_url, json=infer_body(value=666.0), timeout=30).status_code == 504
    wait_until(lambda: pod.metric("sluiceway_stuck_permits") == 1, what="one stuck permit")
    assert httpx.get(f"{pod.url}/v2/health/live", timeout=5).status_code == 200
    assert httpx.post(pod.infer_url, json=infer_body(value=2.0), timeout=30).status_code == 200  # one permit left
    assert pod.terminate(30) == 0


def test_client_disconnects_log_no_unretrieved_future_error(pod_factory: Any) -> None:
    pod = pod_factory("--model", "synthetic:300", "--concurrency", "1", "--max-queue", "50")
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[5]}]}'
    request = (
        b"POST /v2/models/demo/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    socks = []
    for _ in range(6):  # one runs, five queue; then all hang up
        s = socket.create_connection(("127.0.0.1", pod.port))
        s.sendall(request)
        socks.append(s)
    wait_until(lambda: pod.metric("sluiceway_queue_depth") >= 4, what="a queue")
    for s in socks:
        s.close()
    wait_until(lambda: pod.metric("sluiceway_rejected_total", reason="client_disconnected") >= 4, what="499s")
    wait_until(lambda: pod.metric("sluiceway_concurrency_in_use") == 0, what="idle")
    time.sleep(0.5)
    assert pod.terminate(30) == 0
    logs = pod.logs()
    assert "never retrieved" not in logs, logs
    assert " ERROR " not in logs, logs


def test_metrics_are_served_on_the_metrics_port_only(pod_factory: Any) -> None:
    pod = pod_factory("--model", "synthetic:1")
    assert httpx.post(pod.infer_url, json=infer_body(), timeout=30).status_code == 200
    inference_port = httpx.get(f"{pod.url}/metrics", timeout=5)
    assert inference_port.status_code == 404
    assert "sluiceway_" not in inference_port.text
    r = httpx.get(pod.metrics_url, timeout=5)
    assert r.status_code == 200 and 'sluiceway_requests_total{code="200"' in r.text.replace(
        'model="demo",', ""
    ).replace('priority="standard",', "").replace('tenant="anonymous",', "")
    # the health probes answer on both ports (the metrics port is not subject to maxConnections)
    assert httpx.get(f"{pod.admin_url}/v2/health/ready", timeout=5).status_code == 200
    assert httpx.get(f"{pod.url}/v2/health/live", timeout=5).status_code == 200
    # the metrics port serves nothing else
    assert httpx.post(f"{pod.admin_url}/v2/models/demo/infer", json=infer_body(), timeout=5).status_code in (404, 405)


def test_model_exception_text_never_reaches_the_client(pod_factory: Any) -> None:
    pod = pod_factory("--model", "podmodels:chaos_runner", "--model-name", "chaos", "--concurrency", "1")
    r = httpx.post(pod.infer_url, json=infer_body(value=-1.0), timeout=30)
    assert r.status_code == 500 and r.json()["reason"] == "model_error"
    assert "SECRET" not in r.text and "hunter2" not in r.text and "RuntimeError" not in r.text
    error_id = r.json()["errorId"]
    assert len(error_id) >= 8 and error_id in r.json()["error"]
    # the operator finds the details in the log under that id
    wait_until(lambda: error_id in pod.logs(), what="the error id in the log")
    line = next(ln for ln in pod.logs().splitlines() if error_id in ln)
    assert "model failed" in line
    assert "hunter2" in pod.logs()  # the traceback is logged, with the id
    assert httpx.post(pod.infer_url, json=infer_body(value=1.0), timeout=30).status_code == 200


def test_unknown_model_before_authentication_is_401_and_names_no_model(pod_factory: Any, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"{hashlib.sha256(b'k-alpha').hexdigest()} alpha\n")
    pod = pod_factory(
        "--model",
        "synthetic:1",
        "--model-name",
        "secret-model",
        config={"tenants": {"keysFile": str(keys), "allowAnonymous": False, "tenants": [{"name": "alpha"}]}},
    )
    for path in ("/v2/models/guess/infer", "/v2/models/secret-model/infer"):
        r = httpx.post(f"{pod.url}{path}", json=infer_body(), timeout=10)
        assert r.status_code == 401, (path, r.text)
        assert "secret-model" not in r.text
    for path in ("/v2/models/guess", "/v2/models/guess/ready", "/v2/models/secret-model"):
        r = httpx.get(f"{pod.url}{path}", timeout=10)
        assert r.status_code == 401, (path, r.text)
        assert "secret-model" not in r.text
    auth = {"Authorization": "Bearer k-alpha"}
    r = httpx.post(f"{pod.url}/v2/models/guess/infer", json=infer_body(), headers=auth, timeout=10)
    assert r.status_code == 404 and r.json()["reason"] == "model_not_found"
    assert "secret-model" not in r.text
    assert httpx.get(f"{pod.url}/v2/models/secret-model", headers=auth, timeout=10).status_code == 200
    assert httpx.post(pod.infer_url, json=infer_body(), headers=auth, timeout=10).status_code == 200


def test_exec_timeout_and_disconnect_while_running_leave_no_error_log(pod_factory: Any) -> None:
    pod = pod_factory("--model", "synthetic:400", "--concurrency", "1", "--exec-timeout", "0.1")

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.post(pod.infer_url, json=infer_body())
            assert r.status_code == 504
            task = asyncio.create_task(c.post(pod.infer_url, json=infer_body()))
            await asyncio.sleep(0.05)
            task.cancel()

    asyncio.run(scenario())
    wait_until(lambda: pod.metric("sluiceway_concurrency_in_use") == 0, what="idle")
    assert pod.terminate(30) == 0
    assert "never retrieved" not in pod.logs() and " ERROR " not in pod.logs(), pod.logs()
