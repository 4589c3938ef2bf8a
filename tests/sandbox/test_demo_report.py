"""The demo's ramp, report math, live-display rows and PNG plot; the sample it applies is a valid
InferenceService with the capacity the ramp assumes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sluiceway_sandbox.demo import SAMPLE, DemoReport, Ramp, Sample, build_report, render_table, write_plot
from sluiceway_sandbox.loadgen import CLIENT_TIMEOUT, Outcome


def _sample(t: float, ready: int, desired: int | None = None, phase: str = "x") -> Sample:
    return Sample(t, phase, 10.0, 8.0, {"200": 1}, 2.0, 0.25, desired if desired is not None else ready, ready)


def test_ramp_is_below_at_and_three_times_capacity_then_off() -> None:
    ramp = Ramp(capacity=40, below=5, at=6, over=7, off=8)
    assert [(p.name, p.seconds, p.rate) for p in ramp.phases()] == [
        ("below", 5, 20.0), ("at", 6, 40.0), ("over", 7, 120.0), ("off", 8, 0.0)]
    assert ramp.seconds == 26 and ramp.overload_start == 11
    assert Ramp.short().seconds < Ramp().seconds


def test_sample_capacity_matches_the_ramp() -> None:
    from sluiceway_operator.spec import parse_spec

    docs = [d for d in yaml.safe_load_all(SAMPLE.read_text()) if d]
    (isvc,) = [d for d in docs if d["kind"] == "InferenceService"]
    spec = parse_spec(isvc["spec"])
    assert spec.model.source is not None, spec.model
    ms = float(spec.model.source.removeprefix("synthetic:"))
    assert spec.model.format == "synthetic"
    permits = spec.concurrency.permits
    assert isinstance(permits, int), permits  # the sample fixes them (not "auto")
    assert permits * 1000.0 / ms == Ramp().capacity
    assert spec.resources.gpus == 0
    a = spec.autoscaling
    assert (a.engine, a.min_replicas, a.max_replicas) == ("keda", 1, 4)
    assert len(spec.priorities.classes) == 3
    assert len(spec.tenants or []) == 3 and spec.access.allow_anonymous is False
    secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    assert {t.key_secret_ref.name for t in spec.tenants or [] if t.key_secret_ref} == secrets
    # the demo's traffic uses each tenant's own priority ceiling
    from sluiceway_sandbox.demo import DEFAULT_TRAFFIC

    ceilings = {f"{t.name}-key": t.max_priority for t in spec.tenants or []}
    assert {sec: prio for sec, prio, _ in DEFAULT_TRAFFIC} == ceilings


def test_report_numbers() -> None:
    ramp = Ramp(capacity=40, below=10, at=10, over=20, off=20)  # overload starts at t=20
    samples = [_sample(t, 1) for t in range(1, 24)] + [_sample(24, 1, desired=3), _sample(25, 2, 3),
                                                       _sample(26, 3, 3)]
    samples += [_sample(t, 3, 4) for t in range(27, 45)] + [_sample(t, 1, 1) for t in range(45, 61)]
    outcomes = ([Outcome(1, "search", 200, latency=0.06)] * 70 + [Outcome(1, "reports", 429, "rate_limited")] * 20
                + [Outcome(1, "search", 503, "queue_timeout")] * 9 + [Outcome(1, "search", CLIENT_TIMEOUT)])
    r = build_report(samples, outcomes, ramp, first_ready_endpoint=4.5)
    assert (r.sent, r.ok) == (100, 70)
    assert r.goodput_share == pytest.approx(0.70)
    assert r.peak_desired == 4 and r.peak_ready == 3
    assert r.overload_to_second_ready == 5  # t=25 is the first sample with 2 ready, 5 s after t=20
    assert r.unexpected_5xx == 0 and r.shed_without_reason == 0
    assert r.reasons == {"429 rate_limited": 20, "503 queue_timeout": 9, "timeout -": 1}
    assert r.replicas_after_off == 1 and r.first_ready_endpoint == 4.5 and r.ready_at_overload == 1
    assert r.off_to_min_desired == 5  # the load stopped at t=40; desired was 1 again at t=45
    text = "\n".join(r.lines())
    assert "goodput share 70.0%" in text and "second ready pod: 5.0 s" in text
    # a 500 is an unexpected 5xx, and never reaching 2 replicas reads as "-"
    bad = build_report([_sample(t, 1) for t in range(1, 61)], [Outcome(1, "x", 500, "internal")], ramp)
    assert bad.unexpected_5xx == 1 and bad.overload_to_second_ready is None
    assert "second ready pod: -" in "\n".join(bad.lines())
    # already scaled out when the overload began: nothing to time, and the report says so
    warm = build_report([_sample(t, 3) for t in range(1, 61)], [], ramp)
    assert warm.ready_at_overload == 3 and warm.overload_to_second_ready is None
    assert "already 3 ready when the overload began" in "\n".join(warm.lines())


def test_live_rows() -> None:
    s = Sample(12.0, "over", 120.0, 80.0, {"200": 5, "429": 2}, None, 0.2504, 3, 2)
    rows = dict(render_table(s, 40.0, {"429 rate_limited": 2}))
    assert rows["offered"].strip().startswith("120.0 req/s") and "3.0x one replica" in rows["offered"]
    assert rows["goodput"].strip().startswith("80.0")
    assert rows["answers"] == "200:5 429:2" and rows["non-2xx reasons"] == "429 rate_limited:2"
    assert rows["queue depth"].startswith("-") and rows["wait p95"].startswith("250 ms")
    assert rows["replicas"] == "desired 3  ready 2"


def test_plot_is_a_png(tmp_path: Path) -> None:
    ramp = Ramp(capacity=40, below=2, at=2, over=3, off=3)
    samples = [_sample(t, 1 + (t > 5)) for t in range(1, 11)]
    report: DemoReport = build_report(samples, [Outcome(1, "a", 200, latency=0.1)], ramp)
    path = write_plot(report, ramp, tmp_path / "out" / "demo.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_cli_refuses_bad_durations_before_doing_anything(capsys: pytest.CaptureFixture[str]) -> None:
    from sluiceway_sandbox.demo import main

    assert main(["--over", "0", "--state-dir", "/nonexistent/never-used"]) == 2
    assert "phase durations" in capsys.readouterr().err


def test_demo_spreads_per_request_unless_asked_for_keepalive_clients(capsys: pytest.CaptureFixture[str]) -> None:
    from sluiceway_sandbox.demo import parser, run_demo
    from sluiceway_sandbox.layout import Layout

    # the demo's story needs a per-request balancer (docs/sandbox.md): chosen explicitly, not by accident
    assert parser().parse_args([]).clients == "per-request"
    assert parser().parse_args(["--clients", "keepalive"]).clients == "keepalive"
    with pytest.raises(SystemExit):
        parser().parse_args(["--clients", "random"])
    with pytest.raises(ValueError, match="clients_mode"):
        run_demo(Layout(state_dir=Path("/nonexistent")), clients_mode="random", up=False)


@pytest.mark.parametrize("live", [True, False])
def test_observe_samples_each_second(live: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """The sampling loop with stand-ins for Prometheus and the API (the real ones: the e2e test)."""
    import time

    from sluiceway_sandbox import demo

    class Prom:
        def read(self) -> tuple[float | None, float | None]:
            return 3.0, 0.2

    class Api:
        def get(self, path: str) -> dict[str, object]:
            assert path == "/apis/apps/v1/namespaces/ns/deployments/n"
            return {"spec": {"replicas": 2}, "status": {"readyReplicas": 1}}

    ramp = Ramp(capacity=40, below=1, at=1, over=1, off=0.5)
    outs = [Outcome(0.5, "a", 200, latency=0.1), Outcome(0.6, "a", 429, "rate_limited")]
    lines: list[str] = []
    samples = demo._observe(ramp, [(0.5, 0), (0.6, 0), (1.5, 0)], outs, Prom(), Api(), "ns", "n",  # type: ignore[arg-type]
                            time.monotonic(), live, lines.append)
    assert [round(s.t) for s in samples] == [1, 2, 3]
    assert samples[0].offered == 2.0 and samples[1].offered == 1.0 and samples[0].goodput == 1.0
    assert samples[-1].answers == {"200": 1, "429": 1}
    assert (samples[-1].desired, samples[-1].ready, samples[-1].queue_depth) == (2, 1, 3.0)
    if live:
        assert "429 rate_limited:1" in capsys.readouterr().out
