"""Arrival traces: the offered request rate per simulated second, and seeded arrival counts.

A trace is a :class:`Trace`: ``rate[i]`` is the mean arrival rate (requests per second) during
second ``i``. :func:`arrivals` turns it into Poisson counts with a seeded generator, so every policy
of one comparison sees exactly the same requests (common random numbers).

Shapes (``peak`` is the highest rate; ``base`` the quiet rate):

- ``diurnal``: one day compressed into ``seconds`` — a raised cosine between ``base`` (night) and
  ``peak`` (afternoon), plus 5 % multiplicative noise per minute (seeded).
- ``flash``: ``base`` load, then 10x within one minute at 40 % of the trace, held 10 minutes, decaying
  over 10 minutes.
- ``ramp``: linear from ``base`` to ``peak`` over the middle 80 % of the trace.
- ``onoff``: ``peak`` for ``on`` seconds, ``base`` for ``off`` seconds, repeated.
- ``stairs`` (issue 21): the sandbox demo's shape at scale: ``base``, then steps of 1.5x up to
  ``peak`` and back down the same stairs, each held the same time (4 h: 13 steps of ~18 min).
  Each step up is a sustained overload that new capacity absorbs: the queue and wait terms fade,
  the load terms must hold the count.
- ``bursty`` (issue 21): a mean that wanders between ``base`` and ``peak`` over hours, times a
  lognormal factor per minute (sigma 0.4, seeded), with 3-minute bursts of 3x every 25-50 minutes
  (seeded): the burstiness of production LLM traces (BurstGPT, Azure LLM), shorter than a start-up.
- ``idle`` (issue 20): an idle-heavy service, for scale to zero: idle gaps of 30-120 minutes with a
  lone request now and then (one per 30 minutes on average), and bursts of 1-5 minutes at 25-100 %
  of ``peak`` between them (seeded). Not in ``TRACES`` (the scaling goal's six): ``bench.scalesim.zero``
  runs it.
- ``csv:PATH``: replay of users' own logs. One request timestamp (seconds, float) per line, first
  column; a header line and ``#`` comments are skipped. Counts per second become the rate.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["TRACES", "Trace", "arrivals", "make_trace", "read_csv_trace"]

TRACES = ("diurnal", "flash", "ramp", "onoff", "stairs", "bursty")


@dataclass(frozen=True)
class Trace:
    name: str
    rate: np.ndarray  # requests/s, one entry per second

    @property
    def seconds(self) -> int:
        return int(self.rate.shape[0])


def diurnal(seconds: int, base: float, peak: float, seed: int) -> Trace:
    t = np.arange(seconds, dtype=float)
    phase = 2 * math.pi * t / seconds
    shape = 0.5 - 0.5 * np.cos(phase)  # 0 at midnight, 1 at midday
    rate = base + (peak - base) * shape
    rng = np.random.default_rng(seed + 7)
    minutes = seconds // 60 + 1
    noise = 1.0 + 0.05 * rng.standard_normal(minutes)
    rate = rate * np.repeat(noise, 60)[:seconds]
    return Trace("diurnal", np.clip(rate, 0.0, None))


def flash(seconds: int, base: float, seed: int, factor: float = 10.0) -> Trace:
    del seed
    rate = np.full(seconds, base, dtype=float)
    start = int(seconds * 0.4)
    rise, hold, decay = 60, 600, 600
    for i in range(seconds):
        d = i - start
        if 0 <= d < rise:
            rate[i] = base * (1 + (factor - 1) * d / rise)
        elif rise <= d < rise + hold:
            rate[i] = base * factor
        elif rise + hold <= d < rise + hold + decay:
            rate[i] = base * (factor - (factor - 1) * (d - rise - hold) / decay)
    return Trace("flash", rate)


def ramp(seconds: int, base: float, peak: float, seed: int) -> Trace:
    del seed
    t = np.arange(seconds, dtype=float)
    lo, hi = 0.1 * seconds, 0.9 * seconds
    frac = np.clip((t - lo) / (hi - lo), 0.0, 1.0)
    return Trace("ramp", base + (peak - base) * frac)


def onoff(seconds: int, base: float, peak: float, seed: int, on: int = 300, off: int = 900) -> Trace:
    del seed
    t = np.arange(seconds)
    period = on + off
    return Trace("onoff", np.where((t % period) < on, peak, base).astype(float))


def stairs(seconds: int, base: float, peak: float, seed: int, factor: float = 1.5) -> Trace:
    del seed
    levels = [base]
    while levels[-1] * factor < peak:
        levels.append(levels[-1] * factor)
    levels.append(peak)
    shape = levels + levels[-2::-1]
    rate = np.empty(seconds, dtype=float)
    per = max(1, seconds // len(shape))  # 4 h, base = peak / 10: 13 steps of ~18 min
    for i in range(seconds):
        rate[i] = shape[min(len(shape) - 1, i // per)]
    return Trace("stairs", rate)


def bursty(seconds: int, base: float, peak: float, seed: int) -> Trace:
    rng = np.random.default_rng(seed + 11)
    t = np.arange(seconds, dtype=float)
    mean = base + (peak / 3 - base) * (0.5 - 0.5 * np.cos(2 * math.pi * t / max(1, seconds) * 2))
    minutes = seconds // 60 + 1
    factor = np.exp(0.4 * rng.standard_normal(minutes) - 0.08)  # mean ~1
    rate = mean * np.repeat(factor, 60)[:seconds]
    at = int(rng.integers(600, 1800))
    while at < seconds:
        rate[at : at + 180] *= 3.0
        at += int(rng.integers(1500, 3000))
    return Trace("bursty", np.clip(rate, 0.0, peak))


def idle(seconds: int, peak: float, seed: int) -> Trace:
    rng = np.random.default_rng(seed + 13)
    rate = np.full(seconds, 1.0 / 1800.0)  # a lone request every 30 minutes on average
    at = int(rng.integers(600, 3600))
    while at < seconds:
        length = int(rng.integers(60, 301))
        rate[at : at + length] = peak * float(rng.uniform(0.25, 1.0))
        at += length + int(rng.integers(1800, 7201))
    return Trace("idle", rate)


def read_csv_trace(path: str | Path) -> Trace:
    """Request timestamps (seconds) -> per-second rate. Raises ValueError naming the bad line."""
    stamps: list[float] = []
    with open(path, newline="", encoding="utf-8") as fh:
        for n, row in enumerate(csv.reader(fh), 1):
            if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
                continue
            try:
                stamps.append(float(row[0]))
            except ValueError:
                if n == 1:
                    continue  # header
                raise ValueError(f"{path}:{n}: not a timestamp: {row[0]!r}") from None
    if not stamps:
        raise ValueError(f"{path}: no timestamps")
    arr = np.asarray(stamps)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{path}: timestamps must be finite numbers")
    arr = arr - arr.min()
    seconds = int(arr.max()) + 1
    counts = np.bincount(arr.astype(int), minlength=seconds).astype(float)
    return Trace(f"csv:{Path(path).name}", counts)


def make_trace(spec: str, seconds: int, peak: float, seed: int) -> Trace:
    """``diurnal|flash|ramp|onoff|stairs|bursty|idle|csv:PATH``; ``peak`` in requests/s (ignored for csv)."""
    if spec.startswith("csv:"):
        return read_csv_trace(spec[4:])
    base = peak / 10.0
    if spec == "diurnal":
        return diurnal(seconds, base, peak, seed)
    if spec == "flash":
        return flash(seconds, base, seed)
    if spec == "ramp":
        return ramp(seconds, base, peak, seed)
    if spec == "onoff":
        return onoff(seconds, base, peak, seed)
    if spec == "stairs":
        return stairs(seconds, base, peak, seed)
    if spec == "bursty":
        return bursty(seconds, base, peak, seed)
    if spec == "idle":
        return idle(seconds, peak, seed)
    raise ValueError(f"unknown trace {spec!r} ({', '.join(TRACES)}, idle, csv:PATH)")


def arrivals(trace: Trace, seed: int) -> np.ndarray:
    """Poisson arrival counts per second (seeded). A replayed CSV trace is used as recorded."""
    if trace.name.startswith("csv:"):
        return trace.rate.astype(np.int64)
    rng = np.random.default_rng(seed)
    return rng.poisson(trace.rate).astype(np.int64)
