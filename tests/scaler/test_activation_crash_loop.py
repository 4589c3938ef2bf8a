"""A crash-looping pod does not keep the service active for ever (issue 20), with real parts: a real
``sluiceway-pod`` process whose model fails to load after 8 s, then 2.5 s at each restart (its
metrics port answers while it loads, then the process exits), restarted on the same ports after a
short back-off as the kubelet restarts a container (the target's ``instance`` stays, as a pod's IP
does), the Debian prometheus scraping it every second, and the scaler's real gRPC server with
``minReplicas: 0``. Nothing is queued, nothing arrives and no gateway holds anything.

Before the fix the scaler counted every pod up and never ready as starting
(``sum(up == 1) - count(ready phase)``), so each restart of the loop answered ``true`` again and
KEDA's cooldown never ran out. Now a pod whose target went down twice within ``crashLoopWindow``
is crash-looping, not starting: once the second crash is scraped and the pod is up (loading) again,
every answer is ``false``, while it loads and while it is down (no pod scraped: the last answer
stands), so KEDA's cooldown (``scaleToZeroAfter``) runs out and the service goes to zero.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from netports import free_port
from scaler_support import PROMETHEUS, SERVICE, Prometheus, ref, start_scaler, wait_for
from sluiceway_core.signals import Queries
from sluiceway_core.urls import UrlAllowList
from sluiceway_scaler.prom import PrometheusSource

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

LOAD_SECONDS = 2.5
#: the first start loads longer, so the test reads it loading (starting) before it dies
FIRST_LOAD_SECONDS = 8.0
BACKOFF_SECONDS = 0.5
ROOT = Path(__file__).resolve().parents[2]


class Kubelet:
    """Runs the crashing pod, and again after each exit (``BACKOFF_SECONDS`` later), on the same
    ports, until ``stop()``; counts the starts."""

    def __init__(self, tmp: Path) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.tmp = tmp
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "SLUICEWAY_SERVER__METRICS_PORT": str(self.metrics_port),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT / "tests"),
                                           os.environ.get("PYTHONPATH", "")]),
        }
        cmd = [sys.executable, "-m", "sluiceway_pod.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--model", "slowload:crash_after_sleep", "--concurrency", "1"]
        while not self._stop.is_set():
            load = FIRST_LOAD_SECONDS if self.starts == 0 else LOAD_SECONDS
            with (self.tmp / f"pod-{self.starts}.log").open("wb") as fh:
                self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                             env={**env, "SLOWLOAD_SECONDS": str(load)}, cwd=self.tmp)
            self.starts += 1
            while self.proc.poll() is None and not self._stop.is_set():
                time.sleep(0.05)
            self._stop.wait(BACKOFF_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._thread.join(15)


def test_a_crash_looping_pod_no_longer_counts_as_starting(tmp_path: Path) -> None:
    if not Path(PROMETHEUS).exists():
        pytest.skip("prometheus binary not found: apt-get install -y prometheus")
    kubelet = Kubelet(tmp_path)
    kubelet.start()
    prom = Prometheus(free_port(), tmp_path, [f"127.0.0.1:{kubelet.metrics_port}"])
    prom.start()
    try:
        md = {"inferenceService": SERVICE, "prometheusAddress": prom.url, "targetQueueDepthPerReplica": "2",
              "minReplicas": "0", "maxReplicas": "4", "rateWindow": "5s", "queryTimeout": "2s",
              "crashLoopWindow": "1m"}
        source = PrometheusSource(allow=UrlAllowList.build("test", [prom.url]))
        with start_scaler(prometheus=(prom.url,)) as s:
            queries = Queries.build(prom.labels["namespace"], SERVICE, "5s", "1m")
            # the first start: loading, never crashed yet -> starting, active
            wait_for(lambda: len(prom.query("up == 1")) == 1, 30, "the loading pod scraped")
            first = source.read_busy(prom.url, queries, 2.0)
            assert first.starting == 1, first
            assert s.stub.IsActive(ref(**md), timeout=10).result is True, "a pod loading for the first time"
            # the loop: two crashes scraped (its target went down twice)
            crashed = wait_for(lambda: bool(prom.query("resets(up[1m]) >= 2")), 60, "two crashes scraped")
            # while its target is down no pod is scraped: the scaler's answer is unknown and the
            # last one stands (``IsActive``); the first answer with the pod up again decides it
            wait_for(lambda: len(prom.query("up == 1")) == 1, 30, "the pod up (loading) again")
            answers: list[bool] = []
            up_seen = 0
            end = time.monotonic() + 10.0
            while time.monotonic() < end:
                answers.append(s.stub.IsActive(ref(**md), timeout=10).result)
                busy = source.read_busy(prom.url, queries, 2.0)
                assert busy.starting == 0, f"a crash-looping pod counted as starting: {busy}"
                up_seen += len(prom.query("up == 1"))
                time.sleep(0.5)
            print(f"\n{kubelet.starts} starts; two crashes scraped {crashed:.1f}s after the first load was "
                  f"seen; then {len(answers)} IsActive answers over 10 s: {answers.count(True)} true; "
                  f"the pod up (loading again) in {up_seen} of the samples")
            assert up_seen > 0, "the pod was never up again: the test saw no restart"
            assert not any(answers), answers
    finally:
        prom.stop()
        kubelet.stop()
