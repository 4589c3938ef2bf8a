"""Never deactivate while a pod is still starting (issue 20), with real parts: a real
``sluiceway-pod`` whose model takes 10 s to load (its metrics port answers meanwhile, as a GPU pod's
does while it loads weights), the Debian prometheus scraping it every second, and the scaler's real
gRPC server with ``minReplicas: 0``. While the pod loads nothing is queued, nothing arrives and the
gateway holds nothing: before the change the scaler answered ``false``, which lets KEDA take the
starting pod away after its cooldownPeriod. Once the pod is ready (its ``ready`` start phase
exported) and idle, the answer is ``false``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from netports import free_port
from podtools import start_pod
from scaler_support import PROMETHEUS, SERVICE, Prometheus, ref, start_scaler, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

LOAD_SECONDS = 10.0


def test_a_pod_still_loading_keeps_the_service_active_until_it_is_ready(tmp_path: Path) -> None:
    if not Path(PROMETHEUS).exists():
        pytest.skip("prometheus binary not found: apt-get install -y prometheus")
    env = {"PYTHONPATH": str(Path(__file__).parent), "SLOWLOAD_SECONDS": str(LOAD_SECONDS)}
    started = time.monotonic()
    pod = start_pod(tmp_path, "--model", "slowload:echo_after_sleep", "--concurrency", "1", env=env,
                    wait_ready=False)
    prom = Prometheus(free_port(), tmp_path, [f"127.0.0.1:{pod.metrics_port}"])
    prom.start()
    try:
        md = {"inferenceService": SERVICE, "prometheusAddress": prom.url, "targetQueueDepthPerReplica": "2",
              "minReplicas": "0", "maxReplicas": "4", "rateWindow": "15s", "queryTimeout": "2s"}
        with start_scaler(prometheus=(prom.url,)) as s:
            wait_for(lambda: len(prom.query("up == 1")) == 1, LOAD_SECONDS, "the loading pod scraped")
            assert not prom.query('sluiceway_start_phase_seconds{phase="ready"}'), "ready too soon for this test"
            loading = s.stub.IsActive(ref(**md), timeout=10).result
            at = time.monotonic() - started
            assert loading is True, f"a pod loading ({at:.1f}s into an {LOAD_SECONDS:g}s load) deactivated"
            ready = wait_for(lambda: bool(prom.query('sluiceway_start_phase_seconds{phase="ready"}')), 60,
                             "the pod ready and its ready phase scraped")
            idle = wait_for(lambda: s.stub.IsActive(ref(**md), timeout=10).result is False, 30,
                            "IsActive false once the pod is ready and idle")
            print(f"\nIsActive true {at:.1f}s into the pod's {LOAD_SECONDS:g}s load; ready phase scraped "
                  f"{ready:.1f}s later; false {idle:.1f}s after that (idle, ready)")
    finally:
        prom.stop()
        pod.terminate(10)
