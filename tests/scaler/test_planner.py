"""The planner against hand-computed textbook values (M/M/c, Erlang C, M/M/1/K)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sluiceway_scaler.planner import plan

ROOT = Path(__file__).resolve().parents[2]


def test_two_servers_unit_load() -> None:
    # c=2, a=1: Erlang C = 1/3; mean wait = C/(c*mu - lambda) = 1/3 s; p95 = ln(C/0.05)/1 = ln(20/3).
    p = plan(2.0, 1.0, 1.0)
    assert (p.servers_needed, p.replicas, p.concurrency) == (2, 2, 1)
    n = p.nominal
    assert n.utilisation == pytest.approx(0.5)
    assert n.wait_probability == pytest.approx(1 / 3)
    assert n.mean_wait == pytest.approx(1 / 3)
    assert n.wait_p95 == pytest.approx(math.log(20 / 3))
    assert n.meets_target


def test_tighter_target_needs_three_servers() -> None:
    # c=3, a=1: Erlang B = 1/16, Erlang C = 1/11; p95 = ln((1/11)/0.05)/2 = ln(20/11)/2 ~ 0.299 s.
    p = plan(1.0, 1.0, 1.0)
    assert p.servers_needed == 3
    assert p.nominal.wait_probability == pytest.approx(1 / 11)
    assert p.nominal.mean_wait == pytest.approx(1 / 22)
    assert p.nominal.wait_p95 == pytest.approx(math.log(20 / 11) / 2)


def test_mm1k_rejection_and_queue_bound() -> None:
    # One server, rho = 0.5, T/S = 1 -> queue bound 1, K = 2: P_K = (1-rho) rho^K / (1-rho^(K+1)) = 1/7.
    p = plan(1.0, 0.5, 1.0, concurrency=1, replicas=1)
    assert p.queue_bound == 1
    assert p.nominal.rejection_share == pytest.approx(1 / 7)
    assert p.nominal.mean_wait == pytest.approx(1.0)  # M/M/1: rho/(mu - lambda)


def test_concurrency_sizing_and_load_points() -> None:
    p = plan(0.5, 40.0, 0.05, replicas=2)
    assert p.servers_needed == 3
    assert p.concurrency == 2  # ceil(3 / 2)
    assert p.queue_bound == 20  # N*T/S = 2 * 0.5 / 0.05
    assert [pt.load_factor for pt in p.points] == [0.8, 1.0, 1.2]
    assert [pt.arrival_rate for pt in p.points] == pytest.approx([32.0, 40.0, 48.0])
    waits = [pt.wait_p95 for pt in p.points]
    assert waits == sorted(waits) and waits[0] < waits[2]


def test_overload_is_reported_not_hidden() -> None:
    p = plan(2.0, 1.0, 1.0)  # sized for load 1 on 2 servers; +20 % misses the target
    assert not p.points[2].meets_target
    assert p.points[0].meets_target


@pytest.mark.parametrize(
    ("args", "kw"),
    [
        ((0.0, 1.0, 1.0), {}),
        ((1.0, -1.0, 1.0), {}),
        ((1.0, 1.0, 0.0), {}),
        ((1.0, 1.0, 1.0), {"concurrency": 0}),
    ],
)
def test_bad_input(args: tuple[float, float, float], kw: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        plan(*args, **kw)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'inference-pod'}{os.pathsep}{ROOT / 'operator'}")
    return subprocess.run(
        [sys.executable, "-m", "sluiceway_scaler.plan_cli", "plan", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_cli_prints_the_plan() -> None:
    r = _cli("--target-wait-p95", "2s", "--arrival-rate", "1", "--service-time", "1s")
    assert r.returncode == 0, r.stderr
    assert "servers needed (M/M/c)    2" in r.stdout
    assert "333.3ms" in r.stdout  # mean wait 1/3 s at nominal load
    assert "-20%" in r.stdout and "+20%" in r.stdout


def test_cli_json() -> None:
    r = _cli("--target-wait-p95", "1", "--arrival-rate", "1", "--service-time", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["servers_needed"] == 3


def test_cli_bad_input_and_unreachable_prometheus() -> None:
    r = _cli("--target-wait-p95", "1s", "--service-time", "20ms")
    assert r.returncode == 2 and "--arrival-rate" in r.stderr
    r = _cli("--target-wait-p95", "1s", "--prometheus", "http://127.0.0.1:9", "--inference-service", "x")
    assert r.returncode == 2 and "prometheus at http://127.0.0.1:9" in r.stderr.lower()
