"""The scaling policy's terms that the simulator (bench/scalesim) led to: ready-based proportional
terms, the demand term, the backlog cap, the scale-up step while pods start, percent scale-down,
the predictive term and the release window. Each failed before its change."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sluiceway_core.policy import (
    HistoryEntry,
    ScaleDownPolicy,
    ScaleHistory,
    ScaleUpPolicy,
    ScalingSpec,
    Signals,
    desired_replicas,
)

SPEC = ScalingSpec(
    min_replicas=1,
    max_replicas=1000,
    target_queue_per_replica=8,
    target_wait_p95=2.0,
    target_utilisation=0.8,
    burst_utilisation=0.7,  # the burst headroom's tests turn it on (off by default since issue 21)
    scale_up=ScaleUpPolicy(max_pods=4, max_percent=100),
    scale_down=ScaleDownPolicy(stabilization_window=300, max_pods=1, period=60),
)


def decide(signals: Signals, current: int, spec: ScalingSpec = SPEC, history: ScaleHistory | None = None) -> int:
    return desired_replicas(signals, spec, current, history or ScaleHistory(), 1000.0).replicas


def test_proportional_terms_scale_the_ready_pods_not_the_pods_asked_for() -> None:
    """100 pods were asked for, 50 serve at 95 % busy: the measurement says 50 * 0.95 / 0.8 = 60,
    not 100 * 0.95 / 0.8 = 119 (which, poll after poll, compounded to max_replicas)."""
    busy = Signals(queue_depth=0, utilisation=0.95, ready_replicas=50)
    assert decide(busy, 100) == 99  # 60 < 100: a (rate-limited) scale-down, not a scale-up
    assert decide(Signals(queue_depth=0, utilisation=0.95), 100) == 119  # unknown ready: as before
    waiting = Signals(queue_depth=0, wait_p95=4.0, ready_replicas=50)
    assert decide(waiting, 100) == 100  # 50 * 4 / 2 = 100


def test_demand_term_sizes_for_the_offered_rate_while_requests_are_refused() -> None:
    # 10 pods of 4 permits at 0.2 s complete 200/s; 800/s are offered: 800 * 0.2 / (4 * 0.8) = 50
    sat = Signals(
        queue_depth=400, utilisation=1.0, offered_rate=800, completion_rate=200, request_cost=0.2, permits=4,
        ready_replicas=10,
    )
    spec = ScalingSpec(min_replicas=1, max_replicas=1000, target_queue_per_replica=8, target_utilisation=0.8)
    d = desired_replicas(sat, spec, 10, ScaleHistory(), 0.0)
    assert d.replicas == 50
    flooded = Signals(**{**sat.__dict__, "queue_depth": 4000})
    assert decide(flooded, 10, spec) == 50  # 4000 / 8 = 500 without the cap
    served = Signals(**{**sat.__dict__, "offered_rate": 200, "queue_depth": 4000})
    assert decide(served, 10, spec) == 500  # nothing refused: the demand term does not apply


def test_scale_up_steps_from_the_ready_pods_while_others_start() -> None:
    spec = ScalingSpec(
        min_replicas=1,
        max_replicas=1000,
        target_queue_per_replica=1,
        scale_up=ScaleUpPolicy(max_pods=4, max_percent=100),
    )
    assert decide(Signals(queue_depth=500, ready_replicas=20), 30, spec) == 40  # 2 x 20 ready
    assert decide(Signals(queue_depth=500, ready_replicas=10), 30, spec) == 30  # never below current
    assert decide(Signals(queue_depth=500), 30, spec) == 60  # unknown ready: 2 x current
    # the measured demand is exempt: 800/s x 0.2 s / (4 permits x 0.8) = 50 pods, asked at once
    demand = ScalingSpec(
        min_replicas=1,
        max_replicas=1000,
        target_queue_per_replica=8,
        target_utilisation=0.8,
        scale_up=ScaleUpPolicy(max_pods=4, max_percent=100),
    )
    flash = Signals(
        queue_depth=400, utilisation=1.0, offered_rate=800, completion_rate=100, request_cost=0.2, permits=4,
        ready_replicas=5,
    )
    assert decide(flash, 30, demand) == 50


@pytest.mark.parametrize(("percent", "expected"), [(None, 99), (10.0, 90), (0.5, 99)])
def test_scale_down_by_percent(percent: float | None, expected: int) -> None:
    spec = ScalingSpec(
        min_replicas=1,
        max_replicas=1000,
        target_queue_per_replica=8,
        scale_down=ScaleDownPolicy(stabilization_window=0, max_pods=1, period=60, max_percent=percent),
    )
    assert decide(Signals(queue_depth=0), 100, spec) == expected
    with pytest.raises(ValueError, match="max_percent"):
        ScaleDownPolicy(max_percent=0)
        ScalingSpec(min_replicas=1, max_replicas=2, target_queue_per_replica=1,
                    scale_down=ScaleDownPolicy(max_percent=0))


def test_predictive_term_only_when_asked_and_only_on_a_rising_rate() -> None:
    rising = Signals(
        queue_depth=0, utilisation=0.8, arrival_rate=100, offered_rate=100, offered_trend=1.0, ready_replicas=10
    )
    assert decide(rising, 10) == 10  # off by default
    spec = ScalingSpec(min_replicas=1, max_replicas=1000, target_queue_per_replica=8, target_utilisation=0.8,
                       predict_seconds=100)
    # 10 pods at 0.8 complete 100/s; in 100 s 200/s are expected: 10 * 0.8 * 200 / 100 / 0.8 = 20
    assert decide(rising, 10, spec) == 20
    falling = Signals(**{**rising.__dict__, "offered_trend": -1.0})
    assert decide(falling, 10, spec) == 10
    with pytest.raises(ValueError, match="predict_seconds"):
        ScalingSpec(min_replicas=1, max_replicas=2, target_queue_per_replica=1, predict_seconds=0)


# --- release window: a surplus that lasted the whole window is released, not paced at 2 %/min
RELEASE = ScalingSpec(
    min_replicas=1,
    max_replicas=2000,
    target_queue_per_replica=8,
    scale_down=ScaleDownPolicy(stabilization_window=300, max_pods=1, period=60, max_percent=2, release_window=1200),
)


def _history(now: float, since: float, recommendation: int, replicas: int) -> ScaleHistory:
    """One entry every 15 s from ``now - since`` up to ``now - 15``."""
    return ScaleHistory(
        tuple(HistoryEntry(now - a, recommendation, replicas) for a in range(int(since), 0, -15))
    )


def test_release_window_drops_a_surplus_that_lasted_the_whole_window() -> None:
    """After a flash crowd 1,000 pods serve a load that needs 100. At 2 % per minute the fleet took
    two hours to shrink (the simulator's flash tail); once every recommendation of the last 20 min
    is below the count, it goes to the highest of them at once."""
    quiet = Signals(queue_depth=0, ready_replicas=1000)  # backlog 0 -> 1 pod (min)
    history = _history(5000.0, 1260, 100, 1000)
    d = desired_replicas(quiet, RELEASE, 1000, history, 5000.0)
    assert d.replicas == 100
    assert "released to 100" in d.reason
    # the same without a release window: 2 % of 1,000 per minute
    paced = ScalingSpec(**{**RELEASE.__dict__, "scale_down": replace(RELEASE.scale_down, release_window=None)})
    assert desired_replicas(quiet, paced, 1000, history, 5000.0).replicas == 980


def test_release_goes_to_the_highest_recommendation_of_the_window_only() -> None:
    quiet = Signals(queue_depth=0, ready_replicas=1000)
    base = _history(5000.0, 1260, 100, 1000).entries
    with_500 = ScaleHistory(tuple(sorted((*base, HistoryEntry(4000.0, 500, 1000)), key=lambda e: e.at)))
    assert desired_replicas(quiet, RELEASE, 1000, with_500, 5000.0).replicas == 500
    # one recommendation of 1,000 inside the window (e.g. a decision held while Prometheus was
    # down records the current count): no release, the 2 % pace applies
    with_peak = ScaleHistory(tuple(sorted((*base, HistoryEntry(4000.0, 1000, 1000)), key=lambda e: e.at)))
    assert desired_replicas(quiet, RELEASE, 1000, with_peak, 5000.0).replicas == 980


def test_release_needs_a_history_as_long_as_the_window() -> None:
    """A restarted scaler knows 10 minutes: it must not read that as 20 quiet minutes."""
    quiet = Signals(queue_depth=0, ready_replicas=1000)
    assert desired_replicas(quiet, RELEASE, 1000, _history(5000.0, 600, 100, 1000), 5000.0).replicas == 980


def test_release_history_is_kept_long_enough_and_a_short_release_window_is_inert() -> None:
    quiet = Signals(queue_depth=0, ready_replicas=1000)
    history = ScaleHistory()
    replicas = 1000
    for i in range(90):  # 22.5 min of polls every 15 s
        d = desired_replicas(quiet, RELEASE, replicas, history, 15.0 * i)
        history, replicas = d.history, d.replicas
    assert history.entries[0].at <= 15.0 * 89 - 1200  # the history still spans the window
    assert replicas == 1  # released (min_replicas) once the history spanned 20 min
    # a release window not longer than the stabilisation window adds nothing (and is no error)
    inert = ScalingSpec(
        **{**RELEASE.__dict__, "scale_down": replace(RELEASE.scale_down, stabilization_window=1800)}
    )
    assert desired_replicas(quiet, inert, 1000, _history(5000.0, 2000, 100, 1000), 5000.0).replicas == 980
    with pytest.raises(ValueError, match="release_window"):
        ScalingSpec(min_replicas=1, max_replicas=2, target_queue_per_replica=1,
                    scale_down=ScaleDownPolicy(release_window=0))


# ------------------------------------------------------------------ issue 21: load that does not fade
DEMO = ScalingSpec(  # samples/sandbox-demo.yaml before issue 21: 20 s scale-down window, 2 permits
    min_replicas=1,
    max_replicas=4,
    target_queue_per_replica=4,
    target_wait_p95=0.5,
    target_utilisation=0.8,
    scale_up=ScaleUpPolicy(max_pods=4),
    scale_down=ScaleDownPolicy(stabilization_window=20, max_pods=4, period=5),
)


def test_steady_overload_keeps_the_count_once_the_queue_has_drained() -> None:
    """The demo's flap (issue 21): at 3x one replica's load, the queue and wait terms pushed the
    count to 4 and fade once 4 pods absorb the load; the 1-minute terms still mix in the earlier
    phases (utilisation 0.47 of 4 pods -> 3; offered 100/s over the minute -> 3). With a 20 s
    window the answer was 3. The demand term now applies without refusals and the requests in the
    pods (6 running, 1 queued: 7 / (2 x 0.8) -> 5, bounded to 4) read the load now: 4 holds."""
    history = ScaleHistory((HistoryEntry(940.0, 4, 4), HistoryEntry(970.0, 3, 4)))
    steady = Signals(
        queue_depth=1, wait_p95=0.05, utilisation=0.47, offered_rate=100.0, completion_rate=100.0,
        request_cost=0.05, permits=2, ready_replicas=4, requests_in_pods=7,
    )
    assert desired_replicas(steady, DEMO, 4, history, 1000.0).replicas == 4
    old = replace(DEMO, sustained_demand=False)
    assert desired_replicas(steady, old, 4, history, 1000.0).replicas == 3  # the flap, as before
    unknown = replace(steady, requests_in_pods=None)
    assert desired_replicas(unknown, DEMO, 4, history, 1000.0).replicas == 4  # demand alone: 100 x 0.05 / 1.6


def test_demand_applies_without_refusals_and_in_pods_reads_the_load_now() -> None:
    # 10 pods, 200/s offered and completed at 0.2 s: 200 * 0.2 / (4 * 0.8) = 12.5 -> 13. The
    # utilisation (0.5) averaged over a window in which half the scraped pods still warmed up.
    calm = Signals(
        queue_depth=0, utilisation=0.5, offered_rate=200, completion_rate=200, request_cost=0.2, permits=4,
        ready_replicas=10,
    )
    d = desired_replicas(calm, SPEC, 10, ScaleHistory(), 0.0)
    assert d.replicas == 13 and "demand" in d.reason
    # before: demand only while refused; the utilisation's 7 is a (paced) scale-down under full load
    assert decide(calm, 10, replace(SPEC, sustained_demand=False)) == 9
    busy = replace(calm, requests_in_pods=64.0)  # 64 / (4 x 0.8) = 20
    d = desired_replicas(busy, SPEC, 10, ScaleHistory(), 0.0)
    assert d.replicas == 20 and "requests in the pods" in d.reason


def test_requests_in_pods_are_exempt_from_the_ready_step_and_held_for_the_shortage_hold() -> None:
    """A flash crowd: 100 pods asked for, 10 serve with full queues (44 requests each). The requests
    in the pods ask for 440 / 3.2 = 138 at once (the ready-based step alone allowed 20). The history
    records that recommendation and the load terms' part apart (``load``: the utilisation's 13).
    The scale-down window holds the whole 138 for the shortage hold (90 s: a rate window and a
    scrape, long enough for the load terms to measure the load that raised it; issue 21), then only
    the load terms' part; the pace applies below it."""
    sat = Signals(queue_depth=400, utilisation=1.0, ready_replicas=10, permits=4, requests_in_pods=440.0)
    d = desired_replicas(sat, SPEC, 100, ScaleHistory(), 0.0)
    assert d.replicas == 138
    assert (d.history.entries[-1].recommendation, d.history.entries[-1].load) == (138, 13)
    calm = Signals(queue_depth=0, utilisation=0.34, ready_replicas=138, permits=4, requests_in_pods=190.0)
    # within the shortage hold: held
    assert desired_replicas(calm, SPEC, 138, d.history, 80.0).replicas == 138
    # after it the 138 pods serve what 60 need; paced at 1 pod per 60 s
    later = desired_replicas(calm, SPEC, 138, d.history, 200.0)
    assert later.replicas == 137, later.reason


