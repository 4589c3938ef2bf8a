"""Container processes: launched with ``ip netns exec <pod netns>`` (which also gives the process a
private mount namespace) and a small shell prologue that bind-mounts the pod's volumes, hosts file
and resolv.conf at their paths before ``exec``-ing the entrypoint. Each container leads its own
process group; stop = SIGTERM to the group, SIGKILL after the grace period."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..state import Recorded, signal_group, write_pid
from .volumes import Mount


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: str | None


#: Where host directories that a volume would hide are parked while the volumes are mounted.
KEEP_STAGE = "/run/sluiceway-keep"


def host_paths() -> list[str]:
    """Host directories the entrypoints run from: the Python installation and this checkout (an
    editable install imports the packages from it). A volume mounted over one of their parents (an
    emptyDir on ``/tmp`` while the checkout or a virtualenv lives under ``/tmp``) must not hide them."""
    checkout = str(Path(__file__).resolve().parents[3])
    return sorted({p for p in (sys.prefix, sys.base_prefix, checkout) if p and p != "/"})


def prologue(
    mounts: Sequence[Mount],
    hosts: Path | None,
    resolv: Path | None,
    cwd: str | None,
    keep: Sequence[str] = (),
) -> str:
    """The shell run inside the pod's namespaces before the entrypoint (pure; unit-tested).

    ``keep``: host directories that must stay visible; any of them under a mount target is bind-
    mounted aside first and back at its own path after the volumes (the mount namespace is private,
    so the host sees none of this). Read-only mounts turn read-only after every bind, so a mount
    point inside a read-only volume is created in that volume's directory first, as the kubelet
    does for API data volumes mounted within each other."""
    lines = ["set -e"]
    binds: list[Mount] = list(mounts)
    if hosts is not None:
        binds.append(Mount(hosts, "/etc/hosts", True))
    if resolv is not None:
        binds.append(Mount(resolv, "/etc/resolv.conf", True))
    hidden = [k for k in keep if any(_under(k, m.target) for m in binds)]
    for i, k in enumerate(hidden):
        lines.append(f"mkdir -p {KEEP_STAGE}/{i} && mount --bind {shlex.quote(k)} {KEEP_STAGE}/{i}")
    for m in order_mounts(binds):
        src, dst = shlex.quote(str(m.source)), shlex.quote(m.target)
        if m.source.is_dir():
            lines.append(f"mkdir -p {dst}")
        else:
            lines.append(f"mkdir -p $(dirname {dst}) && [ -e {dst} ] || : > {dst}")
        lines.append(f"mount --bind {src} {dst}")
    for i, k in enumerate(hidden):
        lines.append(f"mkdir -p {shlex.quote(k)} && mount --bind {KEEP_STAGE}/{i} {shlex.quote(k)}")
    # read-only last: a read-only volume may hold another volume's mount point (a secret within a
    # configMap's directory, as the kubelet allows), which must be made before the parent turns ro
    lines.extend(f"mount -o remount,bind,ro {shlex.quote(m.target)}" for m in order_mounts(binds) if m.read_only)
    if cwd:
        lines.append(f"cd {shlex.quote(cwd)}")
    lines.append('exec "$@"')
    return "\n".join(lines)


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


def order_mounts(mounts: Sequence[Mount]) -> list[Mount]:
    """Parents before children (as container runtimes do), and any mount whose target would hide
    another mount's source (an emptyDir on /tmp while the state dir is under /tmp) after it."""
    sources = [str(m.source) for m in mounts]

    def key(m: Mount) -> tuple[int, int]:
        hides = any(_under(src, m.target) for src in sources if src != str(m.source))
        return (1 if hides else 0, m.target.rstrip("/").count("/"))

    return sorted(mounts, key=key)


def launch(
    netns: str,
    spec: Launch,
    mounts: Sequence[Mount],
    hosts: Path | None,
    resolv: Path | None,
    log: Path,
    pid_file: Path,
) -> subprocess.Popen[bytes]:
    script = prologue(mounts, hosts, resolv, spec.cwd, host_paths())
    argv = ["ip", "netns", "exec", netns, "sh", "-c", script, "sluiceway-container", *spec.argv]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=spec.env,
            start_new_session=True,
        )
    write_pid(pid_file, proc.pid)
    return proc


def terminate(proc: subprocess.Popen[bytes], rec: Recorded | None, grace: float) -> int:
    """SIGTERM the container's group, wait up to ``grace`` seconds, then SIGKILL. Returns exit code."""
    if proc.poll() is None:
        _signal(proc, rec, signal.SIGTERM)
        deadline = time.monotonic() + max(grace, 0.0)
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            _signal(proc, rec, signal.SIGKILL)
    code = proc.wait(timeout=30)
    # Stragglers of the group (children that outlived the leader) go too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return code


def _signal(proc: subprocess.Popen[bytes], rec: Recorded | None, sig: int) -> None:
    if rec is not None:
        signal_group(rec, sig)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def base_env(path_dirs: Sequence[str], extra: Mapping[str, str]) -> dict[str, str]:
    env = {
        "PATH": ":".join([*path_dirs, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    }
    env.update(extra)
    return env
