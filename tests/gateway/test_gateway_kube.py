"""The EndpointSlice watch against a real kube-apiserver (tests/operator/kubetools.py's control plane):
the in-process watch follows creates, readiness changes and deletes; a gateway process discovers a
real pod through it and routes to it."""

from __future__ import annotations

import asyncio
import itertools
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from kubetools import ADMIN_TOKEN, ControlPlane, control_plane
from sluiceway_gateway.config import KubeWatchConfig
from sluiceway_gateway.endpoints import Endpoint
from sluiceway_gateway.kube import EndpointSliceWatch

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]
__all__ = ["control_plane"]
NS = "gw-watch"


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    token = tmp_path_factory.mktemp("gwkube") / "token"
    token.write_text(ADMIN_TOKEN + "\n")
    client = httpx.Client(base_url=control_plane.server, verify=False, timeout=10,
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    r = client.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    assert r.status_code in (201, 409), r.text
    yield {"server": control_plane.server, "token": str(token), "client": client}
    client.close()


def local_address() -> str | None:
    """This machine's own non-loopback IPv4 address (the API server refuses loopback endpoint addresses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # a UDP connect sends nothing: it picks the route's source address
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else str(addr)


def slice_body(name: str, service: str, host: str, port: int, ready: bool, kind: str = "FQDN") -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service,
                                                  "endpointslice.kubernetes.io/managed-by": "sluiceway-tests"}},
            "addressType": kind, "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [host], "conditions": {"ready": ready}}]}


SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


async def test_watch_follows_endpointslices(api: dict[str, Any]) -> None:
    c = api["client"]
    cfg = KubeWatchConfig(namespace=NS, service="svc-a", port_name="http", api_server=api["server"],
                          token_file=api["token"], insecure_skip_tls_verify=True)
    seen: list[list[Endpoint]] = []
    watch = EndpointSliceWatch(cfg)
    task = asyncio.create_task(watch.run(seen.append))

    async def until(pred: Any, what: str) -> None:
        end = time.monotonic() + 20
        while not (seen and pred(seen[-1])):
            assert time.monotonic() < end, f"{what}: last {seen[-1] if seen else None}"
            await asyncio.sleep(0.05)

    try:
        await until(lambda eps: eps == [], "the first (empty) list")
        assert c.post(SLICES, json=slice_body("a1", "svc-a", "pod-1.example", 8080, True)).status_code == 201
        assert c.post(SLICES, json=slice_body("b1", "svc-b", "other.example", 8080, True)).status_code == 201
        await until(lambda eps: [(e.key, e.ready) for e in eps] == [("pod-1.example:8080", True)], "created")
        body = slice_body("a1", "svc-a", "pod-1.example", 8080, False)
        body["metadata"]["resourceVersion"] = c.get(f"{SLICES}/a1").json()["metadata"]["resourceVersion"]
        assert c.put(f"{SLICES}/a1", json=body).status_code == 200
        await until(lambda eps: [(e.key, e.ready) for e in eps] == [("pod-1.example:8080", False)], "not ready")
        assert c.delete(f"{SLICES}/a1").status_code == 200
        await until(lambda eps: eps == [], "deleted")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_gateway_discovers_a_real_pod(api: dict[str, Any], pod_factory: Any, gateway_factory: Any) -> None:
    addr = local_address()
    if addr is None:
        pytest.skip("no non-loopback IPv4 address on this machine (EndpointSlices refuse loopback addresses)")
    pod = pod_factory("--model", "synthetic:0", "--host", "0.0.0.0")  # the last --host wins
    c = api["client"]
    r = c.post(SLICES, json=slice_body("p1", "svc-p", addr, pod.port, True, kind="IPv4"))
    assert r.status_code == 201, r.text
    gw = gateway_factory({"watch": {"namespace": NS, "service": "svc-p", "portName": "http",
                                    "apiServer": api["server"], "tokenFile": api["token"],
                                    "insecureSkipTlsVerify": True},
                          "hold": {"maxRequests": 0}})  # no hold queue: no ready pod is a 503 at once
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]}
    r = httpx.post(gw.infer_url(), json=body, timeout=10)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0, 2.0]
    # the slice says not ready: no new request goes there (none other is ready)
    sl = c.get(f"{SLICES}/p1").json()
    sl["endpoints"][0]["conditions"] = {"ready": False}
    assert c.put(f"{SLICES}/p1", json=sl).status_code == 200
    end = time.monotonic() + 20
    while httpx.get(f"{gw.url}/v2/health/ready", timeout=5).status_code != 503:
        assert time.monotonic() < end, "the gateway kept the not-ready pod"
        time.sleep(0.05)
    r = httpx.post(gw.infer_url(), json=body, timeout=10)
    assert r.status_code == 503 and r.json()["reason"] == "no_ready_pods"


#: Runs the watch in its own process with the server ending each watch after 1 s (``WATCH_SECONDS``,
#: 240 in production), beside a heartbeat task on the same event loop; prints ``tick`` and each
#: endpoint set. A watch loop that spins without awaiting blocks the heartbeat and every other task
#: (in a gateway: the data path and the metrics port).
_WATCH_SCRIPT = """
import asyncio, sys, time
from sluiceway_gateway import kube
from sluiceway_gateway.config import KubeWatchConfig
kube.WATCH_SECONDS = 1
cfg = KubeWatchConfig(namespace=sys.argv[1], service=sys.argv[2], port_name="http", api_server=sys.argv[3],
                      token_file=sys.argv[4], insecure_skip_tls_verify=True)
async def beat():
    while True:
        print("tick", round(time.monotonic(), 2), flush=True)
        await asyncio.sleep(0.2)
async def main():
    asyncio.get_running_loop().create_task(beat())
    await kube.EndpointSliceWatch(cfg).run(lambda eps: print("eps", len(eps), flush=True))
asyncio.run(main())
"""


def test_a_watch_the_server_ends_resumes_without_blocking_the_event_loop(api: dict[str, Any], tmp_path: Path) -> None:
    """The API server ends every watch after ``timeoutSeconds``; the watch resumes and the event loop
    keeps running. Before the fix aiohttp's ``readuntil`` returned ``b""`` at the end of the stream
    and the loop spun on it without awaiting: a sandbox gateway stopped answering (data path and
    metrics port) 240 s after it started, until its liveness probe killed it."""
    import subprocess
    import threading

    out = tmp_path / "watch.out"
    with out.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", _WATCH_SCRIPT, NS, "svc-w", api["server"], api["token"]],
                                stdout=fh, stderr=subprocess.STDOUT)
    try:
        time.sleep(3.5)  # the server has ended two or three watches by now (after the import)
        r = api["client"].post(SLICES, json=slice_body("w1", "svc-w", "pod-w.example", 8080, True))
        assert r.status_code == 201, r.text
        end = time.monotonic() + 15
        while "eps 1" not in out.read_text():
            assert proc.poll() is None, out.read_text()[-3000:]
            assert time.monotonic() < end, f"the new slice never reached the watch:\n{out.read_text()[-3000:]}"
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        proc.kill()
        proc.wait(10)
        threading.Thread(target=api["client"].delete, args=(f"{SLICES}/w1",), daemon=True).start()
    ticks = [float(line.split()[1]) for line in out.read_text().splitlines() if line.startswith("tick ")]
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    print(f"\n{len(ticks)} heartbeats over {ticks[-1] - ticks[0]:.1f} s, longest gap {max(gaps):.2f} s")
    assert ticks[-1] - ticks[0] > 3.0 and max(gaps) < 2.0, f"the event loop stalled: gaps {gaps}"
