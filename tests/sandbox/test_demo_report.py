"""The demo's ramp, report math, live-display rows and PNG plot; the sample it applies is a valid
InferenceService with the capacity the ramp assumes."""

from __future__ import annotations

import dataclasses
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
    assert rows["served per pod"] == "-" and rows["edge (gateway)"] == "-"  # no reading, no gateway
    from sluiceway_sandbox.demo import EdgeReading

    s2 = dataclasses.replace(s, served={"198.18.1.5": 130.0, "198.18.1.6": 10.0},
                             edge=EdgeReading(held=2, handed_off=12,
                                              refused={"rate_limited": 5, "hold_full": 0, "header_timeout": 3}))
    rows = dict(render_table(s2, 40.0, {}, {"198.18.1.5": 100.0}))
    assert rows["served per pod"] == "198.18.1.5 75% 198.18.1.6 25%"
    assert rows["edge (gateway)"] == "held 2 now, 12 handed off after a hold; refused: rate_limited:5"


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


def test_demo_goes_through_the_gateway_unless_asked_otherwise(capsys: pytest.CaptureFixture[str]) -> None:
    from sluiceway_sandbox.demo import CLIENT_MODES, main, parser, run_demo
    from sluiceway_sandbox.layout import Layout

    # issue 19 section 4: keep-alive clients through the gateway by default; the old modes on request
    assert parser().parse_args([]).clients == "gateway"
    assert "gateway (the default)" in parser().format_help()
    assert set(CLIENT_MODES) == {"gateway", "keepalive", "per-request"}
    for mode in CLIENT_MODES:
        assert parser().parse_args(["--clients", mode]).clients == mode
    with pytest.raises(SystemExit):
        parser().parse_args(["--clients", "random"])
    with pytest.raises(ValueError, match="clients_mode"):
        run_demo(Layout(state_dir=Path("/nonexistent")), clients_mode="random", up=False)
    with pytest.raises(ValueError, match="keep-alive clients"):
        run_demo(Layout(state_dir=Path("/nonexistent")), keepalive_clients=0, up=False)
    assert main(["--keepalive-clients", "0", "--state-dir", "/nonexistent/never-used"]) == 2
    assert "--keepalive-clients" in capsys.readouterr().err


def test_the_demo_turns_the_gateway_on_in_what_it_applies_not_in_the_sample() -> None:
    from sluiceway_operator.spec import parse_spec
    from sluiceway_sandbox.demo import GATEWAY_SPEC, with_gateway

    docs = [d for d in yaml.safe_load_all(SAMPLE.read_text()) if d]
    (plain,) = [d for d in docs if d["kind"] == "InferenceService"]
    assert "gateway" not in plain["spec"]  # the sample as tests/sandbox/test_e2e.py applies it
    out = with_gateway(docs)
    (isvc,) = [d for d in out if d["kind"] == "InferenceService"]
    assert isvc["spec"]["gateway"] == dict(GATEWAY_SPEC)
    assert "gateway" not in plain["spec"]  # a copy: the loaded documents are unchanged
    assert [d for d in out if d["kind"] != "InferenceService"] == [d for d in docs if d["kind"] != "InferenceService"]
    spec = parse_spec(isvc["spec"])  # the operator's own parser accepts it
    assert spec.gateway is not None and spec.gateway.enabled and spec.gateway.replicas == 1
    with pytest.raises(ValueError, match="exactly one InferenceService"):
        with_gateway([d for d in docs if d["kind"] != "InferenceService"])


def test_gateway_service_is_read_from_status_endpoint() -> None:
    from sluiceway_sandbox.demo import gateway_service

    assert gateway_service("http://ramp-gateway.sluiceway-demo.svc:8080", "sluiceway-demo") == "ramp-gateway"
    assert gateway_service("http://ramp.sluiceway-demo.svc:8080", "sluiceway-demo") is None  # the pods' Service
    assert gateway_service("http://ramp-gateway.other.svc:8080", "sluiceway-demo") is None
    assert gateway_service("", "sluiceway-demo") is None


