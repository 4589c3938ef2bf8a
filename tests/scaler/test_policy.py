"""Unit tests of the one scaling-policy function, over tables of signals."""

from __future__ import annotations

import pytest
from sluiceway_core.policy import (
    Decision,
    ScaleDownPolicy,
    ScaleHistory,
    ScaleUpPolicy,
    ScalingSpec,
    Signals,
    desired_replicas,
)

SPEC = ScalingSpec(
    min_replicas=1,
    max_replicas=10,
    target_queue_per_replica=4,
    target_wait_p95=0.5,
    scale_down=ScaleDownPolicy(stabilization_window=300),
)


def run(seq: list[tuple[float, Signals]], spec: ScalingSpec = SPEC, start: int = 1) -> list[Decision]:
    """Feed signals at the given times, applying each decision as the next ``current``."""
    history = ScaleHistory()
    current = start
    out = []
    for t, s in seq:
        d = desired_replicas(s, spec, current, history, t)
        out.append(d)
        history, current = d.history, d.replicas
    return out


@pytest.mark.parametrize(
    ("queue", "wait", "current", "expected"),
    [
        (0, None, 1, 1),  # idle: min
        (4, None, 1, 1),  # exactly one replica's worth
        (5, None, 1, 2),  # one over: ceil
        (17, None, 2, 5),  # 17/4 -> 5
        (0, 1.0, 2, 4),  # wait 2x target at 2 replicas -> 4
        (8, 0.75, 2, 3),  # backlog says 2, wait says 3: the larger
        (12, 0.1, 2, 3),  # backlog says 3, wait says 1: the larger
        (1000, 5.0, 3, 10),  # bounded by max
        (0, 0.0, 1, 1),  # bounded by min
    ],
)
def test_raw_combination_and_bounds(queue: float, wait: float | None, current: int, expected: int) -> None:
    d = desired_replicas(Signals(queue_depth=queue, wait_p95=wait), SPEC, current, ScaleHistory(), 0.0)
    assert d.replicas == expected
    assert not d.held


def test_min_zero_allows_zero() -> None:
    spec = ScalingSpec(
        min_replicas=0,
        max_replicas=5,
        target_queue_per_replica=2,
        scale_down=ScaleDownPolicy(stabilization_window=0),
    )
    d = desired_replicas(Signals(queue_depth=0), spec, 3, ScaleHistory(), 0.0)
    assert d.replicas == 0


def test_scale_up_is_immediate() -> None:
    ds = run([(0, Signals(0)), (1, Signals(0)), (2, Signals(36))])
    assert [d.replicas for d in ds] == [1, 1, 9]


def test_scale_up_step_limit_pods_or_percent_whichever_larger() -> None:
    spec = ScalingSpec(
        min_replicas=1,
        max_replicas=100,
        target_queue_per_replica=1,
        scale_up=ScaleUpPolicy(max_pods=2, max_percent=100),
    )
    # from 1: max(1+2, 2) = 3; from 3: max(5, 6) = 6; from 6: max(8, 12) = 12; then 40 reached
    ds = run([(t, Signals(40)) for t in range(5)], spec)
    assert [d.replicas for d in ds] == [3, 6, 12, 24, 40]


def test_scale_down_waits_for_the_window() -> None:
    seq = [(0.0, Signals(40))] + [(float(t), Signals(0)) for t in range(10, 400, 10)]
    ds = run(seq)
    by_t = {t: d.replicas for (t, _), d in zip(seq, ds, strict=True)}
    assert by_t[0.0] == 10
    assert all(by_t[t] == 10 for t in by_t if t < 300)
    assert by_t[300.0] == 10  # the window still holds the t=0 recommendation
    assert by_t[310.0] == 1
    assert by_t[390.0] == 1


