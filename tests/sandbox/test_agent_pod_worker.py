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
