"""Issue 10, item 16: ``sluiceway-pod --help`` and every subcommand print plain, useful help (no raw RST)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

RST = re.compile(r"``|:(class|mod|func|meth|data|attr):`|\.\. [a-z]+::")


@pytest.mark.parametrize("args", [[], ["serve"], ["check-config"]])
def test_help_is_plain_text_and_names_every_flag(args: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sluiceway_pod.cli", *args, "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert not RST.search(text), text
    assert text.startswith("usage: sluiceway-pod")
    assert "SLUICEWAY_" in text and "Examples:" in text
    if args:
        for flag in ("--config", "--port", "--metrics-port", "--model", "--concurrency", "--max-queue"):
            assert flag in text, flag
    else:
        assert "serve" in text and "check-config" in text
