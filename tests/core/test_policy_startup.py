"""The measured start-up in the policy (issue 20 "no over-scaling while the first pod loads", issue
22 §1 "the autoscaler uses these to predict when a new pod can serve"): pods still starting count as
capacity that arrives at their predicted ready time (asked for + ``Signals.startup_seconds``), and
the shortage terms do not ask for pods to drain a backlog that the pods serving and those on their
way drain before a pod asked for now could serve (``sluiceway_core.policy._arriving``)."""

from __future__ import annotations

from dataclasses import replace

from sluiceway_core.policy import HistoryEntry, ScaleHistory, ScaleUpPolicy, ScalingSpec, Signals, desired_replicas

SPEC = ScalingSpec(
    min_replicas=1, max_replicas=50, target_queue_per_replica=8.0, target_utilisation=0.8,
    scale_up=ScaleUpPolicy(max_pods=4, max_percent=100.0), count_starting=True,
)
NOW = 1000.0


def history(asked_at: float) -> ScaleHistory:
    """2 pods since t=0; 2 more asked for at ``asked_at`` (the current count is 4)."""
    return ScaleHistory((HistoryEntry(0.0, 2, 2), HistoryEntry(asked_at, 4, 4)))


# 2 pods ready of 4, 4 permits a pod at 0.2 s a request (20/s a pod: the 2 ready ones 40/s), 30/s
# offered: the ready pods carry the flow, and 120 queued (the backlog term asks 15)
BUSY = Signals(
    queue_depth=120.0, utilisation=0.75, offered_rate=30.0, completion_rate=30.0, request_cost=0.2, permits=4,
    ready_replicas=2, pods_ready=2, startup_seconds=300.0,
)


def test_a_backlog_the_starting_pods_drain_before_a_new_pod_could_serve_asks_for_no_more_pods() -> None:
    """Failed before: the backlog term asked past the 2 pods on their way (6: the step from the 2
    ready ones), although a pod asked for now serves 300 s from now and the backlog is gone long
    before (the ready pods alone drain 10/s more than arrives)."""
    d = desired_replicas(BUSY, SPEC, 4, history(900.0), NOW)
    assert d.replicas == 4, d.reason
    assert "capped at 4: 2 pods starting (2 within the 300s start-up) and 2 ready drain 120 queued" in d.reason
    # the rule before: no start-up measured (or the rule off), the backlog asks for more
    before = desired_replicas(replace(BUSY, startup_seconds=None), SPEC, 4, history(900.0), NOW)
    off = desired_replicas(BUSY, replace(SPEC, count_starting=False), 4, history(900.0), NOW)
    assert before.replicas == off.replicas == 6, (before.reason, off.reason)


def test_the_starting_pods_credit_counts_from_their_predicted_ready_time() -> None:
    """3000 queued at 31/s: the ready pods alone (40/s) leave 300 at the horizon (3000 + (31 - 40)
    x 300).
    Two pods asked 100 s ago and due 200 s from now drain 2 x 100 s x 20/s before a new pod could
    serve: no more pods. The same two asked 400 s ago are past their prediction (late, or failing):
    credited with nothing, the backlog asks for more."""
    heavy = replace(BUSY, queue_depth=3000.0, offered_rate=31.0, completion_rate=31.0)
    on_time = desired_replicas(heavy, SPEC, 4, history(900.0), NOW)
    late = desired_replicas(heavy, SPEC, 4, history(600.0), NOW)
    assert on_time.replicas == 4, on_time.reason
    assert late.replicas == 6, late.reason


def test_ready_pods_behind_the_flow_get_no_start_up_credit() -> None:
    """33/s offered to 2 ready pods that complete 40/s, over the 80 % target (32/s): a load that
    may keep rising, and a backlog that grows the later the starting pods come (their scheduling
    and image pull are not in the pods' own start phases): the rule does not apply."""
    behind = replace(BUSY, offered_rate=33.0, completion_rate=33.0)
    d = desired_replicas(behind, SPEC, 4, history(900.0), NOW)
    assert d.replicas == 6, d.reason
    assert "capped at 4" not in d.reason


def test_nothing_starting_or_nothing_measured_leaves_the_terms_as_they_were() -> None:
    all_ready = replace(BUSY, pods_ready=4)  # none starting: the backlog term, stepped from 2 ready
    d = desired_replicas(all_ready, SPEC, 4, history(900.0), NOW)
    assert d.replicas == 6 and "capped at 4" not in d.reason, d.reason
    for missing in ({"request_cost": None}, {"permits": None}, {"offered_rate": None}, {"startup_seconds": 0.0}):
        d = desired_replicas(replace(BUSY, **missing), SPEC, 4, history(900.0), NOW)
        assert d.replicas == 6, (missing, d.reason)
    # without pods_ready (not read) the ready count is sum(up == 1) (which counts warming pods)
    d = desired_replicas(replace(BUSY, pods_ready=None), SPEC, 4, history(900.0), NOW)
    assert d.replicas == 4, d.reason


def test_the_load_terms_are_not_capped() -> None:
    """The cap is on the shortage terms (backlog, wait, requests in the pods) only: a demand above
    the current count still asks for it."""
    demand = replace(BUSY, offered_rate=39.0, completion_rate=39.0, request_cost=0.2, permits=1,
                     queue_depth=0.0, utilisation=1.0)
    # 1 permit: 5/s a pod, 2 ready complete 10/s < 39/s: behind the flow, so also no credit
    d = desired_replicas(demand, SPEC, 4, history(900.0), NOW)
    assert d.replicas > 4, d.reason


def test_asked_times_follow_the_recorded_rises_and_falls() -> None:
    from sluiceway_core.policy import _asked_at

    h = ScaleHistory((HistoryEntry(0.0, 2, 2), HistoryEntry(10.0, 5, 5), HistoryEntry(20.0, 4, 4),
                      HistoryEntry(30.0, 6, 6)))
    assert _asked_at(h, 6, 40.0) == [0.0, 0.0, 10.0, 10.0, 30.0, 30.0]
    # a count above the history's (a restarted scaler): the extra pods count from its first entry
    assert _asked_at(ScaleHistory((HistoryEntry(5.0, 3, 3),)), 4, 9.0) == [5.0, 5.0, 5.0, 5.0]
    assert _asked_at(ScaleHistory(), 2, 9.0) == [9.0, 9.0]
    assert _asked_at(h, 0, 40.0) == []
