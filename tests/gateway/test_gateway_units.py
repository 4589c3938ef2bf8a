"""Fast unit tests of the gateway's pure parts: routing, the ledger, edge admission, EndpointSlices, config."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from sluiceway_core.config import PrioritiesConfig, TenantsConfig
from sluiceway_core.keys import hash_key, keys_text
from sluiceway_gateway.admission import EdgeAdmission
from sluiceway_gateway.config import GatewayConfigError, load_gateway_config
from sluiceway_gateway.errors import (
    BadRequest,
    PriorityForbidden,
    RateLimited,
    TenantQueueFull,
    Unauthenticated,
    http_status,
)
from sluiceway_gateway.kube import endpoints_from_slices
from sluiceway_gateway.ledger import PodLoad, apply_headers, observe_latency, predicted_wait_ms
from sluiceway_gateway.routing import EXACT_LIMIT, choose, refusal_reason, retryable


def pods(waits: list[float]) -> list[PodLoad]:
    out = []
    for i, w in enumerate(waits):
        p = PodLoad(f"p{i}")
        apply_headers(p, {"sluiceway-predicted-wait-ms": str(w), "sluiceway-permits": "0/4"}, 0.0)
        out.append(p)
    return out


def test_least_wait_is_exact_up_to_16_pods() -> None:
    rng = random.Random(1)
    for n in range(2, EXACT_LIMIT + 1):
        ps = pods([100.0 + i for i in range(n)])
        best = ps[n - 1]
        apply_headers(best, {"sluiceway-predicted-wait-ms": "3"}, 0.0)
        for _ in range(20):
            assert choose(ps, "leastWait", rng) is best


def test_least_wait_above_16_is_power_of_two() -> None:
    ps = pods([float(i) for i in range(40)])
    rng = random.Random(7)
    picks = [choose(ps, "leastWait", rng) for _ in range(2000)]
    # power of two choices: not always the global minimum, never the global maximum
    assert picks.count(ps[0]) < 1000
    assert ps[39] not in picks
    assert len({p.key for p in picks if p is not None}) > 20


def test_power_of_two_picks_the_lower_of_two_distinct_pods() -> None:
    ps = pods([5.0, 50.0])
    rng = random.Random(3)
    assert all(choose(ps, "powerOfTwo", rng) is ps[0] for _ in range(100))


def test_random_spreads() -> None:
    ps = pods([0.0] * 4)
    rng = random.Random(5)
    counts = {p.key: 0 for p in ps}
    for _ in range(4000):
        got = choose(ps, "random", rng)
        assert got is not None
        counts[got.key] += 1
    assert all(800 < c < 1200 for c in counts.values()), counts


@pytest.mark.parametrize("policy", ["leastWait", "powerOfTwo", "random"])
def test_never_a_draining_down_not_ready_or_excluded_pod(policy: str) -> None:
    ps = pods([0.0, 0.0, 0.0, 0.0, 1000.0])
    ps[0].draining = True
    ps[1].down = True
    ps[2].ready = False
    rng = random.Random(11)
    for _ in range(200):
        got = choose(ps, policy, rng, exclude={"p3"})  # type: ignore[arg-type]
        assert got is ps[4]
    assert choose(ps, policy, rng, exclude={"p3", "p4"}) is None  # type: ignore[arg-type]


def test_predicted_wait_counts_requests_sent_since_the_report() -> None:
    p = PodLoad("a")
    observe_latency(p, 40.0)
    apply_headers(p, {"sluiceway-predicted-wait-ms": "10", "sluiceway-permits": "2/4"}, 1.0)
    assert predicted_wait_ms(p) == pytest.approx(10.0)
    p.inflight += 2
    assert predicted_wait_ms(p) == pytest.approx(10.0 + 2 * 40.0 / 4)
    q = PodLoad("b")  # no headers at all: the gateway's own in-flight count
    observe_latency(q, 20.0)
    q.inflight = 3
    assert predicted_wait_ms(q) == pytest.approx(60.0)


def test_a_pod_reporting_a_full_queue_ranks_last() -> None:
    ps = pods([500.0, 5.0])
    apply_headers(ps[1], {"sluiceway-degradation": "2"}, 1.0)
    rng = random.Random(2)
    assert all(choose(ps, "leastWait", rng) is ps[0] for _ in range(50))
    apply_headers(ps[1], {"sluiceway-degradation": "0"}, 2.0)
    assert choose(ps, "leastWait", rng) is ps[1]


def test_malformed_load_headers_are_ignored() -> None:
    p = PodLoad("a")
    seen = apply_headers(p, {"sluiceway-queue-depth": "nan", "sluiceway-permits": "x/y",
                             "sluiceway-predicted-wait-ms": "-5", "sluiceway-draining": "maybe",
                             "sluiceway-degradation": "1e99"}, 2.0)
    assert not seen
    assert (p.queue_depth, p.permits_limit, p.reported_wait_ms, p.draining, p.degradation) == (None, None, None,
                                                                                                False, 0)
    assert p.heard_at == 2.0
    assert apply_headers(p, {"sluiceway-draining": "1", "sluiceway-queue-depth": "7"}, 3.0)
    assert p.draining and p.queue_depth == 7


def test_only_refusals_before_work_are_retryable() -> None:
    assert retryable(429, refusal_reason(b'{"error": "x", "reason": "queue_full"}'))
    assert retryable(503, "draining") and retryable(503, "not_ready")
    for status, reason in [(429, "rate_limited"), (429, "tenant_queue_full"), (503, "queue_timeout"),
                           (503, "oom"), (504, "exec_timeout"), (500, "model_error"), (503, None)]:
        assert not retryable(status, reason), (status, reason)
    assert refusal_reason(b"not json") is None and refusal_reason(b"[1]") is None


KEY_A, KEY_B = "key-a", "key-b"


def admission(tmp_path: Path, clock: list[float], **tenants: object) -> EdgeAdmission:
    keys = tmp_path / "keys"
    salt = bytes(range(32))
    keys.write_text(keys_text(salt, {"a": hash_key(KEY_A, salt), "b": hash_key(KEY_B, salt)}))
    cfg = TenantsConfig.model_validate({"keysFile": str(keys), "tenants": [
        {"name": "a", "rate": 2, "burst": 3, "maxPriority": "standard"},
        {"name": "b", "maxConcurrent": 1, "maxQueued": 1}], **tenants})
    return EdgeAdmission(cfg, PrioritiesConfig(), lambda: clock[0])


def test_edge_token_bucket_rate_and_burst(tmp_path: Path) -> None:
    clock = [0.0]
    adm = admission(tmp_path, clock)
    h = {"authorization": f"Bearer {KEY_A}"}
    for _ in range(3):
        adm.admit(h)
    with pytest.raises(RateLimited) as err:
        adm.admit(h)
    assert http_status(err.value) == 429 and err.value.retry_after_header() == "1"
    clock[0] = 0.5  # one token at 2/s
    adm.admit(h)
    with pytest.raises(RateLimited):
        adm.admit(h)


def test_edge_auth_priority_and_outstanding_cap(tmp_path: Path) -> None:
    adm = admission(tmp_path, [0.0])
    with pytest.raises(Unauthenticated):
        adm.admit({})
    with pytest.raises(Unauthenticated):
        adm.admit({"authorization": "Bearer nope"})
    with pytest.raises(Unauthenticated):
        adm.admit({"authorization": "Basic abc"})
    with pytest.raises(PriorityForbidden):
        adm.admit({"authorization": f"Bearer {KEY_A}", "x-sluiceway-priority": "critical"})
    with pytest.raises(BadRequest):
        adm.admit({"authorization": f"Bearer {KEY_A}", "x-sluiceway-priority": "urgent"})
    hb = {"authorization": f"Bearer {KEY_B}", "x-sluiceway-priority": "critical"}  # listed, no ceiling
    t1, t2 = adm.admit(hb), adm.admit(hb)
    with pytest.raises(TenantQueueFull):
        adm.admit(hb)
    EdgeAdmission.release(t1)
    t3 = adm.admit(hb)
    EdgeAdmission.release(t2)
    EdgeAdmission.release(t3)


def test_legacy_plain_sha256_keys_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# hand-written\n{hashlib.sha256(b'k').hexdigest().upper()} a\n")
    cfg = TenantsConfig.model_validate({"keysFile": str(keys), "tenants": [{"name": "a"}]})
    adm = EdgeAdmission(cfg, PrioritiesConfig(), lambda: 0.0)
    assert adm.admit({"authorization": "Bearer k"}).tenant.name == "a"
    with pytest.raises(Unauthenticated):
        adm.admit({"authorization": "Bearer x"})


def test_endpoints_from_slices_readiness_and_ports() -> None:
    slices = {
        "s1": {"ports": [{"name": "metrics", "port": 9091}, {"name": "http", "port": 8080}],
               "endpoints": [
                   {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                   {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
                   {"addresses": ["10.0.0.3"], "conditions": {"ready": True, "terminating": True}},
                   {"addresses": ["10.0.0.4"]},  # unknown readiness reads as ready
                   {"addresses": ["fd00::5"], "conditions": {}},
               ]},
        "s2": {"ports": [{"name": "http", "port": 99999}], "endpoints": [{"addresses": ["10.0.0.9"]}]},
        "s3": {"ports": None, "endpoints": None},
    }
    eps = endpoints_from_slices(slices, "http")
    assert [(e.key, e.ready) for e in eps] == [
        ("10.0.0.1:8080", True), ("10.0.0.2:8080", False), ("10.0.0.3:8080", False), ("10.0.0.4:8080", True),
        ("[fd00::5]:8080", True)]
    # not ready and not terminating: starting (the gateway predicts its ready time); terminating: going
    assert [e.key for e in eps if not e.ready and not e.terminating] == ["10.0.0.2:8080"]
    assert [e.key for e in eps if e.terminating] == ["10.0.0.3:8080"]


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "g.yaml"
    bad.write_text("endpoints: ['nohost']\nrouting: fastest\n")
    with pytest.raises(GatewayConfigError) as err:
        load_gateway_config(bad)
    assert "endpoints" in str(err.value) and "routing" in str(err.value)
    with pytest.raises(GatewayConfigError, match="no endpoints"):
        load_gateway_config(None)
    cfg = load_gateway_config(None, {"endpoints": ["127.0.0.1:1"], "routing": "random"})
    assert cfg.routing == "random"


def test_an_answer_does_not_count_itself_as_sent_since_the_report() -> None:
    """The routing benchmark found it: an answer's headers were read while the answered request still
    counted in ``inflight``, so the next request sent to that pod was taken as already known to the
    pod's report, and a pod busy with one request looked as free as an idle one."""
    busy, idle = PodLoad("busy"), PodLoad("idle")
    for p in (busy, idle):
        observe_latency(p, 27.0)
        p.permits_limit = 1
    # busy: one request in flight answered with "no wait" (its own answer), then counted down
    busy.inflight = 1
    apply_headers(busy, {"sluiceway-predicted-wait-ms": "0", "sluiceway-permits": "0/1"}, 1.0, answered=1)
    busy.inflight -= 1
    apply_headers(idle, {"sluiceway-predicted-wait-ms": "0", "sluiceway-permits": "0/1"}, 1.0)
    busy.inflight += 1  # a new request goes to busy
    assert predicted_wait_ms(busy) == pytest.approx(27.0)
    assert predicted_wait_ms(idle) == 0.0
    assert choose([busy, idle], "leastWait", random.Random(0)) is idle


def test_refusals_for_want_of_a_pod_exist_at_zero_for_the_scalers_increase() -> None:
    """The scaler wakes a service at zero on ``increase(sluiceway_gateway_refused_total{reason=~...})``;
    Prometheus's increase() cannot see the first refusal on a series born with it, so every reason the
    scaler counts exists at 0 from the start, the early 503 ``no_capacity_in_time`` included."""
    from prometheus_client import CollectorRegistry
    from sluiceway_core import metric_names as names
    from sluiceway_gateway.errors import NoCapacityInTime
    from sluiceway_gateway.metrics import GatewayMetrics

    assert NoCapacityInTime.reason in names.GATEWAY_WANT_OF_POD_REASONS
    reg = CollectorRegistry()
    GatewayMetrics(reg)
    for reason in names.GATEWAY_WANT_OF_POD_REASONS:
        assert reg.get_sample_value(names.GATEWAY_REFUSED, {"reason": reason}) == 0.0, reason
