"""The ``sluiceway`` command dispatches to the planner and to the sandbox."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sluiceway_cli.main import main


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "plan" in out and "sandbox" in out and "demo" in out


def test_unknown_command_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_plan_still_works_through_the_console_script() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sluiceway_cli.main", "plan", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "--target-wait-p95" in out.stdout


def test_sandbox_logs_of_an_unknown_pod(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "--state-dir", str(tmp_path), "logs", "nope"]) == 1
    assert "no logs for pod 'nope'" in capsys.readouterr().err
