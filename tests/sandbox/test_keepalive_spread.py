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

Issue 19 §4, the same load through the gateway (``test_gateway_spreads_keepalive_clients``, the
second test here, on the same sandbox: the control plane starts once for both): the sample with
``spec.gateway.enabled``, so the operator renders the gateway (Deployment ``ramp-gateway`` running
``sluiceway-gateway``, its EndpointSlice Role, Service ``ramp-gateway`` = ``status.endpoint``), and
the same eight keep-alive clients call the **gateway's** Service ClusterIP, through the real
kube-proxy. The new pods must get an even share; the window and the measure are in that test's
docstring.

Bounded: every wait has a deadline, and each test at most 180 s (pytest-timeout; the first one's
includes ``sandbox up``, the last one's ``down``); the first test alone printed ``1 passed in 105.39s``.
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
    DEFAULT_BODY,
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
GW_NS = "sluiceway-gw"  # the gateway test's own namespace (the sample's, renamed)
SETTLE = 10.0  # seconds from the last new pod's readiness to the gateway test's window
EVEN_MARGIN = 0.10  # each pod's share within 10 percentage points of an even share (issue 19 §4)

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


def in_namespace(docs: list[dict[str, Any]], ns: str) -> list[dict[str, Any]]:
    """The sample's objects moved to namespace ``ns`` (the Namespace object renamed too)."""
    out = copy.deepcopy(docs)
    for d in out:
        if d.get("kind") == "Namespace":
            d["metadata"]["name"] = ns
        else:
            d["metadata"]["namespace"] = ns
    return out


def gateway_endpoints(ip: str) -> dict[str, float]:
    """The gateway's ``sluiceway_gateway_endpoints{state}`` gauge, from its metrics port."""
    with urllib.request.urlopen(f"http://{ip}:9091/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('sluiceway_gateway_endpoints{state="'):
            state = line.split('"', 2)[1]
            out[state] = float(line.rsplit(" ", 1)[1])
    return out


def test_gateway_spreads_keepalive_clients(sandbox: Layout) -> None:
    """Issue 19 §4: scale 1 -> 4 under steady load from keep-alive clients through the gateway.

    Setup: the demo sample in namespace ``sluiceway-gw`` with ``autoscaling.engine: none``, 1 replica
    and ``spec.gateway: {enabled: true, replicas: 1, routing: leastWait}``. The operator renders the
    gateway; the test waits until its pod is Ready, its ``status.endpoint`` is the gateway's Service
    and one request through that Service is answered 200 (the gateway found the pod through its own
    EndpointSlice watch, with the Role the operator rendered), and its ``sluiceway_gateway_endpoints``
    gauge counts 1 routable pod. The same load as the test above (8 keep-alive clients x 1
    connection, tenant ``search``, 24 requests/s = 0.6 of one replica) goes to the gateway Service's
    ClusterIP through kube-proxy; 5 s later the count goes to 4.

    Times: ``T`` is the first moment the test (polling the pods' Service's EndpointSlices every
    0.5 s) lists all 4 pods as ready endpoints; every new pod became ready at or before ``T``. The
    measure: each pod's own ``sluiceway_requests_total`` (its metrics port), read at ``T``, ``T + 10
    s`` and ``T + 60 s``; a pod's share of a window is its increase divided by the 4 pods' total
    increase. The assertion, on the window ``[T + 10 s, T + 60 s)`` (it starts no sooner than 10 s
    after each new pod was ready; the gateway's own discovery delay counts inside those 10 s): every
    pod's share, the first pod's and each new pod's, is within ``EVEN_MARGIN`` = 10 percentage points
    of the even share 25 % (15 % .. 35 %), the gateway routes 4 pods, and the pods served at least 80 %
    of the offered load. Why points and not 10 % of 25 % (22.5 % .. 27.5 %): at this load a pod's
    share of 50 s is the count of about 1200 requests placed one by one, and ties between idle pods
    are broken at random; its sampling deviation is about 1.3 points, so the relative reading would
    fail by chance on a correct gateway about one run in ten. 10 points is 8 deviations from even,
    and 10 points below the 25 % of even is still far from the section-1 failure (the new pods: 0 %).
    The table prints the 60 s after ``T`` (the section-1 window) and the asserted window, with the
    largest relative deviation from even.
    """
    layout = sandbox
    kube = Kube.as_identity(layout, "admin")
    # the test above leaves its 4 pods running: remove them (not waited for) to free the CPU
    if kube.get_or_none(f"/apis/sluiceway.io/v1alpha1/namespaces/{NS}/inferenceservices/{NAME}"):
        kube.delete(f"/apis/sluiceway.io/v1alpha1/namespaces/{NS}/inferenceservices/{NAME}")
    docs = gateway_docs(1)
    for d in docs:
        kube.apply(d)
    key = next(s["stringData"]["key"] for s in docs if s["kind"] == "Secret" and s["metadata"]["name"] == "search-key")
    gw_name = f"{NAME}-gateway"
    isvc = f"/apis/sluiceway.io/v1alpha1/namespaces/{GW_NS}/inferenceservices/{NAME}"
    watcher = EndpointWatcher(kube, GW_NS, NAME)
    wait_for(watcher.poll, 120, f"a ready endpoint of {GW_NS}/{NAME}", lambda: summary(kube, GW_NS))
    (first,) = [p for p in pods(kube, GW_NS, "app.kubernetes.io/name=sluiceway-pod") if is_ready(p)]
    gw_selector = "app.kubernetes.io/name=sluiceway-gateway"
    (gw_pod,) = wait_for(lambda: [p for p in pods(kube, GW_NS, gw_selector) if is_ready(p)], 90,
                         f"a Ready pod of Deployment {gw_name}", lambda: summary(kube, GW_NS))
    endpoint = f"http://{gw_name}.{GW_NS}.svc:8080"
    wait_for(lambda: (kube.get(isvc).get("status") or {}).get("endpoint") == endpoint, 60,
             f"status.endpoint {endpoint}", lambda: str(kube.get(isvc).get("status")))
    gw_watcher = EndpointWatcher(kube, GW_NS, gw_name)
    wait_for(gw_watcher.poll, 60, f"a ready endpoint of Service {gw_name}", lambda: summary(kube, GW_NS))
    service = service_address(kube, GW_NS, gw_name)
    gw_ip = gw_pod["status"]["podIP"]

    def through_gateway() -> bool:
        req = urllib.request.Request(
            f"http://{service}/v2/models/{NAME}/infer",
            data=DEFAULT_BODY,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return bool(resp.status == 200)

    wait_for(through_gateway, 60, f"a request answered 200 through {service}")
    wait_for(lambda: gateway_endpoints(gw_ip).get("routable") == 1, 30, "the gateway routing to 1 pod",
             lambda: str(gateway_endpoints(gw_ip)))

    client = Client("search", key, "interactive", RATE)
    schedule = build_schedule([Phase("steady", 150, RATE)], [client], seed=19)
    started: list[float] = []
    thread, outcomes, stop = run_load_in_thread(
        schedule, [client], f"/v2/models/{NAME}/infer", service=service, keepalive=CLIENTS,
        on_start=started.append,
    )
    seen: dict[str, float] = {}  # endpoint -> when the test first saw it ready
    reads: dict[str, dict[str, float]] = {}  # "T", "T+10", "T+60" -> pod -> requests served
    try:
        wait_for(lambda: started, 30, "the load generator's start")
        time.sleep(5.0)  # every client has opened its connection (to the gateway)
        kube.merge_patch(isvc, {"spec": {"replicas": REPLICAS}})
        t_scale = time.monotonic()
        deadline = t_scale + 90.0
        while len(seen) < REPLICAS:
            assert time.monotonic() < deadline, f"{REPLICAS} ready endpoints within 90 s\n{summary(kube, GW_NS)}"
            now = time.monotonic()
            for ep in watcher.poll():
                seen.setdefault(ep, now)
            time.sleep(0.5)
        t_ready = time.monotonic()
        ready = [p for p in pods(kube, GW_NS, "app.kubernetes.io/name=sluiceway-pod") if is_ready(p)]
        ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in ready}
        reads["T"] = {n: requests_served(ip) for n, ip in ips.items()}
        time.sleep(max(0.0, t_ready + SETTLE - time.monotonic()))
        reads["T+10"] = {n: requests_served(ip) for n, ip in ips.items()}
        routable = gateway_endpoints(gw_ip)
        time.sleep(max(0.0, t_ready + WINDOW - time.monotonic()))
        reads["T+60"] = {n: requests_served(ip) for n, ip in ips.items()}
        t_end = time.monotonic()
    finally:
        stop.set()
        thread.join(timeout=30)
    assert len(ips) == REPLICAS and first["metadata"]["name"] in ips, summary(kube, GW_NS)
    first_name = first["metadata"]["name"]
    whole = {n: reads["T+60"][n] - reads["T"][n] for n in ips}
    window = {n: reads["T+60"][n] - reads["T+10"][n] for n in ips}
    total_whole, total = sum(whole.values()), sum(window.values())
    even = 1 / REPLICAS
    t0 = started[0]
    sent = [o for o in list(outcomes) if t_ready + SETTLE <= t0 + o.t < t_end]
    codes: dict[int, int] = {}
    for o in sent:
        codes[o.status] = codes.get(o.status, 0) + 1
    first_ep = f"{first['status']['podIP']}:8080"
    ready_at = sorted(round(t - t_scale, 1) for ep, t in seen.items() if ep != first_ep)
    print(f"\nthrough the gateway: {REPLICAS} ready endpoints {t_ready - t_scale:.1f} s after the count was raised "
          f"(the new pods first seen ready at {ready_at} s); "
          f"{CLIENTS.clients} keep-alive clients x {CLIENTS.connections} connection "
          f"through the gateway Service {service} ({endpoint}), {RATE:g} requests/s offered; "
          f"gateway endpoints at T+{SETTLE:g} s: {routable}")
    print(f"requests each pod served after the new pods were ready, T = all {REPLICAS} ready "
          f"(the pods' {m.REQUESTS}):")
    print(f"  {'pod':32} {'joined':8} {'[T, T+60)':>10} {'share':>7} {'[T+10, T+60)':>13} {'share':>7} "
          f"{'even share':>11}")
    for n in sorted(ips, key=lambda n: n != first_name):
        joined = "first" if n == first_name else "new"
        s_whole = whole[n] / total_whole if total_whole else 0.0
        s_win = window[n] / total if total else 0.0
        print(f"  {n:32} {joined:8} {whole[n]:10.0f} {s_whole:7.1%} {window[n]:13.0f} {s_win:7.1%} {even:11.1%}")
    shares = {n: (window[n] / total if total else 0.0) for n in ips}
    worst = max(abs(v - even) for v in shares.values())
    new_share = sum(v for n, v in whole.items() if n != first_name) / total_whole if total_whole else 0.0
    print(f"  the {REPLICAS - 1} new pods together over [T, T+60): {new_share:.1%} (even: {1 - even:.0%}); "
          f"in [T+10, T+60) the largest deviation from even: {worst:.1%} points ({worst / even:.0%} of even; "
          f"bound {EVEN_MARGIN:.0%} points); the load generator: {len(sent)} sent in that window, codes {codes}")
    assert routable.get("routable") == REPLICAS, routable
    assert total >= 0.8 * RATE * (WINDOW - SETTLE), (window, "the pods did not serve the steady load")
    assert worst <= EVEN_MARGIN, shares


QUOTA, BURST = 20.0, 20  # the sample's reports: rate 20/s, burst 20 (alerts: 20/s, burst 40, maxConcurrent 8)
QUOTA_SECONDS = 40.0  # the quota test's load
CLUMP, CLUMP_EVERY = 6, 1.2  # alerts: 6 requests at once every 1.2 s in each of its two patterns


def gateway_docs(replicas: int) -> list[dict[str, Any]]:
    """The sample in ``GW_NS`` at a fixed count, with the gateway on (one replica, leastWait)."""
    docs = in_namespace(fixed_replicas([d for d in yaml.safe_load_all(SAMPLE.read_text()) if d], replicas), GW_NS)
    for d in docs:
        if d.get("kind") == "InferenceService":
            d["spec"]["gateway"] = {"enabled": True, "replicas": 1, "routing": "leastWait"}
    return docs


def test_gateway_holds_tenant_quotas_service_wide(sandbox: Layout) -> None:
    """Issue 19 §4, quotas at the edge: the sample with the gateway at 2 replicas (the pods each
    enforce the whole quota by themselves: no quota coordinator in this sandbox, so the service-wide
    bound is the gateway's alone). For ``QUOTA_SECONDS`` = 40 s, through the gateway Service's
    ClusterIP: ``reports`` offers 60/s, 3x its 20/s quota (Poisson, 8 keep-alive clients x 1
    connection); ``alerts`` offers 10/s, 0.5x its quota, in clumps of 6 requests at once (inside its
    burst of 40 and its ``maxConcurrent`` 8) every 1.2 s from each of two patterns, half a period
    apart: 8 keep-alive clients x 1 connection, and a pool that opens a connection whenever none is
    idle (each clump's requests on as many connections).

    The measure: the load generator's own count of ``reports``' 2xx answers to the requests it
    scheduled in the run (every request answered before the run ends: nothing in flight is dropped),
    over ``D``, the span from its first to its last scheduled request. Asserted: ``ok <= 1.05 x QUOTA
    x D`` (the bucket allows ``QUOTA x D + BURST`` at most: 1.025x over 40 s, so 1.05 leaves the
    answers' timing jitter and nothing more), ``ok >= 0.8 x QUOTA x D`` (the quota is served, not
    starved), and every ``alerts`` request answered 2xx in both patterns.
    """
    layout = sandbox
    kube = Kube.as_identity(layout, "admin")
    docs = gateway_docs(2)
    for d in docs:
        kube.apply(d)
    keys = {s["metadata"]["name"]: s["stringData"]["key"] for s in docs if s["kind"] == "Secret"}
    gw_name = f"{NAME}-gateway"
    watcher = EndpointWatcher(kube, GW_NS, NAME)
    wait_for(lambda: len(watcher.poll()) == 2, 120, f"2 ready endpoints of {GW_NS}/{NAME}",
             lambda: summary(kube, GW_NS))
    gw_selector = "app.kubernetes.io/name=sluiceway-gateway"
    (gw_pod,) = wait_for(lambda: [p for p in pods(kube, GW_NS, gw_selector) if is_ready(p)], 90,
                         f"a Ready pod of Deployment {gw_name}", lambda: summary(kube, GW_NS))
    gw_ip = gw_pod["status"]["podIP"]
    wait_for(lambda: gateway_endpoints(gw_ip).get("routable") == 2, 60, "the gateway routing to 2 pods",
             lambda: str(gateway_endpoints(gw_ip)))
    gw_watcher = EndpointWatcher(kube, GW_NS, gw_name)
    wait_for(gw_watcher.poll, 60, f"a ready endpoint of Service {gw_name}", lambda: summary(kube, GW_NS))
    service = service_address(kube, GW_NS, gw_name)
    path = f"/v2/models/{NAME}/infer"
    heavy = Client("reports", keys["reports-key"], "batch", 3 * QUOTA)
    light = Client("alerts", keys["alerts-key"], "critical", 0.5 * QUOTA)
    heavy_schedule = build_schedule([Phase("3x", QUOTA_SECONDS, 3 * QUOTA)], [heavy], seed=23)
    clumps = [i * CLUMP_EVERY for i in range(int(QUOTA_SECONDS / CLUMP_EVERY))]
    light_keepalive = [(t + 0.001 * k, 0) for t in clumps for k in range(CLUMP)]
    light_pooled = [(t + CLUMP_EVERY / 2 + 0.001 * k, 0) for t in clumps for k in range(CLUMP)]
    runs = [
        run_load_in_thread(heavy_schedule, [heavy], path, service=service, keepalive=CLIENTS),
        run_load_in_thread(light_keepalive, [light], path, service=service, keepalive=CLIENTS),
        run_load_in_thread(light_pooled, [light], path, per_request=lambda: [service]),
    ]
    try:
        for thread, _outcomes, _stop in runs:
            thread.join(timeout=QUOTA_SECONDS + 30)
            assert not thread.is_alive(), "a load generator did not finish in time"
    finally:
        for thread, _outcomes, stop in runs:
            stop.set()
            thread.join(timeout=30)
    (heavy_out, keep_out, pooled_out) = [list(outcomes) for _t, outcomes, _s in runs]
    span = heavy_schedule[-1][0] - heavy_schedule[0][0]
    ok = sum(1 for o in heavy_out if 200 <= o.status < 300)
    refused: dict[str, int] = {}
    for o in heavy_out:
        if not 200 <= o.status < 300:
            refused[f"{o.status} {o.reason}"] = refused.get(f"{o.status} {o.reason}", 0) + 1
    light_bad = [(round(o.t, 2), o.status, o.reason) for o in keep_out + pooled_out if not 200 <= o.status < 300]
    print(f"\nquotas through the gateway ({service}, 2 pods): reports (offers 3x) {len(heavy_out)} sent, {ok} ok in "
          f"{span:.1f} s = {ok / (QUOTA * span):.3f}x its quota "
          f"(bucket bound {(QUOTA * span + BURST) / (QUOTA * span):.3f}x), "
          f"refused {refused}; alerts (offers 0.5x in clumps of {CLUMP}): {len(keep_out)} over keep-alive clients, "
          f"{len(pooled_out)} over pooled connections, refused: {light_bad}")
    assert len(heavy_out) == len(heavy_schedule) and len(keep_out) == len(light_keepalive), "requests lost"
    assert len(pooled_out) == len(light_pooled), "requests lost"
    assert ok <= 1.05 * QUOTA * span, (ok, QUOTA * span)
    assert ok >= 0.8 * QUOTA * span, (ok, QUOTA * span, refused)
    assert not light_bad, light_bad
