"""Issue 19 §1, the problem shown in the sandbox without the gateway: keep-alive clients through a
Service (the real kube-proxy, iptables mode) stay on the pods their connections reached, so pods
added under steady load get next to nothing.

The sandbox comes up without KEDA (``--no-keda``: the count is set by hand, so the test is bounded
and the autoscaler plays no part); the demo sample's InferenceService runs with ``autoscaling.engine:
none`` at 1 replica. Eight keep-alive clients of one tenant (one connection each, the load
generator's default kind of client) send a steady 24 requests/s (0.6 of one replica's capacity, so
no request times out and no client has a reason to reconnect) to the Service's ClusterIP. The
replicas go 1 -> 4; from the moment the fourth pod is a ready endpoint, each pod's own request
counter (``sluiceway_requests_total``, read from its metrics port) is read, and again a minute
later. The table of shares is printed; an even spread would give the three new pods 75 % between
them. The assertion: they got at most 10 % (in practice none: every connection was opened before
they existed), while the pods served the load (at least 80 % of what was offered).

Bounded: every wait has a deadline, and the module (sandbox up, the run, down) at most 180 s
(pytest-timeout); alone it printed ``1 passed in 105.39s``.
"""

from __future__ import annotations

import copy
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from sandbox_support import SAMPLE, cli, is_ready, missing, pods, summary, wait_for
from sluiceway_core import metric_names as m
from sluiceway_sandbox import netns
from sluiceway_sandbox.kubeclient import Kube
from sluiceway_sandbox.layout import Layout, layout_for
from sluiceway_sandbox.loadgen import (
    Client,
    EndpointWatcher,
    KeepAlive,
    Phase,
    build_schedule,
    run_load_in_thread,
    service_address,
)

NS, NAME = "sluiceway-demo", "ramp"
CAPACITY = 40.0  # requests/s of one replica (the sample: 2 permits, 50 ms per request)
RATE = 24.0  # requests/s offered, steady: 0.6x one replica
CLIENTS = KeepAlive(clients=8, connections=1)
WINDOW = 60.0  # seconds after the new pods are ready
REPLICAS = 4
NEW_PODS_BOUND = 0.10  # the new pods' share together (an even spread: 0.75)

pytestmark = [pytest.mark.slow, pytest.mark.sandbox, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layout]:
    why = missing()
    if why:
        pytest.skip(why)
    layout = layout_for(tmp_path_factory.mktemp("sandbox"))
    if layout.bridge in netns.list_links(layout.bridge):
        pytest.fail(f"bridge {layout.bridge} exists: another sandbox is up (sluiceway sandbox down first)")
    try:
        out = cli(layout, "up", "--no-build", "--no-keda", "--timeout", "90", timeout=150)
        assert out.returncode == 0, f"sandbox up failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        print(next((ln for ln in out.stdout.splitlines() if ln.startswith("sandbox up in")), out.stdout[-300:]))
        yield layout
    finally:
        down = cli(layout, "down", timeout=120)
        assert down.returncode == 0, down.stderr


def fixed_replicas(docs: list[dict[str, Any]], replicas: int) -> list[dict[str, Any]]:
    """The sample with its InferenceService at a fixed count (no autoscaler)."""
    out = copy.deepcopy(docs)
    for d in out:
        if d.get("kind") == "InferenceService":
            d["spec"]["autoscaling"] = {"engine": "none"}
            d["spec"]["replicas"] = replicas
    return out


def requests_served(ip: str) -> float:
    """The pod's own count of the inference requests it answered (every code), from its metrics port."""
    with urllib.request.urlopen(f"http://{ip}:9091/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(m.REQUESTS + "{") or line.startswith(m.REQUESTS + " ")
    )


def test_keepalive_clients_leave_new_pods_idle(sandbox: Layout) -> None:
    layout = sandbox
    kube = Kube.as_identity(layout, "admin")
    docs = fixed_replicas([d for d in yaml.safe_load_all(SAMPLE.read_text()) if d], 1)
    for d in docs:
        kube.apply(d)
    key = next(s["stringData"]["key"] for s in docs if s["kind"] == "Secret" and s["metadata"]["name"] == "search-key")
    watcher = EndpointWatcher(kube, NS, NAME)
    wait_for(watcher.poll, 120, f"a ready endpoint of {NS}/{NAME}", lambda: summary(kube, NS))
    (first,) = [p for p in pods(kube, NS) if is_ready(p)]
    service = service_address(kube, NS, NAME)
    client = Client("search", key, "interactive", RATE)
    schedule = build_schedule([Phase("steady", 150, RATE)], [client], seed=19)
    started: list[float] = []
    thread, outcomes, stop = run_load_in_thread(
        schedule, [client], f"/v2/models/{NAME}/infer", service=service, keepalive=CLIENTS,
        on_start=started.append,
    )
    try:
        wait_for(lambda: started, 30, "the load generator's start")
        time.sleep(5.0)  # every client has opened its connection (to the one pod there is)
        kube.merge_patch(f"/apis/sluiceway.io/v1alpha1/namespaces/{NS}/inferenceservices/{NAME}",
                         {"spec": {"replicas": REPLICAS}})
        t_scale = time.monotonic()
        with watcher:
            wait_for(lambda: len(watcher.poll()) == REPLICAS, 90, f"{REPLICAS} ready endpoints",
                     lambda: summary(kube, NS))
        t_ready = time.monotonic()
        ready = [p for p in pods(kube, NS) if is_ready(p)]
        ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in ready}
        before = {n: requests_served(ip) for n, ip in ips.items()}
        time.sleep(max(0.0, t_ready + WINDOW - time.monotonic()))
        after = {n: requests_served(ip) for n, ip in ips.items()}
        t_end = time.monotonic()
    finally:
        stop.set()
        thread.join(timeout=30)
    assert len(ips) == REPLICAS and first["metadata"]["name"] in ips, summary(kube, NS)
    served = {n: after[n] - before[n] for n in ips}
    total = sum(served.values())
    t0 = started[0]
    window = [o for o in list(outcomes) if t_ready <= t0 + o.t < t_end]
    answered = sum(1 for o in window if 200 <= o.status < 300)
    print(f"\n{REPLICAS} ready endpoints {t_ready - t_scale:.1f} s after the count was raised; "
          f"{CLIENTS.clients} keep-alive clients x {CLIENTS.connections} connection "
          f"through {service}, {RATE:g} requests/s offered")
    print(f"requests each pod served in the {t_end - t_ready:.0f} s after the new pods were ready "
          f"(the pods' {m.REQUESTS}):")
    print(f"  {'pod':32} {'joined':8} {'requests':>9} {'share':>7} {'even share':>11}")
    for n in sorted(ips, key=lambda n: n != first["metadata"]["name"]):
        joined = "first" if n == first["metadata"]["name"] else "new"
        share = served[n] / total if total else 0.0
        print(f"  {n:32} {joined:8} {served[n]:9.0f} {share:7.1%} {1 / REPLICAS:11.1%}")
    new_share = sum(v for n, v in served.items() if n != first["metadata"]["name"]) / total if total else 0.0
    print(f"  the {REPLICAS - 1} new pods together: {new_share:.1%} (even: {(REPLICAS - 1) / REPLICAS:.0%}); "
          f"the load generator: {len(window)} sent, {answered} answered 2xx in that window")
    assert total >= 0.8 * RATE * WINDOW, (served, "the pods did not serve the steady load")
    assert new_share <= NEW_PODS_BOUND, served
