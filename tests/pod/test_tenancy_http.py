"""Tenants, quotas and priorities over real HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from podtools import PodProcess, infer_body

KEYS = {
    "alice": "sk-alice-0123456789",
    "bob": "sk-bob-abcdef",
    "carol": "sk-carol-zz",
    "dave": "sk-dave-unlisted",
    "erin": "sk-erin-listed-no-limits",
}


def keys_file(tmp_path: Path) -> str:
    path = tmp_path / "keys"
    path.write_text(
        "# sha256 of each key, then the tenant\n"
        + "".join(f"{hashlib.sha256(k.encode()).hexdigest()} {t}\n" for t, k in KEYS.items())
    )
    return str(path)


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


@pytest.fixture
def tenant_pod(pod_factory: Any, tmp_path: Path) -> PodProcess:
    config = {
        "model": {"spec": "synthetic:200", "name": "demo", "warmupIterations": 1},
        "concurrency": {"permits": 1},
        "queue": {"maxDepth": 20, "timeoutSeconds": 30},
        "tenants": {
            "keysFile": keys_file(tmp_path),
            "allowAnonymous": False,
            "defaults": {"rate": 1000, "burst": 1000},
            "tenants": [
                {"name": "alice", "rate": 1, "burst": 2},
                {"name": "bob", "maxPriority": "standard"},
                {"name": "carol", "maxQueued": 1, "maxConcurrent": 1},
                {"name": "erin"},
            ],
        },
    }
    pod: PodProcess = pod_factory(config=config)
    return pod


def post(pod: PodProcess, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(pod.infer_url, json=infer_body(), headers=headers, timeout=30)


def test_authentication(tenant_pod: PodProcess) -> None:
    r = post(tenant_pod, {})
    assert r.status_code == 401 and "Authorization" in r.json()["error"]
    r = post(tenant_pod, {"Authorization": "Bearer sk-nobody"})
    assert r.status_code == 401 and r.json()["error"] == "unknown API key"
    r = post(tenant_pod, {"Authorization": "Basic abc"})
    assert r.status_code == 401
    assert post(tenant_pod, auth("bob")).status_code == 200
    # an authenticated tenant missing from the config gets the defaults and the bounded label 'other'
    assert post(tenant_pod, auth("dave")).status_code == 200
    assert tenant_pod.metric("sluiceway_requests_total", tenant="other", code="200") == 1
    assert tenant_pod.metric("sluiceway_requests_total", tenant="bob", code="200") == 1
    text = httpx.get(f"{tenant_pod.url}/metrics").text + tenant_pod.logs()
    for key in KEYS.values():
        assert key not in text  # keys never appear in metrics or logs
    assert "dave" not in httpx.get(f"{tenant_pod.url}/metrics").text


def test_token_bucket_gives_429_with_time_to_next_token(tenant_pod: PodProcess) -> None:
    codes = [post(tenant_pod, auth("alice")) for _ in range(3)]
    assert [r.status_code for r in codes[:2]] == [200, 200]  # the burst
    limited = codes[2]
    assert limited.status_code == 429 and limited.json()["reason"] == "rate_limited"
    assert int(limited.headers["retry-after"]) == 1  # rate 1/s: the next token is < 1 s away
    assert tenant_pod.metric("sluiceway_rejected_total", tenant="alice", reason="rate_limited") == 1
    assert post(tenant_pod, auth("bob")).status_code == 200  # another tenant is unaffected


def test_priority_ceiling_is_403(tenant_pod: PodProcess) -> None:
    r = post(tenant_pod, {**auth("bob"), "X-Sluiceway-Priority": "critical"})
    assert r.status_code == 403 and r.json()["reason"] == "priority_forbidden"
    assert post(tenant_pod, {**auth("bob"), "X-Sluiceway-Priority": "standard"}).status_code == 200
    assert post(tenant_pod, {**auth("carol"), "X-Sluiceway-Priority": "critical"}).status_code == 200


def test_queue_share_and_concurrency_cap_per_tenant(tenant_pod: PodProcess) -> None:
    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as c:
            return list(
                await asyncio.gather(
                    *[c.post(tenant_pod.infer_url, json=infer_body(), headers=auth("carol")) for _ in range(4)]
                )
            )

    codes = sorted(r.status_code for r in asyncio.run(scenario()))
    # carol may have one queued (plus the one being dispatched): the rest are refused at once
    assert 429 in codes and 200 in codes
    refused = tenant_pod.metric("sluiceway_rejected_total", tenant="carol", reason="tenant_queue_full")
    assert refused == codes.count(429)


def test_higher_priority_overtakes_queued_lower_priority(tenant_pod: PodProcess) -> None:
    finished: list[str] = []

    async def one(c: httpx.AsyncClient, name: str, prio: str) -> None:
        r = await c.post(
            tenant_pod.infer_url, json=infer_body(), headers={**auth("erin"), "X-Sluiceway-Priority": prio}
        )
        assert r.status_code == 200
        finished.append(name)

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            tasks = [asyncio.create_task(one(c, f"batch{i}", "batch")) for i in range(4)]
            await tenant_pod.until("sluiceway_queue_depth", lambda v: v >= 3)
            tasks.append(asyncio.create_task(one(c, "critical", "critical")))
            await asyncio.gather(*tasks)

    asyncio.run(scenario())
    # one batch request was already running; the critical one goes next, ahead of the queued ones
    assert finished.index("critical") <= 1, finished
    assert tenant_pod.metric("sluiceway_queue_wait_seconds_count", priority="critical") == 1


def test_unlisted_tenants_are_capped_at_the_default_class(tenant_pod: PodProcess) -> None:
    r = post(tenant_pod, {**auth("dave"), "X-Sluiceway-Priority": "critical"})
    assert r.status_code == 403 and r.json()["reason"] == "priority_forbidden"
    assert post(tenant_pod, {**auth("dave"), "X-Sluiceway-Priority": "standard"}).status_code == 200


def test_anonymous_access_is_off_by_default_when_tenants_have_keys(pod_factory: Any, tmp_path: Path) -> None:
    pod = pod_factory("--model", "synthetic:1", config={"tenants": {"keysFile": keys_file(tmp_path)}})
    r = post(pod, {})
    assert r.status_code == 401 and "Authorization" in r.json()["error"]
    assert post(pod, auth("erin")).status_code == 200


def test_anonymous_default_tenant_when_allowed(pod_factory: Any) -> None:
    pod = pod_factory("--model", "synthetic:1", config={"tenants": {"allowAnonymous": True}})
    assert post(pod, {}).status_code == 200
    assert pod.metric("sluiceway_requests_total", tenant="anonymous", code="200") == 1


def test_invalid_config_exits_nonzero_naming_the_field(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants:\n  tenants:\n    - name: a\n      maxPriority: urgent\n")
    res = subprocess.run(
        [sys.executable, "-m", "sluiceway_pod.cli", "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "maxPriority 'urgent'" in res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "sluiceway_pod.cli", "serve", "--max-queue", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "queue.maxDepth" in res.stderr
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "sluiceway_pod.cli", "check-config", "--model", "synthetic:x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "model.spec" in res.stderr
    assert time.monotonic() - start < 60


def test_full_queue_critical_displaces_queued_batch_work(pod_factory: Any) -> None:
    # anonymous callers are capped at the default class unless the defaults allow more
    config = {"tenants": {"defaults": {"maxPriority": "critical"}}}
    # 1.5 s per request: the queue is still full when the critical request arrives, even on a loaded box
    pod = pod_factory("--model", "synthetic:1500", "--concurrency", "1", "--max-queue", "2", config=config)

    async def scenario() -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as c:
            low = []
            for _ in range(3):  # one runs, two fill the queue
                low.append(
                    asyncio.create_task(
                        c.post(pod.infer_url, json=infer_body(), headers={"X-Sluiceway-Priority": "batch"})
                    )
                )
                await asyncio.sleep(0.05)
            await pod.until("sluiceway_queue_depth", lambda v: v >= 2)
            high = await c.post(pod.infer_url, json=infer_body(), headers={"X-Sluiceway-Priority": "critical"})
            return list(await asyncio.gather(*low)), high

    low, high = asyncio.run(scenario())
    assert high.status_code == 200
    codes = [r.status_code for r in low]
    assert codes.count(429) == 1 and codes.count(200) == 2
    displaced = next(r for r in low if r.status_code == 429)
    assert displaced.json()["reason"] == "displaced" and int(displaced.headers["retry-after"]) >= 1
    assert pod.metric("sluiceway_rejected_total", reason="displaced", priority="batch") == 1
