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
