"""Issue 21's goal on a cheap version of the traces: 200 replicas, 4 hours, both start-up settings.

The full table (1,000 replicas, diurnal 24 h) is ``python -m bench.scalesim.goal`` (about 2 min);
docs/scalesim.md shows it as printed. Seeded: the same rows on every machine.
"""

from __future__ import annotations

import time

from bench.scalesim.goal import goal_rows


def test_ours_is_undominated_on_every_cheap_trace() -> None:
    """ours-keda (the product's default engine, reading what the scaler reads: no requests-in-pods
    term; the HPA's scale-up tolerance 0, the 90 s scale-down window, no burst headroom: the CRD's
    and the policy's defaults since issue 21's last revision) against the fair peers on ramp,
    on/off, stairs, bursty and flash at both start-up settings: no peer dominates it. Before that
    revision the KPA dominated it on flash at both settings (its 60 s stable window followed the
    crowd's decline while ours held a 300 s scale-down window, docs/scalesim.md).
    ``ours-keda-held`` is the rule before the shortage hold and the recurrence rule (every term
    held by the whole window; the pace and the 20-minute release whatever the load): it pays more
    GPU-hours wherever a shortage over-asked."""
    started = time.perf_counter()
    rows = goal_rows(
        ("ramp", "onoff", "stairs", "bursty", "flash"), ("short", "long"), ("ours-keda", "ours-keda-held"),
        replicas=200, hours=4.0,
    )
    elapsed = time.perf_counter() - started
    table = {(r.trace, r.startup, r.scores.policy): r for r in rows}
    for r in rows:
        print(r.line())
    print(f"{len(rows)} rows in {elapsed:.1f}s")
    for trace in ("ramp", "onoff", "stairs", "bursty", "flash"):
        for startup in ("short", "long"):
            row = table[(trace, startup, "ours-keda")]
            assert row.dominated_by == (), row.line()
    # cheaper than the rule before on every row where a shortage over-asked
    for trace in ("stairs", "bursty", "flash"):
        for startup in ("short", "long"):
            ours, before = table[(trace, startup, "ours-keda")], table[(trace, startup, "ours-keda-held")]
            assert ours.scores.gpu_hours < before.scores.gpu_hours, (ours.line(), before.line())