def test_a_load_that_jumped_is_sized_with_burst_headroom_for_the_memory() -> None:
    """Issue 21, the stairs trace: after a step of the load (the recorded load recommendation 25 %
    above the lowest of the last 180 s), the load terms size for 70 % utilisation, not 80 %, for
    20 minutes: the next step finds room while its pods start (the KPA's 70 % target, only where
    the load has shown that it jumps). A smooth load keeps 80 %. Off unless asked for (the
    default since issue 21's last revision, docs/scalesim.md)."""
    assert ScalingSpec(min_replicas=1, max_replicas=2, target_queue_per_replica=8).burst_utilisation is None
    # 100 pods at 0.8 utilisation: the utilisation term asks for 100 (at 0.7: 115)
    steady = Signals(queue_depth=0, utilisation=0.8, ready_replicas=100)
    smooth = ScaleHistory(tuple(HistoryEntry(float(t), 95 + t // 60, 100) for t in range(0, 300, 15)))
    d = desired_replicas(steady, SPEC, 100, smooth, 300.0)
    assert d.replicas == 100 and d.history.jumped_at is None
    # a step: 80 -> 100 within 180 s is a jump (25 %); recorded now
    stepped = ScaleHistory(tuple(HistoryEntry(float(t), 80, 80) for t in range(0, 300, 15)))
    d = desired_replicas(steady, SPEC, 100, stepped, 300.0)
    assert d.replicas == 100 and d.history.jumped_at == 300.0  # sized at 0.8 this time
    d2 = desired_replicas(steady, SPEC, 100, d.history, 315.0)
    assert d2.replicas == 115, d2.reason  # 100 x 0.8 / 0.7 = 114.3 -> 115
    assert "sized for 0.70 utilisation" in d2.reason
    # the memory: 20 minutes after the jump the headroom goes (paced down as any drop)
    late = ScaleHistory(d2.history.entries[-1:], jumped_at=300.0)
    assert desired_replicas(steady, SPEC, 100, late, 300.0 + 1201).replicas == 100
    # off, or 1 -> 2 pods at a trickle: no jump
    off = replace(SPEC, burst_utilisation=None)
    assert desired_replicas(steady, off, 100, stepped, 300.0).history.jumped_at is None
    trickle = Signals(queue_depth=0, utilisation=0.8, ready_replicas=2)
    ones = ScaleHistory(tuple(HistoryEntry(float(t), 1, 2) for t in range(0, 300, 15)))
    assert desired_replicas(trickle, SPEC, 2, ones, 300.0).history.jumped_at is None
    with pytest.raises(ValueError, match="burst_utilisation"):
        replace(SPEC, burst_utilisation=1.5)


def test_a_count_raised_by_a_shortage_is_held_by_the_scale_down_window() -> None:
    """The sandbox e2e's flap after 3b75ed8 (desired/ready (3.4, 4, 1), (8.7, 2, 1), (11.9, 2, 2),
    (13.9, 4, 2)): the backlog lifted the count from 1 to 4; 5 s later, the queue drained into the
    one ready pod while the three new ones were still starting, every term read 2, and the count
    fell to 2 (killing pods that were starting) because the history held only the load terms. The
    scale-down window holds every recommendation, as the HPA's stabilisation does."""
    demo = replace(DEMO, scale_down=ScaleDownPolicy(stabilization_window=75, max_pods=4, period=5))
    queued = Signals(  # one pod, 2 running + 16 queued: backlog 16 / 4 -> 4 (in the pods: 18 / 1.6 -> 12)
        queue_depth=16, wait_p95=0.4, utilisation=1.0, offered_rate=40.0, completion_rate=40.0,
        request_cost=0.05, permits=2, ready_replicas=1, requests_in_pods=18.0,
    )
    d1 = desired_replicas(queued, demo, 1, ScaleHistory(), 3.4)
    assert d1.replicas == 4, d1.reason
    # the queue has drained, the new pods still start: every term reads 2 (utilisation 0.9 of the
    # one ready pod -> 2; 3 requests in the pods / 1.6 -> 2; backlog 1 / 4 -> 1; demand 1)
    drained = replace(queued, queue_depth=1, wait_p95=0.1, utilisation=0.9, offered_rate=30.0,
                      completion_rate=30.0, requests_in_pods=3.0)
    d2 = desired_replicas(drained, demo, 4, d1.history, 8.7)
    assert d2.replicas == 4, d2.reason
    d3 = desired_replicas(replace(drained, ready_replicas=2, utilisation=0.45), demo, 4, d2.history, 70.0)
    assert d3.replicas == 4, d3.reason
    # once the window has passed the raised recommendation, the count follows the load down
    d4 = desired_replicas(replace(drained, ready_replicas=4, utilisation=0.25), demo, 4, d3.history, 80.0)
    assert d4.replicas == 2, d4.reason


def test_a_count_raised_by_a_shortage_is_held_for_the_shortage_hold_not_the_whole_window() -> None:
    """Issue 21 (flash, stairs, bursty): saturated pods hold full queues, so the requests in the
    pods ask for 13.75x the pods that serve (44 / 3.2) whatever the demand. Held by the whole
    300 s window, then paced at 2 % a minute, that over-ask cost ours 1337.8 GPU-hours on short
    flash against the KPA's 774.4 (which drops it a 60 s window after its panic ends). The
    shortage's part is now held for ``shortage_hold`` (90 s); the load terms (here the demand:
    1,000/s x 0.2 s / 3.2 = 63) carry the count after it, held by the window as before."""
    # no scale-up step, no pace: the holds alone
    spec = replace(SPEC, scale_up=ScaleUpPolicy(), scale_down=ScaleDownPolicy(stabilization_window=300, period=60))
    sat = Signals(
        queue_depth=4000, utilisation=1.0, offered_rate=1000.0, completion_rate=200.0, request_cost=0.2,
        permits=4, ready_replicas=50, requests_in_pods=2200.0,
    )
    d = desired_replicas(sat, spec, 50, ScaleHistory(), 0.0)
    assert d.replicas == 688 and d.history.entries[-1].load == 63, d.reason  # 2200 / 3.2
    served = replace(sat, queue_depth=0, utilisation=0.07, completion_rate=1000.0, ready_replicas=688,
                     requests_in_pods=210.0)
    held = desired_replicas(served, spec, 688, d.history, 60.0)
    assert held.replicas == 688, held.reason
    carried = desired_replicas(served, spec, 688, held.history, 120.0)
    assert carried.replicas == 66, carried.reason  # 210 in the pods / 3.2; demand 63; utilisation 61
    # the rule before: the whole recommendation held by the window
    before = replace(spec, shortage_hold=None)
    assert desired_replicas(served, before, 688, held.history, 120.0).replicas == 688
    # without load terms (no utilisation target) nothing changes: the backlog is the only measure
    queue_only = replace(spec, target_utilisation=None)
    q = desired_replicas(sat, queue_only, 50, ScaleHistory(), 0.0)
    assert desired_replicas(served, queue_only, q.replicas, q.history, 120.0).replicas == q.replicas


def test_the_pace_holds_a_surplus_through_a_lull_only_once_the_load_has_come_back() -> None:
    """Issue 21: the pace (max(1 pod, 2 %) a minute) and the 20-minute release window keep capacity
    through a lull, which wins the on/off trace (bursts back within 15 min) and loses flash, where
    the crowd never returns (ours held 1,165 pods for 20 minutes after it). With load terms the
    surplus is now released once every recommendation of max(window + period, shortage hold) is
    below the count, unless the load has come back to a level it had left within ``recur_memory``
    (1 h; ``ScaleHistory.returned_at``). A release window of None still turns every release off."""
    spec = replace(SPEC, scale_down=ScaleDownPolicy(stabilization_window=300, max_pods=1, period=60,
                                                    release_window=1200))
    quiet = Signals(queue_depth=0, utilisation=0.8, ready_replicas=40, permits=4)  # -> 40
    history = ScaleHistory(tuple(HistoryEntry(float(t), 40, 100, 40) for t in range(0, 400, 15)))
    d = desired_replicas(quiet, spec, 100, history, 400.0)
    assert d.replicas == 40 and "released to 40" in d.reason, d.reason
    # the load came back after a lull within the memory: the pace holds, as before
    came_back = replace(history, returned_at=0.0)
    assert desired_replicas(quiet, spec, 100, came_back, 400.0).replicas == 99
    assert desired_replicas(quiet, spec, 100, replace(history, returned_at=-3300.0), 400.0).replicas == 40
    # the rule before (recur_memory None), or the release turned off: paced
    assert desired_replicas(quiet, replace(spec, recur_memory=None), 100, history, 400.0).replicas == 99
    off = replace(spec, scale_down=replace(spec.scale_down, release_window=None))
    assert desired_replicas(quiet, off, 100, history, 400.0).replicas == 99
    # the release waits for max(window + period, shortage hold) of lower recommendations
    recent = ScaleHistory((*history.entries[:-4], *(HistoryEntry(float(t), 100, 100, 100) for t in (345, 360))))
    assert desired_replicas(quiet, spec, 100, recent, 400.0).replicas == 100  # inside the window
    with pytest.raises(ValueError, match="recur_memory"):
        replace(SPEC, recur_memory=0.0)
    with pytest.raises(ValueError, match="shortage_hold"):
        replace(SPEC, shortage_hold=-1.0)


def test_a_jump_back_to_a_level_the_load_had_left_is_a_return() -> None:
    """``returned_at``: a jump of the load recommendation (25 % and 2 pods within 180 s) to a level
    within a jump of one recorded before the lull it rose from. The on/off trace's second burst
    is one; a flash crowd's first rise, to a level never seen, is not."""
    peak = Signals(queue_depth=0, utilisation=0.8, ready_replicas=100)  # -> 100
    lull = [HistoryEntry(float(t), 100, 100, 100) for t in range(0, 300, 15)]
    lull += [HistoryEntry(float(t), 20, 100, 20) for t in range(300, 1200, 15)]
    back = desired_replicas(peak, SPEC, 100, ScaleHistory(tuple(lull)), 1200.0)
    assert back.history.returned_at == 1200.0 and back.history.jumped_at == 1200.0
    fresh = ScaleHistory(tuple(HistoryEntry(float(t), 20, 20, 20) for t in range(0, 1200, 15)))
    first = desired_replicas(peak, SPEC, 100, fresh, 1200.0)
    assert first.history.returned_at is None and first.history.jumped_at == 1200.0