def test_desired_dips_finds_a_dip_in_the_overload_phase_and_none_in_a_flat_one() -> None:
    """Issue 21 item 5: the report counts how often desired went down during the steady 3x phase."""
    from sluiceway_sandbox.demo import desired_dips

    # the flap of issue 21: 1 -> 4 early in the phase, 4 -> 3 later, back to 4
    series = [1, 1, 2, 4, 4, 4, 4, None, 3, 3, 4, 4]
    dipped = [_sample(60 + i, 1, desired=d, phase="over") for i, d in enumerate(series) if d is not None]
    dipped.insert(7, Sample(67, "over", 1.0, 1.0, {}, None, None, None, None))  # a second with no reading
    dipped = [_sample(t, 1, 1, "at") for t in range(55, 60)] + dipped + [_sample(72, 1, 1, "off")]
    d = desired_dips(dipped, "over")
    assert (d.dips, d.low, d.high) == (1, 1, 4)
    assert d.at == ((68, 4, 3),)  # the reading before the gap (4 at t=66) counts, the gap does not
    assert (d.start, d.end) == (60, 71)
    assert "desired went down 1 time(s) (t=68 s 4->3); desired min 1, max 4" in d.line()
    flat = desired_dips([_sample(60 + i, 4, 4, "over") for i in range(60)], "over")
    assert (flat.dips, flat.low, flat.high, flat.at) == (0, 4, 4, ())
    rising = desired_dips([_sample(60 + i, 1, desired=min(4, 1 + i), phase="over") for i in range(10)])
    assert (rising.dips, rising.low, rising.high) == (0, 1, 4)  # going up is no dip
    assert desired_dips([_sample(1, 1, 1, "at")], "over").low is None  # no such phase: no reading
    # the falls after the load stopped are not counted
    assert desired_dips([*dipped, _sample(73, 1, 1, "off")]).dips == 1  # 4 at t=71, then 1 after the phase


def test_served_shares_split_what_the_pods_answered() -> None:
    from sluiceway_sandbox.demo import recent_shares, served_shares

    def at(t: float, served: dict[str, float]) -> Sample:
        return dataclasses.replace(_sample(t, len(served), phase="over"), served=served)

    samples = [at(70, {"a": 100, "b": 0}), at(80, {"a": 150, "b": 10, "c": 0}),
               at(90, {"a": 200, "b": 60, "c": 50}), at(100, {"a": 350, "b": 110, "c": 100, "d": 5})]
    assert served_shares(samples, 80, 101) == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.25})  # d: one end only
    assert served_shares(samples, 80, 100) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})  # to t=90
    assert served_shares(samples, 80, 81) == {}  # one sample: no window
    assert served_shares([at(1, {"a": 5}), at(2, {"a": 5})], 0, 10) == {}  # nothing served
    # live: a pod new since the earlier reading counts from 0
    assert recent_shares({"a": 10}, {"a": 20, "b": 10}) == pytest.approx({"a": 0.5, "b": 0.5})
    assert recent_shares({}, {}) == {}


