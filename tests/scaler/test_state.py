"""Decision state keyed by the full trigger identity, pruned after an hour unseen (injected clock), and
one set of Prometheus queries answering both GetMetrics and the IsActive KEDA sends right after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakeprom import FakePrometheus
from scaler_support import FakeClock, Scaler, ref, start_scaler
from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler.service import SIGNAL_TTL


@pytest.fixture
def proms() -> Iterator[tuple[FakePrometheus, FakePrometheus]]:
    # 2 ready, none starting (``Queries.starting_pods`` first: the stand-in answers the first key found)
    real = FakePrometheus({"count((up{": 0, "sluiceway_queue_depth": 0, "up{": 2, "sluiceway_start_phase_seconds": 2})
    fake = FakePrometheus({"sluiceway_queue_depth": 400, "up{": 2})
    try:
        yield real, fake
    finally:
        real.close()
        fake.close()


def md(address: str, **extra: str) -> dict[str, str]:
    return {"inferenceService": "demo", "prometheusAddress": address, "targetQueueDepthPerReplica": "4",
            "minReplicas": "1", "maxReplicas": "50", "scaleDownWindowSeconds": "300", **extra}


def get(s: Scaler, metadata: dict[str, str]) -> int:
    name = f"s0-sluiceway-replicas-team-a-{metadata['inferenceService']}"
    req = pb.GetMetricsRequest(scaledObjectRef=ref(**metadata), metricName=name)
    (v,) = s.stub.GetMetrics(req, timeout=10).metricValues
    return int(v.metricValueFloat)


def test_a_fake_prometheus_cannot_pin_another_triggers_decision(
    proms: tuple[FakePrometheus, FakePrometheus],
) -> None:
    real, fake = proms
    clock = FakeClock()
    with start_scaler(prometheus=(real.url, fake.url), clock=clock) as s:
        real.values["sluiceway_queue_depth"] = 8
        assert get(s, md(real.url)) == 2
        clock.advance(400)
        real.values["sluiceway_queue_depth"] = 0
        # Same ScaledObject name and namespace, another address: it must not share the history ...
        assert get(s, md(fake.url)) == 50
        clock.advance(5)
        # ... so the real trigger, a window after its last high value, falls as it would alone.
        assert get(s, md(real.url)) == 1
        # A changed spec is a different trigger too.
        assert get(s, md(real.url, maxReplicas="40")) == 2  # fresh state: starts from the pods up
    assert real.requests > 0 and fake.requests > 0


def test_state_of_unseen_scaledobjects_is_pruned_after_an_hour(
    proms: tuple[FakePrometheus, FakePrometheus],
) -> None:
    real, other = proms
    clock = FakeClock()
    with start_scaler(prometheus=(real.url, other.url), clock=clock) as s:
        assert get(s, md(real.url)) == 2  # idle, 2 pods up: a new trigger starts from them
        assert get(s, md(other.url, inferenceService="other")) == 50
        assert s.service.tracked() == 2
        clock.advance(3000)
        get(s, md(real.url))  # seen again: survives the hour after its first call
        clock.advance(700)  # other: 3700 s unseen
        s.stub.IsActive(ref(**md(real.url)), timeout=10)
        assert s.service.tracked() == 1
        assert s.metrics.registry.get_sample_value("sluiceway_scaler_tracked_scaledobjects") == 1.0
        # "other" comes back with an empty queue. Had its entry survived, it would go on from its last
        # answer (50) and, its window long past, fall to 1; pruned, it starts afresh from the 2 pods up.
        other.values["sluiceway_queue_depth"] = 0
        assert get(s, md(other.url, inferenceService="other")) == 2
        assert s.service.tracked() == 2
        clock.advance(3601)
        get(s, md(other.url, inferenceService="other"))
        assert s.service.tracked() == 1  # now "real" is gone


def test_get_metrics_then_is_active_cost_one_set_of_queries(
    proms: tuple[FakePrometheus, FakePrometheus],
) -> None:
    real, _ = proms
    clock = FakeClock()
    real.values["sluiceway_queue_depth"] = 8
    with start_scaler(prometheus=(real.url,), clock=clock) as s:
        m = md(real.url)
        assert get(s, m) == 2
        per_set = real.requests  # the queries of one set of signals (queue depth, wait p95, rates, ...)
        assert per_set >= 5, real.queries
        assert s.stub.IsActive(ref(**m), timeout=10).result is True
        assert real.requests == per_set, real.queries[per_set:]  # IsActive queried nothing
        for poll in (2, 3):
            clock.advance(30)  # KEDA's default polling interval: the next poll reads again
            assert get(s, m) == 2
            assert s.stub.IsActive(ref(**m), timeout=10).result is True
            assert real.requests == poll * per_set, real.queries
        cache = s.metrics.registry.get_sample_value
        assert cache("sluiceway_scaler_signal_reads_total", {"source": "cache"}) == 3.0
        assert cache("sluiceway_scaler_signal_reads_total", {"source": "prometheus"}) == 3.0
        # The answers follow the data once the cache has expired.
        real.values["sluiceway_queue_depth"] = 0
        real.values["sluiceway_enqueued_total"] = 0
        assert s.stub.IsActive(ref(**m), timeout=10).result is True  # still the cached set
        clock.advance(SIGNAL_TTL)
        assert s.stub.IsActive(ref(**m), timeout=10).result is False
