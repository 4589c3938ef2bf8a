"""Start, watch and stop the servers under test, each as a subprocess on loopback.

Every server runs in its own process pinned to one core (``os.sched_setaffinity`` in the child
before ``exec``; LitServe's worker processes inherit it), with ``OMP_NUM_THREADS=1`` and access
logs off; the load generator pins itself to another core. Each benchmark point gets a fresh server,
so a backlog left by one point (the baseline's queue is unbounded) cannot leak into the next.

Every server can say how many requests it has *started computing* (:meth:`ServerProc.computed`):
the pod from ``sluiceway_batch_size_sum`` in ``/metrics`` (requests dispatched to the device), the
baselines from their own counter. That count is the denominator of "wasted work".

Concurrency model: plain blocking calls from the benchmark's main thread, except
:meth:`ServerProc.computed`, a coroutine run on the load generator's loop as a probe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
SERVER_CORE = 0
CLIENT_CORE = 1


def cores() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set()


def pinning_possible() -> bool:
    return {SERVER_CORE, CLIENT_CORE} <= cores()


def pin_self(core: int) -> bool:
    """Pin the calling process to ``core``; False when that is not possible here."""
    try:
        os.sched_setaffinity(0, {core})
        return True
    except (AttributeError, OSError, ValueError):
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_average() -> str:
    try:
        a, b, c = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{a:.2f} {b:.2f} {c:.2f}"


@dataclass
class ServerProc:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    infer_path: str
    ready_path: str
    log_path: Path
    counter_file: Path | None = None
    metadata: dict[str, object] = field(default_factory=dict)
    metrics_port: int | None = None  # the pod's separate /metrics port

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port or self.port}/metrics"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def infer_url(self) -> str:
        return self.base + self.infer_path

    def wait_ready(self, timeout: float = 90.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log: {self.log_path}\n"
                                   + self.log_tail())
            try:
                with urllib.request.urlopen(self.base + self.ready_path, timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready within {timeout:.0f}s; log: {self.log_path}\n"
                           + self.log_tail())

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    async def computed(self, session: aiohttp.ClientSession | None = None) -> float:
        """Requests this server has started computing so far."""
        if self.counter_file is not None:
            raw = self.counter_file.read_bytes().strip() if self.counter_file.exists() else b""
            return float(raw or 0)
        own = session is None
        s = session or aiohttp.ClientSession()
        try:
            if self.name.startswith("sluiceway"):
                async with s.get(self.metrics_url) as r:
                    text = await r.text()
                for line in text.splitlines():
                    if line.startswith("sluiceway_batch_size_sum{"):
                        return float(line.rsplit(" ", 1)[1])
                raise RuntimeError("sluiceway_batch_size_sum not found in /metrics")
            async with s.get(self.base + "/stats") as r:
                doc = await r.json()
            return float(doc["started"])
        finally:
            if own:
                await s.close()

    def cpu_stats(self) -> dict[str, float]:
        """CPU seconds used and seconds spent runnable but waiting for a CPU (``schedstat``), summed
        over every thread of every process in the server's process group. The wait is how much
        the server was held back by other work on its core: the noise of a shared machine."""
        cpu = wait = 0.0
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                if os.getpgid(int(pid_dir.name)) != self.proc.pid:
                    continue
                for task in (pid_dir / "task").iterdir():
                    run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
                    cpu += int(run_ns) / 1e9
                    wait += int(wait_ns) / 1e9
            except (OSError, ValueError):
                continue
        return {"cpu_s": cpu, "runq_wait_s": wait}

    async def cpu_probe(self) -> dict[str, float]:
        return self.cpu_stats()

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        # LitServe leaves worker processes in the group: make sure none outlive the point.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode


def _preexec(core: int | None) -> Callable[[], None]:
    def setup() -> None:
        os.setsid()  # own process group: stop() ends the server and any children it spawned
        if core is not None:
            with contextlib.suppress(OSError, ValueError):
                os.sched_setaffinity(0, {core})

    return setup


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    paths = [str(REPO), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _spawn(name: str, argv: Sequence[str], log_dir: Path, core: int | None, env: dict[str, str]) -> tuple[
        subprocess.Popen[bytes], Path]:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{int(time.time() * 1000)}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(REPO), preexec_fn=_preexec(core))
    return proc, log_path


def start_pod(
    log_dir: Path,
    *,
    service_ms: float = 20.0,
    config_file: Path | None = None,
    extra: Sequence[str] = (),
    core: int | None = SERVER_CORE,
    name: str = "sluiceway",
) -> ServerProc:
    """``sluiceway-pod serve`` with ``synthetic:<ms>``, one permit, ``--max-queue auto``, unless a
    config file says otherwise (flags still win over the file)."""
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "sluiceway_pod.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--metrics-port", str(metrics_port)]
    if config_file is not None:
        argv += ["--config", str(config_file)]
    else:
        argv += ["--model", f"synthetic:{service_ms:g}", "--concurrency", "1", "--max-queue", "auto"]
    argv += list(extra)
    env = _env()
    env.setdefault("SLUICEWAY_SERVER__LOG_LEVEL", "warning")
    proc, log = _spawn(name, argv, log_dir, core, env)
    srv = ServerProc(name, proc, port, "/v2/models/demo/infer", "/v2/health/ready", log, metrics_port=metrics_port)
    srv.wait_ready()
    with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
        import json

        with urllib.request.urlopen(srv.base + "/v2/models/demo", timeout=5) as r:
            srv.metadata = json.loads(r.read()).get("parameters", {})
    return srv


def start_fastapi(log_dir: Path, *, service_ms: float = 20.0, core: int | None = SERVER_CORE) -> ServerProc:
    port = free_port()
    argv = [sys.executable, "-m", "bench.baseline_fastapi", "--port", str(port),
            "--service-ms", f"{service_ms:g}"]
    proc, log = _spawn("fastapi", argv, log_dir, core, _env())
    srv = ServerProc("fastapi", proc, port, "/v2/models/demo/infer", "/v2/health/ready", log)
    srv.wait_ready()
    return srv


def start_seedafter(log_dir: Path, *, service_ms: float = 20.0, core: int | None = SERVER_CORE,
                    threads: int = 1) -> ServerProc:
    """The seed's "after" design: FastAPI + ``asyncio.Semaphore(threads)`` acquired with a 30 s
    timeout (then 503) + a thread pool of the same size (:mod:`bench.baseline_pool`)."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.baseline_pool", "--port", str(port), "--spec", f"synthetic:{service_ms:g}",
            "--threads", str(threads), "--guard", "semaphore", "--acquire-timeout", "30"]
    proc, log = _spawn("seedafter", argv, log_dir, core, _env())
    srv = ServerProc("seedafter", proc, port, "/v2/models/demo/infer", "/v2/health/ready", log)
    srv.wait_ready()
    return srv


def litserve_available() -> bool:
    try:
        import litserve  # noqa: F401
    except ImportError:
        return False
    return True


def start_litserve(
    log_dir: Path, *, service_ms: float = 20.0, timeout_s: float = 0.2, core: int | None = SERVER_CORE
) -> ServerProc:
    port = free_port()
    counter = log_dir / f"litserve-count-{port}"
    counter.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "bench.baseline_litserve", "--port", str(port), "--service-ms",
            f"{service_ms:g}", "--timeout", f"{timeout_s:g}", "--counter-file", str(counter)]
    proc, log = _spawn("litserve", argv, log_dir, core, _env())
    srv = ServerProc("litserve", proc, port, "/v2/models/demo/infer", "/health", log, counter_file=counter)
    srv.wait_ready(timeout=120)
    return srv


STARTERS = {"sluiceway": start_pod, "fastapi": start_fastapi, "litserve": start_litserve,
            "seedafter": start_seedafter}
