"""A pod whose model fails to load says why in its termination message (issue 20: "a pod that fails
to start ... the condition says why"). The operator's ``PodsHealthy`` condition carries the last line
of the container's termination message; without one of its own the kubelet's log tail
(``FallbackToLogsOnError``) ended with uvicorn's "Finished server process", not the load's error.
Real ``sluiceway-pod serve`` processes."""

from __future__ import annotations

import time
from pathlib import Path

from podtools import start_pod


def _exit(pod: object, timeout: float = 60) -> int:
    proc = pod.proc  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is not None, "the pod did not exit"
    return int(proc.returncode)


def test_a_model_that_fails_to_load_writes_its_error_to_the_termination_log(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    pod = start_pod(tmp_path, "--model", str(tmp_path / "missing.pt"), "--termination-log", str(log),
                    wait_ready=False)
    assert _exit(pod) == 3
    text = log.read_text()
    print(f"termination message: {text!r}")
    assert text.startswith("the model failed to load: ") and "missing.pt" in text
    assert len(text) <= 1024 and text.count("\n") <= 1


def test_a_pod_that_serves_writes_no_termination_message(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    pod = start_pod(tmp_path, "--model", "synthetic:0", "--termination-log", str(log))
    pod.terminate(30)
    assert not log.exists() or log.read_text() == ""
