"""The demo model over real HTTP: OIP v2 endpoints, tritonclient (JSON and binary), bad input, metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from podtools import PodProcess, start_pod
from sluiceway_pod.models import build_demo_module

ROW = [float(i) / 10 for i in range(16)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodProcess]:
    tmp = tmp_path_factory.mktemp("demo")
    pod = start_pod(
        tmp,
        "--model",
        "demo",
        "--concurrency",
        "2",
        config={"server": {"maxBodyBytes": 64 * 1024}, "model": {"name": "demo"}},
    )
    yield pod
    assert pod.terminate() == 0


def expected(rows: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_demo_module()(torch.from_numpy(rows.astype(np.float32))).numpy()


def post(pod: PodProcess, body: object, **headers: str) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(pod.infer_url, content=raw, headers=headers, timeout=30)


def test_health_and_metadata(demo: PodProcess) -> None:
    assert httpx.get(f"{demo.url}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{demo.url}/v2/health/ready").status_code == 200
    assert httpx.get(f"{demo.url}/v2/models/demo/ready").status_code == 200
    meta = httpx.get(f"{demo.url}/v2/models/demo").json()
    assert meta["name"] == "demo"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["parameters"]["concurrency"] == 2  # the value in force is visible
    assert meta["parameters"]["device"] in ("cpu", "cuda")
    # the queue-depth series exist before any traffic: "empty" is distinguishable from "no data"
    series = {dict(labels).get("priority") for n, labels in demo.metrics() if n == "sluiceway_queue_depth"}
    assert series == {"critical", "standard", "batch"}


def test_json_infer_matches_the_model(demo: PodProcess) -> None:
    rows = np.array([ROW, [0.0] * 16], dtype=np.float32)
    r = post(
        demo, {"id": "r1", "inputs": [{"name": "INPUT0", "shape": [2, 16], "datatype": "FP32", "data": rows.tolist()}]}
    )
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["id"] == "r1" and doc["model_name"] == "demo"
    out = doc["outputs"][0]
    assert out["name"] == "OUTPUT0" and out["shape"] == [2, 4] and out["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(out["data"]).reshape(2, 4), expected(rows), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_round_trip(demo: PodProcess, binary: bool) -> None:
    import tritonclient.http as tc

    client = tc.InferenceServerClient(url=f"127.0.0.1:{demo.port}")
    assert client.is_server_live() and client.is_model_ready("demo")
    rows = np.array([ROW, ROW[::-1], [1.0] * 16], dtype=np.float32)
    inp = tc.InferInput("INPUT0", list(rows.shape), "FP32")
    inp.set_data_from_numpy(rows, binary_data=binary)
    outputs = [tc.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    result = client.infer("demo", [inp], outputs=outputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(rows), rtol=1e-5, atol=1e-6)
    # tritonclient's default (no outputs named) asks for binary outputs
    default = client.infer("demo", [inp])
    np.testing.assert_allclose(default.as_numpy("OUTPUT0"), expected(rows), rtol=1e-5, atol=1e-6)
    assert client.get_model_metadata("demo")["name"] == "demo"
    client.close()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        ({"inputs": []}, "non-empty list"),
        ({"inputs": [{"name": "NOPE", "shape": [1, 16], "datatype": "FP32", "data": ROW}]}, "unknown input"),
        ({"inputs": [{"name": "INPUT0", "shape": [1, 15], "datatype": "FP32", "data": ROW[:15]}]}, "does not match"),
        ({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT64", "data": [1] * 16}]}, "datatype"),
        ({"inputs": [{"name": "INPUT0", "shape": [2, 16], "datatype": "FP32", "data": ROW}]}, "values for shape"),
        ({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32"}]}, "'data' is missing"),
        ({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ["x"] * 16}]}, "not FP32"),
        ({"inputs": [{"name": "INPUT0", "shape": [1, -3], "datatype": "FP32", "data": ROW}]}, "non-negative"),
        (
            {
                "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ROW}],
                "outputs": [{"name": "NOPE"}],
            },
            "unknown outputs",
        ),
    ],
)
def test_bad_input_is_400_with_a_message(demo: PodProcess, body: object, needle: str) -> None:
    r = post(demo, body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]
    assert r.json()["reason"] == "invalid_input"


def test_binary_header_errors_are_400(demo: PodProcess) -> None:
    r = httpx.post(demo.infer_url, content=b'{"inputs":[]}', headers={"Inference-Header-Content-Length": "999"})
    assert r.status_code == 400 and "outside the body" in r.json()["error"]


def test_other_client_mistakes(demo: PodProcess) -> None:
    ok = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ROW}]}
    r = httpx.post(f"{demo.url}/v2/models/nope/infer", json=ok)
    assert r.status_code == 404 and "not served" in r.json()["error"]
    assert httpx.get(f"{demo.url}/v2/models/nope").status_code == 404
    big = {"inputs": [{"name": "INPUT0", "shape": [5000, 16], "datatype": "FP32", "data": [0.5] * 80000}]}
    r = post(demo, big)
    assert r.status_code == 413 and "exceeds" in r.json()["error"]
    r = post(demo, ok, **{"X-Sluiceway-Priority": "urgent"})
    assert r.status_code == 400 and "X-Sluiceway-Priority" in r.json()["error"]
    r = post(demo, ok, **{"X-Sluiceway-Deadline-Ms": "soon"})
    assert r.status_code == 400 and "milliseconds" in r.json()["error"]
    r = post(demo, ok, **{"X-Sluiceway-Deadline-Ms": "0"})
    assert r.status_code == 503 and r.json()["reason"] == "deadline"


def test_metrics_present_and_moving(demo: PodProcess) -> None:
    before = demo.metric("sluiceway_requests_total", code="200")
    dq_before = demo.metric("sluiceway_dequeued_total")
    for _ in range(3):
        assert (
            post(demo, {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ROW}]}).status_code
            == 200
        )
    m = demo.metrics()
    names = {n for n, _ in m}
    for name in [
        "sluiceway_queue_depth",
        "sluiceway_enqueued_total",
        "sluiceway_dequeued_total",
        "sluiceway_requests_total",
        "sluiceway_rejected_total",
        "sluiceway_queue_wait_seconds_bucket",
        "sluiceway_inference_seconds_bucket",
        "sluiceway_concurrency_limit",
        "sluiceway_concurrency_in_use",
        "sluiceway_oom_total",
        "sluiceway_batch_size_bucket",
    ]:
        assert name in names, name
    for (n, labels), _ in m.items():
        if n.startswith("sluiceway_"):
            assert ("model", "demo") in labels, (n, labels)
    assert demo.metric("sluiceway_requests_total", code="200") == before + 3
    assert demo.metric("sluiceway_dequeued_total") == dq_before + 3
    assert demo.metric("sluiceway_inference_seconds_count") >= 3
    assert demo.metric("sluiceway_concurrency_limit") == 2


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: apt-get install prometheus")
def test_metric_names_pass_promtool(demo: PodProcess) -> None:
    text = httpx.get(demo.metrics_url).text
    res = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
    problems = res.stdout.decode() + res.stderr.decode()
    assert res.returncode == 0, problems
    assert "sluiceway_" not in problems, problems


def test_torchscript_file_is_served(pod_factory: Any, tmp_path: Path) -> None:
    path = tmp_path / "mlp.pt"
    torch.jit.script(build_demo_module()).save(str(path))
    pod = pod_factory("--model", str(path), "--model-name", "scripted", config={"model": {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}],
    }})
    meta = httpx.get(f"{pod.url}/v2/models/scripted").json()
    assert meta["platform"] == "pytorch_torchscript"
    rows = np.array([ROW, [0.5] * 16], dtype=np.float32)
    r = httpx.post(pod.infer_url, json={"inputs": [{"name": "INPUT0", "shape": [2, 16], "datatype": "FP32",
                                                     "data": rows.tolist()}]}, timeout=30)
    assert r.status_code == 200, r.text
    out = np.array(r.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(out, expected(rows), rtol=1e-5, atol=1e-6)