def test_gateway_and_pod_metrics_are_read_from_their_expositions() -> None:
    """The readers on real expositions: the gateway's own metrics module and a pod's counter."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest
    from sluiceway_gateway.metrics import GatewayMetrics
    from sluiceway_sandbox.demo import edge_from_metrics, parse_exposition, served_from_metrics

    def gateway(held: int, handed: int, refused: dict[str, int], routed: dict[str, int]) -> str:
        reg = CollectorRegistry()
        gm = GatewayMetrics(reg)
        gm.held.set(held)
        for _ in range(handed):
            gm.hold_seconds.labels("handed_off").observe(0.2)
        gm.hold_seconds.labels("expired").observe(5)
        for reason, n in refused.items():
            gm.refused.labels(reason).inc(n)
        for pod, n in routed.items():
            gm.pod(pod).routed.inc(n)
        return generate_latest(reg).decode()

    e = edge_from_metrics([gateway(3, 7, {"rate_limited": 4, "hold_full": 1}, {"198.18.1.5:8080": 10}),
                           gateway(1, 2, {"rate_limited": 1}, {"198.18.1.6:8080": 4})])
    assert (e.held, e.handed_off) == (4, 9)
    assert e.hold_outcomes["expired"] == 2 and e.refused["rate_limited"] == 5 and e.refused["hold_full"] == 1
    assert e.routed == {"198.18.1.5:8080": 10, "198.18.1.6:8080": 4}
    reg = CollectorRegistry()
    c = Counter("sluiceway_requests", "answered", ["model", "code"], registry=reg)
    c.labels("ramp", "200").inc(40)
    c.labels("ramp", "429").inc(2)
    text = generate_latest(reg).decode()
    assert served_from_metrics(text) == 42  # _created series are not counted
    assert list(parse_exposition('# HELP x y\n\nx{a="b\\"c",d="e"} 1.5\nbad line\ny NaNx\n')) == [
        ("x", {"a": 'b\\"c', "d": "e"}, 1.5)]


def test_report_states_dips_shares_and_the_edge() -> None:
    from sluiceway_sandbox.demo import EdgeReading

    ramp = Ramp(capacity=40, below=10, at=10, over=40, off=10)  # 3x phase: t=20..60
    samples = []
    for t in range(1, 71):
        phase = "below" if t < 10 else "at" if t < 20 else "over" if t < 60 else "off"
        ready = 1 if t < 25 else 4
        desired = 4 if 22 <= t < 65 else 1
        if t == 40:
            desired = 3  # one dip
        served = {f"198.18.1.{i}": float(10 * t) for i in range(1, ready + 1)}
        edge = EdgeReading(held=float(t == 23) * 9, handed_off=5.0, hold_outcomes={"handed_off": 5.0},
                           refused={"rate_limited": 3.0, "hold_timeout": 0.0, "header_timeout": 24.0})
        samples.append(dataclasses.replace(_sample(t, ready, desired, phase), served=served, edge=edge))
    r = build_report(samples, [Outcome(1, "search", 200, latency=0.06)], ramp)
    assert r.over_dips is not None and (r.over_dips.dips, r.over_dips.low, r.over_dips.high) == (1, 1, 4)
    assert r.share_window == (35.0, 60.0)  # 4 ready first at t=25, plus 10 s
    assert r.pod_shares == pytest.approx({f"198.18.1.{i}": 0.25 for i in range(1, 5)})
    assert r.peak_held == 9 and r.edge is not None
    text = "\n".join(r.lines())
    assert "desired went down 1 time(s) (t=41 s 3->4" not in text and "(t=40 s 4->3)" in text
    assert "desired min 1, max 4" in text
    assert "t=35..60 s (4 pods, even 25.0%): 198.18.1.1 25.0%" in text
    assert "held at most 9 at once; held requests by outcome: handed_off:5" in text
    assert "refused at the edge by reason: rate_limited:3; connections closed at the header deadline" in text
    assert "no request answered): 24" in text and "hold_timeout" not in text
    assert r.edge_lost == () and "did not answer" not in text
    # the gateway's metrics port stops answering at t=50..52 and from t=68: said, with the spans
    gone = [dataclasses.replace(x, edge=None) if 50 <= x.t <= 52 or x.t >= 68 else x for x in samples]
    lost = build_report(gone, [], ramp)
    assert lost.edge_lost == ((50, 52), (68, 70))
    assert "its metrics port did not answer at t=50..52 s; t=68..70 s (the gateway down or hung)" in "\n".join(
        lost.lines())
    # without a gateway and with one pod: no edge lines, shares "-"
    plain = build_report([_sample(t, 1) for t in range(1, 71)], [], ramp)
    assert plain.edge is None and "served per pod in the 3x phase: -" in "\n".join(plain.lines())
    assert not any(line.startswith("edge") for line in plain.lines())


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
    reads = iter(range(1, 100))

    def probe() -> tuple[dict[str, float], demo.EdgeReading | None]:
        n = next(reads)
        return {"198.18.1.5": 10.0 * n}, demo.EdgeReading(held=float(n))

    samples = demo._observe(ramp, [(0.5, 0), (0.6, 0), (1.5, 0)], outs, Prom(), Api(), "ns", "n",  # type: ignore[arg-type]
                            time.monotonic(), live, lines.append, probe=probe)
    assert [round(s.t) for s in samples] == [1, 2, 3]
    assert samples[0].offered == 2.0 and samples[1].offered == 1.0 and samples[0].goodput == 1.0
    assert samples[-1].answers == {"200": 1, "429": 1}
    assert (samples[-1].desired, samples[-1].ready, samples[-1].queue_depth) == (2, 1, 3.0)
    assert [s.served for s in samples] == [{"198.18.1.5": 10.0}, {"198.18.1.5": 20.0}, {"198.18.1.5": 30.0}]
    assert [s.edge.held if s.edge else None for s in samples] == [1.0, 2.0, 3.0]
    if live:
        assert "429 rate_limited:1" in capsys.readouterr().out
