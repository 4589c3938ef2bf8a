"""A pod worker against a recording fake API (no root, no network): an unknown image is reported in
the Pod's status and as an Event, never started; status carries the pod IP and conditions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluiceway_sandbox.agent.images import Images
from sluiceway_sandbox.agent.pods import NodeContext, PodWorker
from sluiceway_sandbox.layout import Layout


class FakeKube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        self.calls.append((method, path, body))
        return {}

    def create(self, path: str, body: Any) -> Any:
        self.calls.append(("POST", path, body))
        return {"status": {"token": "t"}}

    def get_or_none(self, path: str) -> Any:
        return None


def worker(tmp_path: Path, image: str) -> tuple[PodWorker, FakeKube, list[str]]:
    kube = FakeKube()
    downs: list[str] = []
    ctx = NodeContext(
        layout=Layout(state_dir=tmp_path),
        kube=kube,  # type: ignore[arg-type]
        images=Images(bin_dir=tmp_path),
        allocatable={"cpu": "4"},
        allocate_ip=lambda uid, preferred: "198.18.1.9",
        release_ip=lambda uid: None,
        network_up=lambda layout, uid, ip: "slw-test",
        network_down=downs.append,
    )
    pod = {
        "metadata": {"name": "web", "namespace": "ns1", "uid": "uid-1"},
        "spec": {"nodeName": "sandbox-node", "containers": [{"name": "c", "image": image}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    return PodWorker(ctx, pod), kube, downs


def test_unknown_image_fails_with_reason_and_event(tmp_path: Path) -> None:
    w, kube, downs = worker(tmp_path, "docker.io/library/nginx:1.27")
    w._setup()
    w._report()
    assert not w.setup_ok
    status = [b for m, p, b in kube.calls if p.endswith("/pods/web/status")][-1]["status"]
    assert status["podIP"] == "198.18.1.9" and status["hostIP"] == "198.18.0.1"
    waiting = status["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ErrImageNeverPull"
    assert "docker.io/library/nginx:1.27" in waiting["message"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert status["phase"] == "Pending"
    events = [b for m, p, b in kube.calls if p.endswith("/events")]
    assert events and events[0]["reason"] == "Failed" and events[0]["type"] == "Warning"
    assert "nginx" in events[0]["message"]
    w._teardown()
    assert downs == ["uid-1"]  # the pod's namespace is removed


def test_setup_error_is_reported_once_not_per_retry(tmp_path: Path) -> None:
    w, kube, _ = worker(tmp_path, "busybox")
    w._setup()
    w._setup()
    assert len([1 for m, p, b in kube.calls if p.endswith("/events")]) == 1


def test_network_failure_after_allocation_is_retried_as_one_step(tmp_path: Path) -> None:
    """Issue 18 item 12: the pod network fails after the IP was allocated. The next attempt must
    set the network up again (not skip it because an IP is held), so the worker never reaches a
    container start without a network namespace; the half-made attempt is undone."""
    from sluiceway_sandbox.netns import NetworkError

    w, kube, downs = worker(tmp_path, "busybox")
    ups: list[str] = []
    released: list[str] = []

    def flaky_up(layout: Layout, uid: str, ip: str) -> str:
        ups.append(ip)
        if len(ups) == 1:
            raise NetworkError("ip link add failed (2): RTNETLINK answers: File exists")
        return "slw-test"

    w.ctx.network_up = flaky_up
    w.ctx.release_ip = released.append
    w._setup()
    assert w.ip is None and w.netns is None  # nothing half-made survives the failed attempt
    assert released == ["uid-1"] and downs == ["uid-1"]
    w._setup()  # busybox is no known image: setup still fails, but after the network step
    assert len(ups) == 2, "the retry skipped the network setup"
    assert w.ip == "198.18.1.9" and w.netns == "slw-test"
    status = [b for m, p, b in kube.calls if p.endswith("/pods/web/status")][-1]["status"]
    assert status["podIP"] == "198.18.1.9"
