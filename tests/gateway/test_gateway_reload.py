"""The gateway reloads its keys file and ``tenants`` section without a restart (docs/gateway.md,
"Tenant admission at the edge"): a real gateway process in front of a real ``sluiceway-pod``, the keys
in a kubelet-style volume (``..data`` symlink swapped on update)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                               "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()
PERIOD = 0.5


def _h(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Volume:
    """A directory laid out as the kubelet mounts a Secret or ConfigMap: ``<name>`` -> ``..data/<name>``,
    ``..data`` -> a timestamped directory, swapped atomically on every update."""

    def __init__(self, root: Path, name: str) -> None:
        self.root, self.name, self.n = root, name, 0
        root.mkdir()
        (root / name).symlink_to(f"..data/{name}")

    @property
    def path(self) -> str:
        return str(self.root / self.name)

    def write(self, text: str) -> None:
        self.n += 1
        d = self.root / f"..2026_12_03_{self.n}"
        d.mkdir()
        (d / self.name).write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(d.name)
        os.replace(tmp, self.root / "..data")


class Load:
    """One client thread per key, one request after another; ``log[key]``: (time, status)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.log: dict[str, list[tuple[float, int]]] = {}
        self.threads: list[threading.Thread] = []

    def run(self, key: str) -> None:
        self.log[key] = []

        def loop() -> None:
            with httpx.Client(timeout=30) as c:
                while not self.stop.is_set():
                    try:
                        status = c.post(self.url, content=BODY, headers={"Authorization": f"Bearer {key}"}).status_code
                    except httpx.HTTPError:
                        status = -1
                    self.log[key].append((time.monotonic(), status))
                    time.sleep(0.01)

        t = threading.Thread(target=loop)
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def test_a_key_rotated_under_load_is_refused_within_the_poll_period_without_a_restart(
    pod_factory: Any, gateway_factory: Any, tmp_path: Path
) -> None:
    """Tenants ``a`` and ``b`` send requests without pause; ``a``'s key is rotated through the
    ``..data`` swap: the old key gets 401 within the poll period, the new one 200, ``b`` never fails,
    the gateway's PID is unchanged. Then a bad keys file is rejected (logged without its content,
    counted) and the keys in force stay."""
    token = tmp_path / "edge-token"
    token.write_text(secrets.token_hex(32) + "\n")
    pod_keys = tmp_path / "pod-keys"  # the pod trusts the gateway's tenant (edge token), not these
    pod_keys.write_text(f"{_h('pod-only')} a\n")
    tenants = {"allowAnonymous": False, "tenants": [{"name": "a"}, {"name": "b"}]}
    pod = pod_factory(config={"model": {"spec": "synthetic:5"}, "edge": {"tokenFile": str(token)},
                              "tenants": {**tenants, "keysFile": str(pod_keys)}})
    vol = Volume(tmp_path / "keys-vol", "keys")
    vol.write(f"{_h('a-old')} a\n{_h('b-key')} b\n")
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{pod.port}"], "reloadSeconds": PERIOD,
                          "edge": {"tokenFile": str(token)}, "tenants": {**tenants, "keysFile": vol.path}})
    pid = gw.proc.pid
    load = Load(gw.infer_url())
    load.run("a-old")
    load.run("b-key")
    try:
        time.sleep(1.0)
        vol.write(f"{_h('a-new')} a\n{_h('b-key')} b\n")
        rotated = time.monotonic()
        end = rotated + 10
        while not any(s == 401 for _, s in load.log["a-old"]) and time.monotonic() < end:
            time.sleep(0.01)
        load.run("a-new")
        time.sleep(1.0)
        # a keys file with a bad line: refused, the keys in force stay
        vol.write("not-a-hash-line-with-secret-k3y\n")
        end = time.monotonic() + 10
        while gw.metric("sluiceway_gateway_config_reload_total", result="rejected") < 1 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(2 * PERIOD)
    finally:
        load.join()
    old = load.log["a-old"]
    first_401 = min((t for t, s in old if s == 401), default=None)
    assert first_401 is not None, "the old key was never refused"
    late_200 = [t - rotated for t, s in old if s == 200 and t > first_401]
    b = load.log["b-key"]
    new = load.log["a-new"]
    print(f"old key refused {first_401 - rotated:.3f}s after the swap (poll {PERIOD}s); b: {len(b)} requests,"
          f" statuses {sorted({s for _, s in b})}; new key: {len(new)} requests,"
          f" statuses {sorted({s for _, s in new})};"
          f" reloads applied {gw.metric('sluiceway_gateway_config_reload_total', result='applied'):.0f},"
          f" rejected {gw.metric('sluiceway_gateway_config_reload_total', result='rejected'):.0f}")
    assert first_401 - rotated <= PERIOD + 0.25, first_401 - rotated
    assert late_200 == [], late_200  # once refused, never accepted again
    assert {s for _, s in b} == {200} and len(b) > 20
    assert new and {s for _, s in new} == {200}
    assert {s for t, s in old if t < rotated} == {200}
    assert gw.metric("sluiceway_gateway_config_reload_total", result="applied") == 1
    assert gw.metric("sluiceway_gateway_config_reload_total", result="rejected") == 1
    assert gw.metric("sluiceway_gateway_config_reload_failing") == 1
    assert gw.proc.poll() is None and gw.proc.pid == pid
    logs = gw.logs()
    assert "secret-k3y" not in logs and logs.count("tenant reload rejected") == 1, logs
