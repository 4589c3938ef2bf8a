"""Dynamic batching and the degradation ladder over real HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import torch
from podtools import PodProcess, infer_body
from sluiceway_pod.models import build_demo_module


def rows_body(rows: np.ndarray) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "shape": list(rows.shape), "datatype": "FP32", "data": rows.tolist()}]}


async def post_all(pod: PodProcess, bodies: list[dict[str, Any]], **headers: str) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as c:
        return list(await asyncio.gather(*[c.post(pod.infer_url, json=b, headers=headers) for b in bodies]))


def test_batched_results_equal_unbatched_results(pod_factory: Any) -> None:
    pod = pod_factory(
        config={
            "model": {"spec": "demo"},
            "concurrency": {"permits": 1},
            "batching": {"maxBatchSize": 8, "maxBatchWaitMs": 300},
        }
    )
    assert httpx.get(f"{pod.url}/v2/models/demo").json()["parameters"]["max_batch_size"] == 8
    rng = np.random.default_rng(7)
    small = [rng.normal(size=(1, 16)).astype(np.float32) for _ in range(6)]
    large = [rng.normal(size=(5, 16)).astype(np.float32) for _ in range(2)]
    inputs = small + large
    responses = asyncio.run(post_all(pod, [rows_body(x) for x in inputs]))
    net = build_demo_module()
    for x, r in zip(inputs, responses, strict=True):
        assert r.status_code == 200, r.text
        out = np.array(r.json()["outputs"][0]["data"], dtype=np.float32).reshape(x.shape[0], 4)
        with torch.inference_mode():
            alone = net(torch.from_numpy(x)).numpy()  # the same rows, unbatched
        np.testing.assert_allclose(out, alone, rtol=1e-5, atol=1e-6)
    assert pod.metric("sluiceway_batch_size_sum") == len(inputs)  # every request computed exactly once
    batches = pod.metric("sluiceway_batch_size_count")
    assert 2 <= batches < len(inputs)  # batched, and the 1-row and 5-row buckets never share a batch


def test_a_failing_batch_fails_every_member_and_nothing_hangs(pod_factory: Any) -> None:
    pod = pod_factory(
        "--model",
        "podmodels:boom_model",
        "--model-name",
        "boom",
        config={"concurrency": {"permits": 1}, "batching": {"maxBatchSize": 4, "maxBatchWaitMs": 500}},
    )
    bodies = [infer_body(value=v) for v in (1.0, 2.0, -1.0, 3.0)]
    responses = asyncio.run(post_all(pod, bodies))
    assert [r.status_code for r in responses] == [500] * 4
    ids = {r.json()["errorId"] for r in responses}  # one failure, one id, no exception text
    assert len(ids) == 1 and all("negative input" not in r.text for r in responses)
    assert "negative input" in pod.logs() and ids.pop() in pod.logs()
    assert pod.metric("sluiceway_batch_size_count") == 1
    assert httpx.post(pod.infer_url, json=infer_body(value=1.0), timeout=30).status_code == 200


def test_result_counts_are_checked(pod_factory: Any) -> None:
    pod = pod_factory(
        "--model",
        "podmodels:short_runner",
        "--model-name",
        "short",
        config={"concurrency": {"permits": 1}, "batching": {"maxBatchSize": 3, "maxBatchWaitMs": 500}},
    )
    responses = asyncio.run(post_all(pod, [infer_body(value=v) for v in (1.0, 2.0, 3.0)]))
    assert [r.status_code for r in responses] == [500] * 3
    assert "returned 2 results for a batch of 3" in responses[0].json()["error"]


def test_degradation_ladder_fallback_then_cache_then_reject(pod_factory: Any) -> None:
    pod = pod_factory(
        config={
            "model": {"spec": "synthetic:800", "name": "demo", "warmupIterations": 1},
            "concurrency": {"permits": 1},
            "degradation": {
                "enabled": True,
                "waitThresholdSeconds": 0.05,
                "fallback": {"spec": "synthetic:2000", "permits": 1},
                "cache": {"maxEntries": 16, "ttlSeconds": 300},
            },
        }
    )

    async def scenario() -> dict[str, httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            out: dict[str, httpx.Response] = {}
            out["warm"] = await c.post(pod.infer_url, json=infer_body(value=1.0))  # primary; fills the cache
            busy = asyncio.create_task(c.post(pod.infer_url, json=infer_body(value=2.0)))
            await pod.until("sluiceway_concurrency_in_use", lambda v: v >= 1)
            fallback = asyncio.create_task(c.post(pod.infer_url, json=infer_body(value=3.0)))
            await pod.until("sluiceway_degraded_total", lambda v: v >= 0)  # let it reach the pod
            await asyncio.sleep(0.3)
            out["cached"] = await c.post(pod.infer_url, json=infer_body(value=1.0))
            out["rejected"] = await c.post(pod.infer_url, json=infer_body(value=9.0))
            out["busy"] = await busy
            out["fallback"] = await fallback
            return out

    r = asyncio.run(scenario())
    assert r["warm"].status_code == 200 and "x-sluiceway-degraded" not in r["warm"].headers
    assert r["busy"].status_code == 200 and "x-sluiceway-degraded" not in r["busy"].headers
    assert r["fallback"].status_code == 200
    assert r["fallback"].headers["x-sluiceway-degraded"] == "fallback-model"
    assert r["cached"].status_code == 200 and r["cached"].headers["x-sluiceway-degraded"] == "cache"
    assert r["cached"].json()["outputs"] == r["warm"].json()["outputs"]
    assert r["rejected"].status_code == 429 and r["rejected"].json()["reason"] == "overloaded"
    assert int(r["rejected"].headers["retry-after"]) >= 1
    assert pod.metric("sluiceway_degraded_total", mode="fallback-model") == 1
    assert pod.metric("sluiceway_degraded_total", mode="cache") == 1
    assert pod.metric("sluiceway_rejected_total", reason="overloaded") == 1
