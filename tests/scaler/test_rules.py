"""The shipped Prometheus rules load (`promtool check rules`) and behave on input series
(`promtool test rules`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "operator" / "sluiceway_scaler" / "rules.yaml"
TESTS = Path(__file__).parent / "rules" / "rules_test.yaml"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not found: apt-get install -y prometheus")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False)


def test_rules_check() -> None:
    r = _promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 11 rules found" in r.stdout


def test_rules_unit_tests(tmp_path: Path) -> None:
    test_file = tmp_path / "rules_test.yaml"
    test_file.write_text(TESTS.read_text().replace("RULES_PATH", str(RULES)))
    r = _promtool("test", "rules", str(test_file))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_rules_unit_tests_can_fail(tmp_path: Path) -> None:
    # The same tests against rules with a raised rejection threshold must fail: the tests are live.
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.read_text().replace("ratio_rate5m > 0.05", "ratio_rate5m > 0.5"))
    test_file = tmp_path / "rules_test.yaml"
    test_file.write_text(TESTS.read_text().replace("RULES_PATH", str(rules)))
    r = _promtool("test", "rules", str(test_file))
    assert r.returncode != 0
    assert "SluicewayRejectionsHigh" in r.stdout + r.stderr


def test_capacity_reasons_are_pod_reasons_and_cover_queue_losses() -> None:
    # The rules comment says which rejections count as capacity; keep the regex honest against the
    # pod's own taxonomy (a renamed reason would silently stop counting).
    import re

    import yaml
    from sluiceway_pod import errors

    rules = yaml.safe_load(RULES.read_text())
    record = "sluiceway:rejected_capacity:rate5m"
    expr = next(r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("record") == record)
    m = re.search(r'reason=~"([^"]+)"', expr)
    assert m is not None
    counted = set(m.group(1).split("|"))
    pod_reasons = {
        c.reason for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.SluicewayError)
    }
    assert counted <= pod_reasons, counted - pod_reasons
    assert {"queue_full", "displaced", "queue_timeout", "deadline", "deadline_expired", "overloaded"} <= counted
    assert not counted & {"invalid_input", "unauthenticated", "rate_limited", "tenant_queue_full", "draining"}
