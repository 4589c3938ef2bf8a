"""Two gateway replicas split a tenant's quota by leases from the quota coordinator (issue 19: "with
several gateway replicas, split the quota between them ... and document and test the bound").

Real parts on loopback: the coordinator in a real ``sluiceway-scaler serve`` process (with its quota
key), one real ``sluiceway-pod``, and two real ``sluiceway-gateway serve`` processes, each with the
charter of ``<ns>/<name>.edge`` signed as the operator signs it and its own ``POD_NAME``. Keep-alive
clients reach the replicas unevenly, as kube-proxy leaves them: ``heavy`` offers 3x its 10/s quota,
24/s through one replica and 6/s through the other; ``light`` offers 0.4x of its own in clumps of 4,
through the second replica only.

The bound (docs/gateway.md): the replicas' leases never sum above the rate, so over ``T`` seconds a
tenant is admitted at most ``rate x T`` plus the burst, plus the fallback burst (``burst // replicas``)
a replica may hold from its start until its first settled grant. Without the split each replica
holds the whole quota: the same load got 1.6x (printed by the second arm).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gwtools import GatewayProcess, start_gateway
from quotatools import coordinator_process
from sluiceway_core.quota import TenantQuota
from sluiceway_core.quota_charter import QuotaCharter, sign_charter

BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1.0,2.0,3.0,4.0]}]}'
KEYS = {"heavy": "sk-heavy-0123456789abcdef", "light": "sk-light-0123456789abcdef"}
RATE, BURST = 10.0, 10
QUOTA_KEY = b"gateway-split-test-quota-key-0123456789abcdef"
SERVICE = "team-a/demo.edge"
SECONDS = 10.0


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[str]:
    with coordinator_process(tmp_path, QUOTA_KEY, 3.0) as (_proc, url):
        yield url


def _keys(tmp: Path) -> str:
    path = tmp / "keys.txt"
    path.write_text("".join(f"{hashlib.sha256(k.encode()).hexdigest()} {t}\n" for t, k in KEYS.items()))
    return str(path)


def _tenants(tmp: Path) -> dict[str, Any]:
    return {"keysFile": _keys(tmp), "allowAnonymous": False,
            "tenants": [{"name": t, "rate": RATE, "burst": BURST} for t in KEYS]}


def _quota(tmp: Path, url: str) -> dict[str, Any]:
    charter = QuotaCharter(SERVICE, {t: TenantQuota(RATE, BURST, None) for t in KEYS}, 3)
    token = tmp / "quota-token"
    token.write_text(sign_charter(QUOTA_KEY, charter))
    return {"coordinatorUrl": url, "service": SERVICE, "leaseSeconds": 3, "assumedReplicas": 2,
            "charter": charter.to_json(), "tokenFile": str(token)}


def _load(gws: list[GatewayProcess]) -> tuple[Counter[tuple[str, int]], float]:
    """heavy: 24/s through gws[0] (3 clients), 6/s through gws[1]; light: clumps of 4 a second
    through gws[1]. Open loop per client (paced sends on its keep-alive connection)."""
    got: Counter[tuple[str, int]] = Counter()
    lock = threading.Lock()
    start = time.monotonic() + 0.2
    end = start + SECONDS

    def client(gw: GatewayProcess, tenant: str, rate: float, clump: int = 1) -> None:
        with httpx.Client(timeout=10) as c:
            at = start
            while at < end:
                time.sleep(max(0.0, at - time.monotonic()))
                for _ in range(clump):
                    r = c.post(gw.infer_url(), content=BODY, headers={"Authorization": f"Bearer {KEYS[tenant]}"})
                    with lock:
                        got[(tenant, r.status_code)] += 1
                # a late clump is not made up by sending two at once: the clumps stay within the burst
                at = max(at + 1 / rate, time.monotonic()) if clump > 1 else at + 1 / rate

    threads = [threading.Thread(target=client, args=(gws[0], "heavy", 8.0)) for _ in range(3)]
    threads.append(threading.Thread(target=client, args=(gws[1], "heavy", 6.0)))
    threads.append(threading.Thread(target=client, args=(gws[1], "light", 1.0, 4)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(SECONDS + 30)
    return got, time.monotonic() - start


def test_two_gateway_replicas_split_a_tenant_quota_by_leases(
    pod_factory: Any, tmp_path: Path, coordinator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = pod_factory(config={"model": {"spec": "synthetic:0"}, "tenants": {
        "keysFile": _keys(tmp_path), "allowAnonymous": False, "tenants": [{"name": t} for t in KEYS]}})
    base = {"endpoints": [f"127.0.0.1:{pod.port}"], "tenants": _tenants(tmp_path)}
    split: list[GatewayProcess] = []
    alone: list[GatewayProcess] = []
    try:
        for name in ("gateway-a", "gateway-b"):
            monkeypatch.setenv("POD_NAME", name)
            split.append(start_gateway(tmp_path, {**base, "quota": _quota(tmp_path, coordinator)}))
        time.sleep(3.5)  # a lease period: both replicas renewed, the grants settled
        got, span = _load(split)
        for gw in split:
            gw.stop()
        for _ in range(2):  # the same load, each replica holding the whole quota (no split)
            alone.append(start_gateway(tmp_path, base))
        got_alone, span_alone = _load(alone)
    finally:
        for gw in split + alone:
            gw.stop()
    heavy, heavy_alone = got[("heavy", 200)], got_alone[("heavy", 200)]
    bound = RATE * span + BURST + BURST // 2
    print(f"split: heavy {heavy} ok in {span:.1f} s = {heavy / (RATE * span):.3f}x its quota (bound {bound:.0f}), "
          f"answers {dict(got)}; without the split: {heavy_alone} ok in {span_alone:.1f} s = "
          f"{heavy_alone / (RATE * span_alone):.3f}x")
    assert heavy <= bound, (heavy, bound)
    assert heavy >= 0.8 * RATE * span, heavy  # the replicas hold the whole quota between them
    assert got[("light", 200)] > 0 and got[("light", 429)] == 0, got  # under its quota: never refused
    assert heavy_alone > 1.3 * RATE * span_alone, heavy_alone  # the problem the split solves
    assert set(got) <= {("heavy", 200), ("heavy", 429), ("light", 200)}, got
