"""How long each phase of this pod's start took (issue 22 §1, "cold start in phases"; the pod's half).

Phases, in order, each a duration in seconds:

``fetched``  the storage initializer (``sluiceway-pod fetch``, an init container) from its start to
             its end, read from :data:`FETCH_RECORD` in the model's directory when present (absent
             for a model that was not fetched: ``demo``, a baked-in ``module:factory``)
``loaded``   from the serving process's start to the model loaded
``warmed``   the warm-up iterations and the permits probe (:func:`sluiceway_pod.runtime.measure`),
             and the fallback model's load and warm-up when there is one
``ready``    from warmed to ready (the admission core, the dispatcher, the first quota lease)

They are exported as ``sluiceway_start_phase_seconds{phase}`` once reached, and as a document with
the wall-clock time of each boundary on the metrics port (``GET /debug/start``), so that the
operator can add what only it sees (the Pod's scheduling time, from its ``PodScheduled``
condition, to the fetch's start or the container's start) and put the whole cold start in the
InferenceService status.

Concurrency model: a :class:`StartPhases` is written by the data plane's start (on the event loop)
and read by the metrics endpoint (same loop). Durations come from the injected monotonic clock
within the process and from the fetch record's wall-clock times across processes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .clock import Clock

#: Written by ``sluiceway-pod fetch`` into its destination: ``{"started": t, "finished": t,
#: "bytes": n, "cached": bool}`` with wall-clock seconds since the epoch.
FETCH_RECORD = ".sluiceway-fetch-times.json"
PHASES = ("fetched", "loaded", "warmed", "ready")
_RECORD_MAX_BYTES = 4096


def model_dir(spec: str) -> Path | None:
    """The directory a model spec reads from: the spec itself when it is a directory, the file's
    directory when it is a file; None for ``demo``, ``synthetic:*`` and ``module:factory``."""
    p = Path(spec)
    try:
        if p.is_dir():
            return p
        if p.is_file():
            return p.parent
    except OSError:
        return None
    return None


def read_fetch_record(directory: Path | None) -> tuple[float, float] | None:
    """(started, finished) wall-clock seconds from the fetch record, or None when there is none or
    it is not one (never raises: a missing or odd record only leaves the phase out)."""
    if directory is None:
        return None
    try:
        with open(directory / FETCH_RECORD, "rb") as fh:
            raw = fh.read(_RECORD_MAX_BYTES + 1)
        if len(raw) > _RECORD_MAX_BYTES:
            return None
        doc = json.loads(raw)
        started, finished = float(doc["started"]), float(doc["finished"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not 0 < started <= finished:
        return None
    return started, finished


class StartPhases:
    """The boundaries of this process's start: ``mark(phase)`` as each is reached."""

    def __init__(
        self,
        clock: Clock,
        *,
        started: tuple[float, float] | None = None,
        wall: Callable[[], float] = time.time,
        fetch: tuple[float, float] | None = None,
        on_phase: Callable[[str, float], None] = lambda _p, _s: None,
    ) -> None:
        """``started``: (monotonic, wall) when the process started (default: now); ``fetch``: the
        fetch record's (started, finished); ``on_phase(phase, seconds)`` as each phase ends."""
        self.clock = clock
        self._wall = wall
        self._start = started if started is not None else (clock.now(), wall())
        self._marks: dict[str, tuple[float, float]] = {}  # phase -> (monotonic, wall) at its end
        self.fetch = fetch
        self._on_phase = on_phase
        if fetch is not None:
            on_phase("fetched", fetch[1] - fetch[0])

    def mark(self, phase: str) -> float:
        """``phase`` ended now; returns how long it took (first mark wins)."""
        if phase not in PHASES or phase == "fetched":
            raise ValueError(f"not a phase of the serving process: {phase!r}")
        if phase in self._marks:
            return self.seconds()[phase]
        self._marks[phase] = (self.clock.now(), self._wall())
        took = self.seconds()[phase]
        self._on_phase(phase, took)
        return took

    def seconds(self) -> dict[str, float]:
        """The duration of every phase reached so far."""
        out: dict[str, float] = {}
        if self.fetch is not None:
            out["fetched"] = round(self.fetch[1] - self.fetch[0], 6)
        prev = self._start[0]
        for phase in PHASES[1:]:
            mark = self._marks.get(phase)
            if mark is None:
                break
            out[phase] = round(max(0.0, mark[0] - prev), 6)
            prev = mark[0]
        return out

    def document(self) -> dict[str, Any]:
        """``GET /debug/start``: the durations, and the wall-clock time (seconds since the epoch) of
        each boundary: ``fetchStarted``, ``fetchFinished``, ``processStarted``, ``loaded``,
        ``warmed``, ``ready`` (absent until reached)."""
        at: dict[str, float] = {}
        if self.fetch is not None:
            at["fetchStarted"], at["fetchFinished"] = self.fetch
        at["processStarted"] = self._start[1]
        for phase in PHASES[1:]:
            if phase in self._marks:
                at[phase] = self._marks[phase][1]
        return {"phases": list(PHASES), "seconds": self.seconds(), "at": {k: round(v, 3) for k, v in at.items()}}
