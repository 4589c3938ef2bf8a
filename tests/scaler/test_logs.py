"""``sluiceway-scaler serve --log-format plain|json`` (issue 23 §3): with ``json`` every line the
process logs is one JSON object with ``time`` (UTC, RFC 3339), ``level``, ``logger`` and
``message`` (and ``exception`` with a traceback); ``plain`` stays ``time level logger: message``.
The real CLI as a process (stderr read line by line), plus the formatter alone for a traceback and
a message with line breaks."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys

from scaler_support import ROOT

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _start_up(*args: str) -> tuple[str, list[str]]:
    """(stdout, stderr lines) of a scaler started with ``args`` and stopped once it has started."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'core'}{os.pathsep}{ROOT / 'operator'}")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluiceway_scaler.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            *args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        while not any("gRPC over" in ln for ln in lines):
            lines.append(proc.stderr.readline())
            assert lines[-1] and len(lines) < 20, lines
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=15)
    lines += err.splitlines(keepends=True)
    assert proc.returncode == 0, (out, lines)
    return out, [ln.rstrip("\n") for ln in lines if ln.strip()]


def test_json_logs_are_one_object_per_line_with_time_level_logger_message() -> None:
    _, lines = _start_up("--log-format", "json")
    docs = [json.loads(ln) for ln in lines]  # every line parses on its own
    assert len(docs) >= 3, lines  # the warning about no allow-list, the start-up line, the stop
    for doc in docs:
        assert {"time", "level", "logger", "message"} <= set(doc), doc
        assert TIME.match(doc["time"]), doc
        assert doc["logger"].startswith("sluiceway_scaler"), doc
    levels = {d["level"] for d in docs}
    assert {"WARNING", "INFO"} <= levels, docs
    assert any(d["message"].startswith("gRPC over plaintext") for d in docs), docs


def test_plain_logs_are_the_default() -> None:
    _, lines = _start_up()
    assert lines and all(not ln.startswith("{") for ln in lines), lines
    assert any(re.search(r" INFO sluiceway_scaler: gRPC over ", ln) for ln in lines), lines


def test_a_bad_log_format_is_refused() -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'core'}{os.pathsep}{ROOT / 'operator'}")
    out = subprocess.run(
        [sys.executable, "-m", "sluiceway_scaler.cli", "serve", "--log-format", "xml"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--log-format" in out.stderr, out.stderr


def test_json_formatter_keeps_a_traceback_and_line_breaks_inside_one_line() -> None:
    from sluiceway_core.logformat import configure_logging

    stream = io.StringIO()
    configure_logging("info", "json", stream)
    log = logging.getLogger("sluiceway_scaler.test")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("two\nlines")
    (line,) = stream.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["message"] == "two\nlines" and doc["level"] == "ERROR" and doc["logger"] == "sluiceway_scaler.test"
    assert "ValueError: boom" in doc["exception"]
