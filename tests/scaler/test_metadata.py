"""Trigger metadata parsing: every bad key is named in the error."""

from __future__ import annotations

import pytest
from sluiceway_core.units import parse_seconds
from sluiceway_scaler.errors import InvalidMetadata
from sluiceway_scaler.metadata import parse_metadata

GOOD = {
    "inferenceService": "demo",
    "prometheusAddress": "http://prometheus.monitoring:9090",
    "targetQueueDepthPerReplica": "4",
    "targetWaitP95": "500ms",
}


def test_good_metadata_and_defaults() -> None:
    cfg = parse_metadata(GOOD, "team-a")
    assert cfg.namespace == "team-a"
    assert cfg.inference_service == "demo"
    assert cfg.spec.target_queue_per_replica == 4
    assert cfg.spec.target_wait_p95 == 0.5
    assert (cfg.spec.min_replicas, cfg.spec.max_replicas) == (1, 100)
    assert cfg.spec.scale_down.stabilization_window == 90
    assert cfg.spec.scale_down.release_window == 1200  # the policy's default
    assert cfg.rate_window == "1m"
    assert cfg.pod_metrics_urls == ()
    assert cfg.metric_name == "sluiceway-replicas-team-a-demo"


def test_overrides() -> None:
    cfg = parse_metadata(
        GOOD
        | {
            "namespace": "team-a",  # the ScaledObject's own, spelled out (another one is refused)
            "minReplicas": "0",
            "maxReplicas": "7",
            "scaleDownWindowSeconds": "5",
            "scaleDownMaxPods": "2",
            "scaleDownMaxPercent": "2.5",
            "scaleUpMaxPercent": "50",
            "rateWindow": "5s",
            "queryTimeout": "1s",
            "podMetricsUrls": "http://127.0.0.1:1/metrics, http://127.0.0.1:2/metrics",
            "activationPollInterval": "200ms",
            "scalerAddress": "scaler:9090",
        },
        "team-a",
    )
    assert cfg.namespace == "team-a"
    assert cfg.spec.min_replicas == 0 and cfg.spec.max_replicas == 7
    assert cfg.spec.scale_down.stabilization_window == 5 and cfg.spec.scale_down.max_pods == 2
    assert cfg.spec.scale_down.max_percent == 2.5
    assert cfg.spec.scale_up.max_percent == 50
    assert cfg.pod_metrics_urls == ("http://127.0.0.1:1/metrics", "http://127.0.0.1:2/metrics")
    assert cfg.activation_poll_interval == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("2s", 2), ("1.5m", 90), ("1h", 3600), ("1m30s", 90), ("3", 3)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("change", "ns", "field"),
    [
        ({"inferenceService": None}, "a", "inferenceService"),
        ({"inferenceService": "Bad_Name"}, "a", "inferenceService"),
        ({}, "", "namespace"),
        ({"prometheusAddress": None}, "a", "prometheusAddress"),
        ({"prometheusAddress": "prometheus:9090"}, "a", "prometheusAddress"),
        ({"targetQueueDepthPerReplica": None, "targetWaitP95": None}, "a", "targetQueueDepthPerReplica"),
        ({"targetQueueDepthPerReplica": "four"}, "a", "targetQueueDepthPerReplica"),
        ({"targetQueueDepthPerReplica": "0"}, "a", "targetQueueDepthPerReplica"),
        ({"targetQueueDepthPerReplica": "nan"}, "a", "targetQueueDepthPerReplica"),
        ({"targetWaitP95": "soon"}, "a", "targetWaitP95"),
        ({"targetWaitP95Seconds": "2"}, "a", "targetWaitP95Seconds"),  # disagrees with 500ms
        ({"minReplicas": "-1"}, "a", "minReplicas"),
        ({"minReplicas": "5", "maxReplicas": "2"}, "a", "maxReplicas"),
        ({"scaleDownWindowSeconds": "7200"}, "a", "scaleDownWindowSeconds"),
        ({"scaleDownMaxPercent": "0"}, "a", "scaleDownMaxPercent"),
        ({"scaleDownMaxPercent": "150"}, "a", "scaleDownMaxPercent"),
        ({"scaleDownReleaseWindowSeconds": "-1"}, "a", "scaleDownReleaseWindowSeconds"),
        ({"scaleDownReleaseWindowSeconds": "soon"}, "a", "scaleDownReleaseWindowSeconds"),
        ({"scaleDownReleaseWindowSeconds": "90000"}, "a", "scaleDownReleaseWindowSeconds"),
        # not longer than the stabilisation window (90 s by default): the policy would ignore it
        ({"scaleDownReleaseWindowSeconds": "90"}, "a", "scaleDownReleaseWindowSeconds"),
        (
            {"scaleDownWindowSeconds": "600", "scaleDownReleaseWindowSeconds": "400"},
            "a",
            "scaleDownReleaseWindowSeconds",
        ),
        ({"rateWindow": "1 minute"}, "a", "rateWindow"),
        ({"podMetricsUrls": "ftp://x/metrics"}, "a", "podMetricsUrls"),
        ({"targetQueueDepth": "4"}, "a", "targetQueueDepth"),  # typo: unknown key
    ],
)
def test_bad_metadata_names_the_key(change: dict[str, str | None], ns: str, field: str) -> None:
    md = {k: v for k, v in (GOOD | change).items() if v is not None}
    with pytest.raises(InvalidMetadata) as e:
        parse_metadata(md, ns)
    assert e.value.field == field
    assert f"scalerMetadata.{field}" in str(e.value)


