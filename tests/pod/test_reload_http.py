"""Issue 22 §3: the pod reloads tenant keys and limits from its mounted volumes while serving.

Real pod processes over loopback. The config file and the keys file live in directories laid out as
the kubelet lays out ConfigMap and Secret volumes (``..<timestamp>/`` holding the files, ``..data``
pointing at it, ``name -> ..data/name``), and are updated as the kubelet updates them: a new
timestamped directory, then an atomic rename of the ``..data`` symlink. The new files keep the old
files' mtime and size, so only a content comparison sees the change.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubelet_volume import kubelet_write
from podtools import PodProcess, infer_body, start_pod
from sluiceway_core.keys import hash_key, keys_text

SALT = bytes(range(32))
OLD = {"alice": "sk-alice-000000000001", "bob": "sk-bob-old-0000000001"}
NEW_BOB = "sk-bob-new-0000000002"  # same length as the old key: the keys file keeps its size


def keys_bytes(keys: dict[str, str]) -> bytes:
    return keys_text(SALT, {t: hash_key(k, SALT) for t, k in keys.items()}).encode()


def pod_config(keys_path: Path, tenants: list[dict[str, Any]], **extra: Any) -> bytes:
    cfg: dict[str, Any] = {
        "model": {"spec": "synthetic:20", "name": "demo", "warmupIterations": 1},
        "concurrency": {"permits": 2},
        "queue": {"maxDepth": 64, "timeoutSeconds": 30},
        "tenants": {"keysFile": str(keys_path), "allowAnonymous": False, "tenants": tenants},
        **extra,
    }
    return yaml.safe_dump(cfg).encode()


class Mounted:
    """A pod whose config and keys come from kubelet-style volumes under ``tmp``."""

    def __init__(self, tmp: Path, tenants: list[dict[str, Any]], keys: dict[str, str]) -> None:
        self.cfg_vol, self.key_vol = tmp / "config", tmp / "keys"
        self.keys_path = self.key_vol / "keys.txt"
        kubelet_write(self.key_vol, {"keys.txt": keys_bytes(keys)})
        kubelet_write(self.cfg_vol, {"pod.yaml": pod_config(self.keys_path, tenants)})
        self.pod = start_pod(
            tmp,
            "--config",
            str(self.cfg_vol / "pod.yaml"),
            env={"SLUICEWAY_RELOAD_SECONDS": "0.2"},
        )

    def set_keys(self, keys: dict[str, str] | bytes) -> None:
        kubelet_write(self.key_vol, {"keys.txt": keys if isinstance(keys, bytes) else keys_bytes(keys)})

    def set_config(self, body: bytes) -> None:
        kubelet_write(self.cfg_vol, {"pod.yaml": body})

    def reloads(self, result: str) -> float:
        return self.pod.metric("sluiceway_config_reload_total", result=result)

    def wait_reloads(self, result: str, n: float, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while self.reloads(result) < n:
            assert self.pod.proc.poll() is None, self.pod.logs()
            assert time.monotonic() < end, f"no {result} reload #{n:g} within {timeout}s:\n{self.pod.logs()[-3000:]}"
            time.sleep(0.05)


@pytest.fixture
def mounted(tmp_path: Path) -> Any:
    made: list[Mounted] = []

    def make(tenants: list[dict[str, Any]], keys: dict[str, str]) -> Mounted:
        m = Mounted(tmp_path, tenants, keys)
        made.append(m)
        return m

    yield make
    for m in made:
        m.pod.terminate(30)


def post(pod: PodProcess, key: str) -> httpx.Response:
    return httpx.post(pod.infer_url, json=infer_body(), headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_a_key_rotates_under_load_without_a_restart(mounted: Any) -> None:
    m: Mounted = mounted([{"name": "alice"}, {"name": "bob"}], OLD)
    pod = m.pod
    pid = pod.proc.pid
    served_before = pod.metric("sluiceway_requests_total")
    applied_at: list[float] = []
    results: dict[str, list[tuple[float, int]]] = {"alice": [], "bob": []}

    async def client(c: httpx.AsyncClient, who: str, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {OLD[who]}"}
        while not stop.is_set():
            sent = time.monotonic()
            r = await c.post(pod.infer_url, json=infer_body(), headers=headers)
            results[who].append((sent, r.status_code))

    async def scenario() -> None:
        stop = asyncio.Event()
        async with httpx.AsyncClient(timeout=30) as c:
            tasks = [asyncio.create_task(client(c, w, stop)) for w in ("alice", "alice", "bob")]
            await asyncio.sleep(1.0)
            await asyncio.to_thread(m.set_keys, {"alice": OLD["alice"], "bob": NEW_BOB})
            await asyncio.to_thread(m.wait_reloads, "applied", 1)
            applied_at.append(time.monotonic())
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(*tasks)

    asyncio.run(scenario())
    alice = [code for _, code in results["alice"]]
    bob = [code for _, code in results["bob"]]
    print(
        f"alice: {len(alice)} requests {sorted(set(alice))}; bob (old key): {bob.count(200)} x 200 then "
        f"{bob.count(401)} x 401"
    )
    assert alice and set(alice) == {200}  # the kept key never failed, during the reload or after
    assert bob[0] == 200 and set(bob) <= {200, 401}
    first_401 = bob.index(401)  # the removed key stopped working ...
    assert set(bob[first_401:]) == {401}  # ... for good, and every request before that was served
    late = [code for sent, code in results["bob"] if sent > applied_at[0]]
    assert late and set(late) == {401}  # every request sent after the reload was refused
    assert post(pod, NEW_BOB).status_code == 200  # the new key works
    assert pod.proc.poll() is None and pod.proc.pid == pid  # the same process served throughout
    assert pod.metric("sluiceway_requests_total") >= served_before + len(alice) + len(bob)  # counters not reset
    assert m.reloads("rejected") == 0
    for key in (*OLD.values(), NEW_BOB):
        assert key not in pod.logs()


def test_a_bad_keys_file_keeps_the_keys_in_force(mounted: Any) -> None:
    m: Mounted = mounted([{"name": "alice"}, {"name": "bob"}], OLD)
    pod = m.pod
    pasted = "sk-pasted-by-mistake-123"
    m.set_keys(keys_bytes(OLD) + f"{pasted}\n".encode())  # a key where a hash belongs
    m.wait_reloads("rejected", 1)
    assert pod.metric("sluiceway_config_reload_failing") == 1
    assert post(pod, OLD["alice"]).status_code == 200 and post(pod, OLD["bob"]).status_code == 200
    logs = pod.logs()
    assert "tenant reload rejected" in logs and "line 4" in logs and pasted not in logs
    time.sleep(1.0)  # five more polls of the same bad file: one error logged and counted, not one per poll
    assert pod.logs().count("tenant reload rejected") == 1 and m.reloads("rejected") == 1

    m.set_keys(b"hmac-sha256 " + SALT.hex().encode() + b"\n" + b"#" * (1024 * 1024 + 1) + b"\n")  # > 1 MiB
    m.wait_reloads("rejected", 2)
    assert "larger than 1048576 bytes" in pod.logs()
    assert post(pod, OLD["bob"]).status_code == 200

    m.set_config(b"model: [unclosed\n")  # the config file itself broken
    m.wait_reloads("rejected", 3)
    assert post(pod, OLD["bob"]).status_code == 200

    m.set_config(pod_config(m.keys_path, [{"name": "alice"}, {"name": "bob"}]))
    m.set_keys({"alice": OLD["alice"]})  # good again: bob's key removed
    m.wait_reloads("applied", 1)
    assert pod.metric("sluiceway_config_reload_failing") == 0
    assert post(pod, OLD["bob"]).status_code == 401 and post(pod, OLD["alice"]).status_code == 200
    assert pod.proc.poll() is None


def test_a_rate_change_applies_and_other_changes_wait_for_a_restart(mounted: Any) -> None:
    m: Mounted = mounted([{"name": "alice", "rate": 0.01, "burst": 1}, {"name": "bob"}], OLD)
    pod = m.pod
    assert [post(pod, OLD["alice"]).status_code for _ in range(2)] == [200, 429]
    m.set_config(pod_config(m.keys_path, [{"name": "alice", "rate": 1000, "burst": 5}, {"name": "bob"}]))
    m.wait_reloads("applied", 1)
    # the bucket kept its (empty) tokens and now refills at 1000/s: within 5 ms it holds the burst again
    time.sleep(0.05)
    codes = [post(pod, OLD["alice"]).status_code for _ in range(5)]
    assert codes == [200] * 5, codes
    # a new listed tenant gets its own metrics label at once
    m.set_config(pod_config(m.keys_path, [{"name": "alice"}, {"name": "bob"}, {"name": "carol"}]))
    m.set_keys({**OLD, "carol": "sk-carol-0000000000003"})
    m.wait_reloads("applied", 2)
    deadline = time.monotonic() + 10
    while post(pod, "sk-carol-0000000000003").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert pod.metric("sluiceway_requests_total", tenant="carol", code="200") >= 1

    # a change outside tenants is reported, not applied: the queue bound needs a restart
    m.set_config(
        pod_config(
            m.keys_path,
            [{"name": "alice"}, {"name": "bob"}, {"name": "carol"}],
            queue={"maxDepth": 32, "timeoutSeconds": 30},
        )
    )
    m.wait_reloads("restart_required", 1)
    assert "queue changed; only the tenants section reloads" in pod.logs()
    assert post(pod, OLD["bob"]).status_code == 200
