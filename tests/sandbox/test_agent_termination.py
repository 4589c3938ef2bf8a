"""The agent writes a container's termination message as the kubelet does (issue 22): the file at
``terminationMessagePath`` (default ``/dev/termination-log``) is a per-container file bind-mounted
into the container, read when it exits into ``state.terminated.message`` (at most 4096 bytes), with
``FallbackToLogsOnError`` taking the log's tail when the file is empty; a failed container waiting
to restart shows the failure in ``lastState.terminated`` at once (the operator's ``ModelFetched``
reads either). No root: the launch is replaced by a process that writes the bind-mount's source."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from sluiceway_sandbox.agent import runtime
from sluiceway_sandbox.agent.images import Images
from sluiceway_sandbox.agent.pods import NodeContext, PodWorker
from sluiceway_sandbox.agent.volumes import Mount
from sluiceway_sandbox.layout import Layout
from test_agent_pod_worker import FakeKube


def make_worker(tmp_path: Path, init: dict[str, Any]) -> PodWorker:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "sluiceway-pod").write_text("#!/bin/sh\n")
    (tmp_path / "sluiceway-pod").chmod(0o755)
    ctx = NodeContext(
        layout=Layout(state_dir=tmp_path),
        kube=FakeKube(),
        images=Images(bin_dir=tmp_path),
        allocatable={"cpu": "4"},
        allocate_ip=lambda uid, preferred: "198.18.1.9",
        release_ip=lambda uid: None,
        network_up=lambda layout, uid, ip: "slw-test",
        network_down=lambda uid: None,
    )
    image = "ghcr.io/sluiceway/sluiceway-pod:0.1.0"
    pod = {
        "metadata": {"name": "scorer", "namespace": "ns1", "uid": "uid-2"},
        "spec": {
            "nodeName": "sandbox-node",
            "initContainers": [{"name": "storage-initializer", "image": image, "command": ["sluiceway-pod", "fetch"],
                                **init}],
            "containers": [{"name": "c", "image": image, "command": ["sluiceway-pod", "serve"]}],
        },
        "status": {"phase": "Pending"},
    }
    return PodWorker(ctx, pod)


def fake_launch(script: str) -> Any:
    """runtime.launch replaced: runs ``script`` with $MSG = the source bound at the container's
    termination message path (empty when none is bound) and writes its output to the log."""

    def launch(netns: str, spec: runtime.Launch, mounts: list[Mount], hosts: Any, resolv: Any, log: Path,
               pid_file: Path) -> subprocess.Popen[bytes]:
        msg = next((str(m.source) for m in mounts if m.target in ("/dev/termination-log", "/tmp/why")), "")
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as fh:
            return subprocess.Popen(["sh", "-c", script], env={"MSG": msg}, stdout=fh, stderr=subprocess.STDOUT)

    return launch


def run_until_exit(w: PodWorker) -> None:
    w._setup()
    assert w.setup_ok, w.setup_error
    deadline = time.monotonic() + 10
    c = w.init[0]
    w._step(time.monotonic())
    while c.proc is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        w._step(time.monotonic())
    assert c.proc is None, "the init container did not exit within 10 s"


def test_a_failed_init_container_reports_its_termination_message_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = "sluiceway-pod fetch: failed (access-denied): s3://models/scorer/v1/: AccessDenied"
    monkeypatch.setattr(runtime, "launch", fake_launch(f'[ -n "$MSG" ] && echo "{line}" > "$MSG"; exit 11'))
    w = make_worker(tmp_path, {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"})
    run_until_exit(w)
    st = w.build_status()["initContainerStatuses"][0]
    assert st["state"]["waiting"]["reason"] == "CrashLoopBackOff", st
    last = st["lastState"]["terminated"]
    assert last["exitCode"] == 11 and last["reason"] == "Error", st
    assert last["message"].strip() == line, st
    main = w.build_status()["containerStatuses"][0]
    assert "running" not in main["state"], main  # the model's container waits for the initializer
    w._teardown()


def test_the_default_path_and_the_log_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # no terminationMessagePath: the default /dev/termination-log is bound
    monkeypatch.setattr(runtime, "launch", fake_launch('echo "why" > "$MSG"; exit 3'))
    w = make_worker(tmp_path / "a", {})
    run_until_exit(w)
    assert w.init[0].last_terminated is not None
    assert w.init[0].last_terminated["message"].strip() == "why"
    w._teardown()
    # an empty file with FallbackToLogsOnError: the log's tail
    monkeypatch.setattr(runtime, "launch", fake_launch('echo "from the log"; exit 4'))
    w = make_worker(tmp_path / "b", {"terminationMessagePath": "/tmp/why",
                                     "terminationMessagePolicy": "FallbackToLogsOnError"})
    run_until_exit(w)
    assert w.init[0].last_terminated is not None
    assert "from the log" in w.init[0].last_terminated["message"]
    w._teardown()


def test_a_long_message_is_cut_to_4096_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = 'head -c 10000 /dev/zero | tr "\\0" x > "$MSG"; exit 1'
    monkeypatch.setattr(runtime, "launch", fake_launch(script))
    w = make_worker(tmp_path, {})
    run_until_exit(w)
    assert w.init[0].last_terminated is not None
    assert len(w.init[0].last_terminated["message"]) == 4096
    w._teardown()


def test_a_finished_init_container_shows_completed_and_is_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "launch", fake_launch("exit 0"))
    w = make_worker(tmp_path, {})
    run_until_exit(w)
    st = w.build_status()
    init = st["initContainerStatuses"][0]
    assert init["state"] == {"terminated": init["state"]["terminated"]}, init
    assert init["state"]["terminated"]["reason"] == "Completed" and init["restartCount"] == 0, init
    assert init["lastState"] == {}, init
    assert next(c for c in st["conditions"] if c["type"] == "Initialized")["status"] == "True"
    w._step(time.monotonic())  # the model's container starts next
    assert w.containers[0].proc is not None and w.init[0].restarts == 0
    w._teardown()
