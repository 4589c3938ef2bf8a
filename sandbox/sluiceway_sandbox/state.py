"""PID files: every process the sandbox starts is recorded as ``<pid> <start time>`` so that ``down``
stops exactly those processes (never a process that merely reused the PID), also after a crash.
Each process leads its own process group; stopping signals the whole group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); None if gone/zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return fields[19]


@dataclass(frozen=True)
class Recorded:
    name: str
    pid: int
    start: str
    path: Path

    def alive(self) -> bool:
        return proc_start_time(self.pid) == self.start


def write_pid(path: Path, pid: int) -> Recorded:
    start = proc_start_time(pid) or "0"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{pid} {start}\n")
    tmp.replace(path)
    return Recorded(path.stem, pid, start, path)


def read_pid(path: Path) -> Recorded | None:
    try:
        pid_s, start = path.read_text().split()
        return Recorded(path.stem, int(pid_s), start, path)
    except (OSError, ValueError):
        return None


def recorded(directory: Path) -> list[Recorded]:
    if not directory.is_dir():
        return []
    out = []
    for p in sorted(directory.glob("*.pid")):
        r = read_pid(p)
        if r is not None:
            out.append(r)
    return out


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    pid_file: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session, output appended to ``log``, PID recorded in ``pid_file``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    write_pid(pid_file, proc.pid)
    return proc


def signal_group(rec: Recorded, sig: int) -> None:
    if not rec.alive():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(rec.pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(rec.pid, sig)


def stop(rec: Recorded, grace: float = 10.0) -> bool:
    """SIGTERM the process group, SIGKILL after ``grace`` seconds; remove the PID file. True if it
    was running."""
    was = rec.alive()
    if was:
        signal_group(rec, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while rec.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if rec.alive():
            signal_group(rec, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while rec.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
    with contextlib.suppress(FileNotFoundError):
        rec.path.unlink()
    return was
