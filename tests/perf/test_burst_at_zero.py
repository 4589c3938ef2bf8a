"""``python -m bench.burst_at_zero --quick``: the burst benchmark's parts behave as documented.

Behaviour only, never speed: a real gateway and a real pod (the torch MLP after a 1 s load) in both
arms; every request of each burst gets exactly one answer (none lost), the long-deadline ones all
200, the short-deadline ones at zero refused ``503 no_capacity_in_time`` with a ``Retry-After``;
bad arguments exit 2 with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.burst_at_zero import (
    NO_ANSWER,
    ONE,
    QUICK,
    ZERO,
    Rec,
    deadline_ms_of,
    main,
    plot,
    run_benchmark,
    summarize,
)

pytestmark = pytest.mark.slow


def test_summary_counts_each_outcome() -> None:
    recs = [Rec(0, 500, 0.01, 503, "no_capacity_in_time", "4"), Rec(1, 9000, 3.5, 200), Rec(2, 9000, 3.6, 200),
            Rec(3, 9000, None, NO_ANSWER, "no_answer")]
    s = summarize(recs, ready_after=3.41)
    assert (s["requests"], s["ok"], s["lost"], s["early_503"]) == (4, 2, 1, 1)
    assert s["codes"] == {"200": 2, "503 no_capacity_in_time": 1, "no_answer": 1}
    assert s["retry_after_values"] == {"4": 1}
    assert s["retry_after_error_median"] == pytest.approx(4 / 3.4 - 1)
    assert s["p99_s"] == pytest.approx(3.6)
    assert [deadline_ms_of(i, QUICK) for i in range(3)] == [QUICK.short_deadline_ms, QUICK.deadline_ms,
                                                           QUICK.deadline_ms]


@pytest.mark.parametrize("argv", [["--requests", "0"], ["--load-seconds", "-1"], ["--deadline-ms", "0"],
                                  ["--handoff-queue", "-1"]])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_quick_burst_every_request_gets_one_answer(tmp_path: Path) -> None:
    doc = run_benchmark(QUICK, tmp_path, print)
    n = QUICK.requests
    short = sum(1 for i in range(n) if deadline_ms_of(i, QUICK) == QUICK.short_deadline_ms)
    for name in (ONE, ZERO):
        arm = doc["arms"][name]
        assert arm["requests"] == n and arm["lost"] == 0, (name, arm["codes"])
        assert sum(arm["codes"].values()) == n
        # every long-deadline request is answered 200 (held while the pod loads, at zero)
        assert arm["ok"] >= n - short, (name, arm["codes"])
    zero = doc["arms"][ZERO]
    # the short deadline (0.5 s) is inside the start-up (>= 1 s load): refused at once with Retry-After
    assert zero["codes"].get("503 no_capacity_in_time") == short, zero["codes"]
    assert zero["retry_after_values"] and zero["ready_after_t0"] is not None
    assert zero["gateway"]["handed_off"] == n - short
    assert zero["pod"]["served_200"] == n - short
    pytest.importorskip("matplotlib", reason="matplotlib draws the benchmark's plot")
    png = plot(doc, tmp_path / "burst.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
