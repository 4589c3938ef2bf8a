"""Pure status computation: conditions, reasons, transition times."""

from __future__ import annotations

from typing import Any

from sluiceway_operator.status import Observed, compute_status, format_wait


def _obs(**kw: Any) -> Observed:
    base: dict[str, Any] = dict(
        generation=3,
        endpoint="http://a.n.svc:8080",
        engine="none",
        spec_replicas=1,
        spec_permits="auto",
        config_hash="abc",
    )
    base.update(kw)
    return Observed(**base)


def _conds(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


AVAILABLE_DEP = {
    "spec": {"replicas": 2},
    "status": {
        "replicas": 2,
        "readyReplicas": 2,
        "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}],
    },
}


def test_all_good_is_ready() -> None:
    st = compute_status(_obs(deployment=AVAILABLE_DEP), None, "T0")
    assert _conds(st) == {
        "Ready": ("True", "Ready"),
        "ConfigValid": ("True", "ConfigRendered"),
        "Available": ("True", "MinimumReplicasAvailable"),
        "AutoscalingReady": ("True", "AutoscalingDisabled"),
        "MetricsAvailable": ("Unknown", "PrometheusNotConfigured"),  # not part of Ready
    }
    assert (st["observedGeneration"], st["replicas"], st["readyReplicas"]) == (3, 2, 2)
    assert st["queueDepth"] is None and st["waitP95"] is None  # merge patch removes stale values


def test_config_error_makes_ready_false_with_its_reason() -> None:
    st = compute_status(
        _obs(config_error=("SecretNotFound", "tenant a: Secret n/s does not exist")), None, "T0"
    )
    c = _conds(st)
    assert c["ConfigValid"] == ("False", "SecretNotFound")
    assert c["Ready"] == ("False", "SecretNotFound")


def test_keda_missing() -> None:
    st = compute_status(_obs(engine="keda", deployment=AVAILABLE_DEP, keda_installed=False), None, "T0")
    assert _conds(st)["AutoscalingReady"] == ("False", "KedaNotInstalled")
    assert _conds(st)["Ready"] == ("False", "KedaNotInstalled")


def test_scaled_object_ready_is_mirrored() -> None:
    so = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "ScaledObjectReady"}]}}
    st = compute_status(
        _obs(engine="keda", deployment=AVAILABLE_DEP, keda_installed=True, scaled_object=so), None, "T"
    )
    assert _conds(st)["AutoscalingReady"] == ("True", "ScaledObjectReady")
    assert _conds(st)["Ready"][0] == "True"


def test_transition_time_kept_until_status_changes() -> None:
    first = compute_status(_obs(deployment=AVAILABLE_DEP), None, "T0")
    second = compute_status(_obs(deployment=AVAILABLE_DEP), first["conditions"], "T1")
    assert {c["lastTransitionTime"] for c in second["conditions"]} == {"T0"}
    third = compute_status(
        _obs(config_error=("InvalidSpec", "x"), deployment=AVAILABLE_DEP), second["conditions"], "T2"
    )
    times = {c["type"]: c["lastTransitionTime"] for c in third["conditions"]}
    assert times == {
        "Ready": "T2",
        "ConfigValid": "T2",
        "Available": "T0",
        "AutoscalingReady": "T0",
        "MetricsAvailable": "T0",
    }


def test_prometheus_readings() -> None:
    st = compute_status(_obs(queue_depth=12.4, wait_p95=0.1234, live_permits=3.0), None, "T")
    assert (st["queueDepth"], st["waitP95"], st["concurrency"]) == (12, "123ms", "3")
    assert format_wait(2.5) == "2.5s"


def test_builtin_signal_loss_is_reported() -> None:
    st = compute_status(
        _obs(engine="builtin", prometheus_configured=True, prometheus_error="timeout"), None, "T"
    )
    assert _conds(st)["AutoscalingReady"] == ("False", "SignalsUnavailable")


def test_memory_bound_and_chosen_permits_are_published_separately() -> None:
    st = compute_status(_obs(deployment=AVAILABLE_DEP, live_permits=3.0, memory_bound_permits=5.0), None, "T0")
    assert (st["concurrency"], st["concurrencyMemoryBound"]) == ("3", "5")
    assert "concurrencyMemoryBound" not in compute_status(_obs(deployment=AVAILABLE_DEP), None, "T0")


def test_builtin_engine_waits_for_its_first_signals_read() -> None:
    st = compute_status(
        _obs(engine="builtin", deployment=AVAILABLE_DEP, prometheus_configured=True, signals_read=False), None, "T0"
    )
    assert _conds(st)["AutoscalingReady"] == ("Unknown", "SignalsPending")
    assert _conds(st)["Ready"] == ("True", "Ready")  # an unknown autoscaler does not block Ready


def test_the_crd_status_schema_has_every_field_the_operator_writes() -> None:
    from operator_support import load_crd

    props = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    st = compute_status(
        _obs(deployment=AVAILABLE_DEP, live_permits=3.0, memory_bound_permits=5.0, queue_depth=1.0, wait_p95=0.2),
        None,
        "T0",
    )
    assert set(st) <= set(props), set(st) - set(props)