def test_flapping_input_does_not_scale_down_inside_window() -> None:
    # Load oscillates every 20 s between 24 queued (6 replicas) and nothing.
    seq = [(float(t), Signals(24 if (t // 20) % 2 == 0 else 0)) for t in range(0, 600, 10)]
    ds = run(seq)
    replicas = [d.replicas for d in ds]
    assert replicas[0] == 6
    assert set(replicas) == {6}, "down-scaling must not follow oscillating input"
    # After the oscillation stops the service shrinks, but only once a full window passed.
    tail = [(600.0 + t, Signals(0)) for t in range(0, 400, 10)]
    history, current = ds[-1].history, ds[-1].replicas
    out = []
    for t, s in tail:
        d = desired_replicas(s, SPEC, current, history, t)
        history, current = d.history, d.replicas
        out.append((t, d.replicas))
    last_high = max(t for t, _ in seq if (t // 20) % 2 == 0)
    assert all(r == 6 for t, r in out if t < last_high + 300)
    assert out[-1][1] == 1


def test_stabilised_value_is_highest_recommendation_in_window() -> None:
    seq = [
        (0.0, Signals(40)),
        (100.0, Signals(20)),
        (200.0, Signals(8)),
        (310.0, Signals(0)),
        (410.0, Signals(0)),
        (510.0, Signals(0)),
    ]
    ds = run(seq)
    assert [d.replicas for d in ds] == [10, 10, 10, 5, 2, 1]


def test_scale_down_rate_limit_pods_per_period() -> None:
    spec = ScalingSpec(
        min_replicas=1,
        max_replicas=20,
        target_queue_per_replica=1,
        scale_down=ScaleDownPolicy(stabilization_window=0, max_pods=2, period=60),
    )
    seq = [(0.0, Signals(10))] + [(float(t), Signals(0)) for t in range(30, 400, 30)]
    ds = run(seq, spec)
    replicas = [d.replicas for d in ds]
    assert replicas[0] == 10
    assert replicas[-1] == 1
    # Never more than 2 fewer than the highest decision within the last 60 s.
    for i, ((t, _), d) in enumerate(zip(seq, ds, strict=True)):
        recent = [ds[j].replicas for j in range(i) if seq[j][0] >= t - 60]
        if recent:
            assert d.replicas >= max(recent) - 2


@pytest.mark.parametrize(
    "signals",
    [
        Signals(queue_depth=None),
        Signals(queue_depth=0, ok=False, detail="prometheus unreachable"),
        Signals(queue_depth=float("nan")),
    ],
)
def test_missing_data_holds_and_never_scales_down(signals: Signals) -> None:
    d = desired_replicas(signals, SPEC, 7, ScaleHistory(), 0.0)
    assert d.replicas == 7
    assert d.held
    assert "held" in d.reason


def test_outage_restarts_the_window() -> None:
    # High load, a long outage, then an idle but healthy read: hold for a window after the outage.
    seq = [(0.0, Signals(40))] + [(float(t), Signals(None, ok=False)) for t in range(100, 1000, 100)]
    seq += [(1000.0, Signals(0)), (1200.0, Signals(0)), (1310.0, Signals(0))]
    ds = run(seq)
    assert all(d.replicas == 10 for d in ds[:-1])
    assert all(d.held for d in ds[1:10])
    assert ds[-1].replicas == 1


def test_above_max_is_brought_down_even_inside_window() -> None:
    spec = ScalingSpec(min_replicas=1, max_replicas=4, target_queue_per_replica=1)
    hist = ScaleHistory()
    d = desired_replicas(Signals(100), spec, 9, hist, 0.0)
    assert d.replicas == 4


def test_below_min_is_raised() -> None:
    spec = ScalingSpec(min_replicas=3, max_replicas=4, target_queue_per_replica=1)
    d = desired_replicas(Signals(0), spec, 0, ScaleHistory(), 0.0)
    assert d.replicas == 3


def test_history_is_pruned_and_input_unchanged() -> None:
    hist = ScaleHistory()
    d1 = desired_replicas(Signals(4), SPEC, 1, hist, 0.0)
    assert hist.entries == ()
    h = d1.history
    for t in range(1, 2000, 50):
        h = desired_replicas(Signals(4), SPEC, 1, h, float(t)).history
    assert all(e.at >= 1951 - 300 for e in h.entries)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_replicas": -1, "max_replicas": 1, "target_queue_per_replica": 1},
        {"min_replicas": 3, "max_replicas": 2, "target_queue_per_replica": 1},
        {"min_replicas": 1, "max_replicas": 2},
        {"min_replicas": 1, "max_replicas": 2, "target_queue_per_replica": 0},
        {"min_replicas": 1, "max_replicas": 2, "target_wait_p95": -1},
        {
            "min_replicas": 1,
            "max_replicas": 2,
            "target_wait_p95": 1,
            "scale_down": ScaleDownPolicy(stabilization_window=-1),
        },
    ],
)
def test_bad_spec_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ScalingSpec(**kwargs)  # type: ignore[arg-type]


def test_utilisation_holds_replicas_under_steady_load_without_a_queue() -> None:
    """Enough capacity means an empty queue; the busy share of the permits still says how many
    replicas the load needs, so a steady load does not make the service shrink and regrow."""
    spec = ScalingSpec(min_replicas=1, max_replicas=10, target_queue_per_replica=2, target_utilisation=0.8,
                       scale_down=ScaleDownPolicy(stabilization_window=0))
    history = ScaleHistory()
    replicas = 4
    for t in range(0, 600, 15):  # ten minutes of the same steady load: queue 0, permits 75 % busy
        d = desired_replicas(Signals(queue_depth=0, utilisation=0.75), spec, replicas, history, float(t))
        history, replicas = d.history, d.replicas
        assert replicas == 4, d.reason
    # without the utilisation target the same signals would collapse to the minimum
    no_util = ScalingSpec(min_replicas=1, max_replicas=10, target_queue_per_replica=2,
                          scale_down=ScaleDownPolicy(stabilization_window=0))
    assert desired_replicas(Signals(queue_depth=0, utilisation=0.75), no_util, 4, ScaleHistory(), 0.0).replicas == 1
    # hotter than the target scales up: 4 x 1.0 / 0.8 = 5
    assert desired_replicas(Signals(queue_depth=0, utilisation=1.0), spec, 4, ScaleHistory(), 0.0).replicas == 5