def test_operator_rendered_metadata_is_accepted() -> None:
    # The keys operator/sluiceway_operator/render.py puts on the external trigger.
    md = {
        "scalerAddress": "sluiceway-scaler.sluiceway-system:9090",
        "namespace": "team-a",
        "inferenceService": "demo",
        "targetQueueDepthPerReplica": "4",
        "targetWaitP95Seconds": "0.5",
        "minReplicas": "1",
        "maxReplicas": "8",
        "scaleUpMaxPods": "4",
        "scaleUpMaxPercent": "100",
        "scaleDownWindowSeconds": "300",
        "scaleDownMaxPods": "1",
        "scaleDownPeriodSeconds": "60",
        "scaleDownReleaseWindowSeconds": "1800",
        "prometheusAddress": "http://prometheus.monitoring:9090",
    }
    cfg = parse_metadata(md, "team-a")
    assert cfg.spec.target_wait_p95 == 0.5
    assert cfg.spec.scale_up.max_pods == 4 and cfg.spec.scale_up.max_percent == 100
    assert cfg.spec.scale_down.stabilization_window == 300 and cfg.spec.scale_down.max_pods == 1
    assert cfg.spec.scale_down.release_window == 1800


@pytest.mark.parametrize(("text", "seconds"), [("0", None), ("1200", 1200.0), ("301", 301.0), ("30m", 1800.0)])
def test_release_window(text: str, seconds: float | None) -> None:
    """``scaleDownReleaseWindowSeconds``: 0 turns the release off; otherwise it must outlast the
    window (checked above) and reaches the policy the scaler calls."""
    cfg = parse_metadata(GOOD | {"scaleDownReleaseWindowSeconds": text}, "a")
    assert cfg.spec.scale_down.release_window == seconds


@pytest.mark.parametrize("ref_ns", ["", "  "])
def test_a_ref_without_namespace_is_refused(ref_ns: str) -> None:
    with pytest.raises(InvalidMetadata) as e:
        parse_metadata(GOOD | {"namespace": "team-a"}, ref_ns)
    assert e.value.field == "namespace"


def test_another_namespace_is_refused() -> None:
    """Issue 18 item 11: the namespace key may only repeat the ScaledObject's own namespace."""
    from sluiceway_scaler.errors import NamespaceNotAllowed, grpc_code

    with pytest.raises(NamespaceNotAllowed) as e:
        parse_metadata(GOOD | {"namespace": "team-b"}, "team-a")
    assert e.value.field == "namespace" and "team-b" in e.value.message and "team-a" in e.value.message
    assert grpc_code(e.value).name == "PERMISSION_DENIED"
