"""A stand-in model whose service time is set by the request, for the routing benchmark.

Loaded by the pod as ``bench.sized_model:factory`` (``--model bench.sized_model:factory``; the
benchmark's pods run with the repository on ``PYTHONPATH``). The first value of ``INPUT0`` is the
request's service time in milliseconds (clamped to ``[0, MAX_MS]``); a batch takes the sum of its
requests' times. The answer echoes ``[[ms, pid]]`` as ``OUTPUT0``, so a client can tell which pod
served it (the pod's process id) without any header.

The time is slept, not spun: the pods' capacity is then set by the request sizes, not by how much
CPU the shared machine has left (their HTTP work still needs CPU).

Concurrency model: ``predict`` runs on the pod's device worker thread, one batch at a time per
permit; the runner holds no state between calls.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np
from sluiceway_pod.models import Tensors, TensorSpec

MAX_MS = 10_000.0


def service_ms(request: Tensors) -> float:
    """The service time a request asks for: the first value of its ``INPUT0``, clamped."""
    flat = np.asarray(request["INPUT0"], dtype=np.float64).reshape(-1)
    if flat.size == 0 or not np.isfinite(flat[0]):
        return 0.0
    return float(min(MAX_MS, max(0.0, flat[0])))


class SizedRunner:
    def __init__(self) -> None:
        self.inputs = [TensorSpec("INPUT0", "FP32", (-1, -1))]
        self.outputs = [TensorSpec("OUTPUT0", "FP32", (-1, -1))]
        self.device = "cpu"
        self.pid = float(os.getpid())

    def predict(self, requests: Sequence[Tensors]) -> list[Tensors]:
        times = [service_ms(r) for r in requests]
        time.sleep(sum(times) / 1000.0)
        return [{"OUTPUT0": np.array([[ms, self.pid]], dtype=np.float32)} for ms in times]


def factory() -> SizedRunner:
    return SizedRunner()
