"""A running gateway process picks up a new ``hold.startupSeconds`` from its config file without a
restart, also when it has no tenants (issue 20: the operator renders the pods' measured start-up
there and keeps it out of the gateway's config hash, so a gateway that never rereads it predicts with
the first figure for ever). Real ``sluiceway-gateway serve`` process on loopback; the one endpoint is
a pod still starting (its port closed), so each request with a short deadline gets the early 503
whose ``Retry-After`` is the predicted ready time."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import yaml
from gwtools import start_gateway
from netports import free_port

BODY = b'{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[1.0]}]}'


def retry_after(url: str) -> tuple[int, int]:
    r = httpx.post(url, content=BODY, headers={"X-Sluiceway-Deadline-Ms": "1000"}, timeout=10)
    return r.status_code, int(r.headers.get("retry-after", "-1"))


def test_a_new_startup_estimate_reaches_a_running_gateway_without_tenants(tmp_path: Path) -> None:
    cfg = {"endpoints": [f"127.0.0.1:{free_port()}"], "pollAfterMs": 100, "reloadSeconds": 0.2,
           "hold": {"startupSeconds": 40}}
    gw = start_gateway(tmp_path, cfg)
    try:
        first = retry_after(gw.infer_url())
        assert first[0] == 503 and 30 <= first[1] <= 41, first
        path = tmp_path / f"gateway-{gw.port}.yaml"
        on_disk = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**on_disk, "hold": {"startupSeconds": 400}}))  # a new measurement
        deadline, seen = time.monotonic() + 15, first
        while time.monotonic() < deadline:
            seen = retry_after(gw.infer_url())
            if seen[1] > 300:
                break
            time.sleep(0.2)
        print(f"Retry-After {first[1]} with 40 s, then {seen[1]} after the file said 400 s")
        assert seen[0] == 503 and seen[1] > 300, (seen, gw.logs()[-2000:])
        assert gw.proc.poll() is None
    finally:
        gw.stop()
