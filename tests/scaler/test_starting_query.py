"""The activation's "pods still starting" (issue 20), evaluated by Prometheus's own PromQL engine:
``promtool test rules`` with input series 10 s apart, six pods' targets over ten minutes, evaluated
at the end. A pod up and never ready is starting, unless it is crash-looping (its target went down
twice within ``crashLoopWindow``) or, with a measured start-up, it has been up and loading longer
than :func:`sluiceway_core.signals.starting_bound` of it.

Before the fix the scaler counted ``sum(up == 1) - count(ready phase)``: 5 of these 6 pods, the
crash-looping one included (the third check below asserts that figure, so a change to the query
that stops it being the old rule's shows here)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from sluiceway_core.signals import Queries, starting_bound

PROMTOOL = shutil.which("promtool")
NS, NAME = "team-a", "demo"
SEL = f'namespace="{NS}",inferenceservice="{NAME}"'
Q = Queries.build(NS, NAME, "1m", "10m")

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not found: apt-get install -y prometheus")

#: each pod's ``up`` every 10 s from 0 to 600 s (61 samples; ``_`` not scraped yet)
PODS = {
    "fresh": "_x54 1x6",  # a new pod, up since 550 s: starting
    "ready": "1x60",  # ready since its start: not starting
    "crashloop": "1x10 0x4 1x10 0x4 1x10 0x4 1x17",  # down three times: crash-looping
    "crashed-once": "1x40 0x2 1x18",  # one crash, loading again: starting
    "stuck": "1x60",  # up and loading for 10 minutes: starting, unless past the bound
    "loading": "_x40 1x20",  # loading for 200 s: starting
}


def _promtool(tmp_path: Path, checks: list[tuple[str, float]]) -> str:
    assert PROMTOOL is not None
    series = [
        {"series": f'up{{{SEL},job="pods",instance="{pod}:9090"}}', "values": values} for pod, values in PODS.items()
    ]
    # the ready pod's start phases (a ready pod exports its ``ready`` phase from then on)
    series.append({"series": f'sluiceway_start_phase_seconds{{{SEL},job="pods",instance="ready:9090",phase="ready"}}',
                   "values": "0.5x60"})
    doc = {
        "rule_files": [],
        "evaluation_interval": "10s",
        "tests": [{
            "interval": "10s",
            "input_series": series,
            "promql_expr_test": [
                {"expr": expr, "eval_time": "600s", "exp_samples": [{"labels": "{}", "value": value}]}
                for expr, value in checks
            ],
        }],
    }
    path = tmp_path / "starting_test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_crash_looping_and_stuck_pods_are_not_starting(tmp_path: Path) -> None:
    bound = starting_bound(80.0)  # a measured start-up of 80 s: 3 x 80 + 60 = 300 s
    assert bound == 300.0
    old_rule = f'sum(up{{{SEL}}} == 1) - count(sluiceway_start_phase_seconds{{{SEL},phase="ready"}})'
    out = _promtool(tmp_path, [
        (Q.starting_pods(None), 4.0),  # fresh, crashed-once, stuck, loading; not crashloop
        (Q.starting_pods(bound), 3.0),  # and not stuck: up and loading since 300 s ago
        (old_rule, 5.0),  # the rule before: the crash-looping pod counted as starting
        (f"sum(resets(up{{{SEL},instance=\"crashloop:9090\"}}[10m]))", 3.0),
    ])
    print(out)


def test_the_bound_needs_a_measured_start_up() -> None:
    assert starting_bound(None) is None
    assert starting_bound(float("nan")) is None
    assert starting_bound(0.0) is None
    assert Q.starting_pods(None) == Q.pods_starting
    with pytest.raises(ValueError, match="positive"):
        Q.starting_pods(-1.0)
    assert "offset 300s" in Q.starting_pods(300.0)