def test_metrics_available_turns_false_after_two_minutes_with_ready_pods() -> None:
    """Issue 23: no series for METRICS_MISSING_SECONDS while pods are ready -> False with a reason
    that asks whether the service is scraped; Ready does not depend on it (the real Prometheus:
    test_operator_metrics_available.py)."""
    base = {"deployment": AVAILABLE_DEP, "prometheus_configured": True, "series_found": False}
    pending = _conds(compute_status(_obs(**base, series_missing_seconds=119.0), None, "T"))
    assert pending["MetricsAvailable"] == ("Unknown", "SeriesPending")
    st = compute_status(_obs(**base, series_missing_seconds=120.0), None, "T")
    assert _conds(st)["MetricsAvailable"] == ("False", "NoMetricsSeries")
    assert _conds(st)["Ready"] == ("True", "Ready")
    msg = next(c["message"] for c in st["conditions"] if c["type"] == "MetricsAvailable")
    assert msg.startswith("no series for this InferenceService in Prometheus for 2 minutes: is it scraped?")
    found = compute_status(_obs(**{**base, "series_found": True}), None, "T")
    assert _conds(found)["MetricsAvailable"] == ("True", "MetricsSeriesFound")
    unread = compute_status(_obs(**{**base, "series_found": None}, prometheus_error="timeout"), None, "T")
    assert _conds(unread)["MetricsAvailable"] == ("Unknown", "PrometheusUnavailable")


# -- ModelFetched (issue 22 §1): the storage initializer's terminated state ----------------------------


def _pod(name: str, state: dict[str, Any], last: dict[str, Any] | None = None) -> dict[str, Any]:
    status = {"name": "storage-initializer", "state": state, "lastState": last or {}}
    return {"metadata": {"name": name}, "status": {"initContainerStatuses": [status]}}


FETCH_LINE = (
    "sluiceway-pod fetch: failed (access-denied): s3://models/scorer/v3/model.onnx: AccessDenied: "
    "The AWS Access Key Id you provided does not exist in our records."
)


def test_model_fetch_failure_is_reported_with_its_reason_and_no_secret() -> None:
    """The last line of the termination message the fetch CLI wrote, its reason in the message; URL
    user info and query strings never reach the status (the fetch scrubs them; so does this)."""
    message = (
        "fetch: model.onnx: 1.0 / 4.0 MiB (25%) 1.0 MiB/s\n"
        "sluiceway-pod fetch: failed (store-unreachable): https://admin:hunter2@store.example/m.onnx"
        "?X-Amz-Signature=deadbeef: connection refused\n"
    )
    failing = _pod("scorer-7d9-abc", {"waiting": {"reason": "CrashLoopBackOff"}},
                   {"terminated": {"exitCode": 14, "reason": "Error", "message": message}})
    st = compute_status(_obs(model_fetch=True, pods=[failing], deployment=AVAILABLE_DEP), None, "T0")
    cond = next(c for c in st["conditions"] if c["type"] == "ModelFetched")
    assert (cond["status"], cond["reason"]) == ("False", "ModelFetchFailed")
    assert cond["message"] == (
        "pod scorer-7d9-abc: storage initializer failed (store-unreachable), exit 14: sluiceway-pod fetch: failed "
        "(store-unreachable): https://store.example/m.onnx: connection refused"
    )
    assert "hunter2" not in str(st) and "deadbeef" not in str(st)
    assert _conds(st)["Ready"] == ("False", "ModelFetchFailed")


def test_model_fetched_true_pending_and_absent() -> None:
    done = _pod("a", {"terminated": {"exitCode": 0, "reason": "Completed"}})
    running = _pod("b", {"running": {}})
    failed_then_done = _pod("c", {"terminated": {"exitCode": 0}}, {"terminated": {"exitCode": 11}})
    st = compute_status(_obs(model_fetch=True, pods=[done, failed_then_done], deployment=AVAILABLE_DEP), None, "T0")
    assert _conds(st)["ModelFetched"] == ("True", "ModelFetched")
    assert _conds(st)["Ready"] == ("True", "Ready")
    st = compute_status(_obs(model_fetch=True, pods=[done, running]), None, "T0")
    assert _conds(st)["ModelFetched"] == ("Unknown", "FetchPending")
    failing = _pod("d", {"terminated": {"exitCode": 11, "message": FETCH_LINE}})
    st = compute_status(_obs(model_fetch=True, pods=[done, failing, failing]), None, "T0")
    cond = next(c for c in st["conditions"] if c["type"] == "ModelFetched")
    assert "(access-denied), exit 11" in cond["message"] and cond["message"].endswith("(2 pods failing)")
    assert "ModelFetched" not in _conds(compute_status(_obs(), None, "T0"))  # no storageUri: no condition


def test_http_route_condition_only_when_asked_and_why_not() -> None:
    """``HTTPRouteReady`` (issue 19 §3): absent without ``gateway.httpRoute.parentRefs``; False with
    the reason when the Gateway API CRD is missing (and Ready says so: the route was asked for);
    True once applied; Unknown while the spec is not applied."""
    assert "HTTPRouteReady" not in _conds(compute_status(_obs(deployment=AVAILABLE_DEP), None, "T0"))
    missing = compute_status(_obs(deployment=AVAILABLE_DEP, route_parents=2, route_crd=False), None, "T0")
    assert _conds(missing)["HTTPRouteReady"] == ("False", "GatewayAPINotInstalled")
    cond = next(c for c in missing["conditions"] if c["type"] == "HTTPRouteReady")
    assert "httproutes.gateway.networking.k8s.io is not installed" in cond["message"]
    assert _conds(missing)["Ready"] == ("False", "GatewayAPINotInstalled")
    applied = compute_status(_obs(deployment=AVAILABLE_DEP, route_parents=2, route_crd=True), None, "T1")
    assert _conds(applied)["HTTPRouteReady"] == ("True", "HTTPRouteApplied")
    assert _conds(applied)["Ready"] == ("True", "Ready")
    bad = compute_status(_obs(route_parents=1, route_crd=True, config_error=("InvalidSpec", "x")), None, "T2")
    assert _conds(bad)["HTTPRouteReady"] == ("Unknown", "SpecNotApplied")
