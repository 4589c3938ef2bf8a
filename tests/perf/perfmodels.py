"""CPU test models whose "device memory" is a :class:`~sluiceway_pod.sizing.SimulatedDeviceMemory`,
read by the runtime through the same :class:`~sluiceway_pod.sizing.MemoryProbe` interface as CUDA's.

:class:`HungryRunner` holds ``bytes_per_element x elements x scale`` bytes of device memory for the
whole forward pass (``hold_ms``), as a decode loop does; ``scale`` is the first value of the
batch, so a client can make requests of the same shape need more memory. Allocation failure is
the device OOM (``DeviceOOMSignal``). ``serial`` makes concurrent calls queue on one lock (a
device with no parallelism left: more permits only wait on each other).

Loaded by the pod as ``perf.perfmodels:hungry``; knobs come from the environment (a factory takes
no arguments): ``HUNGRY_TOTAL_BYTES``, ``HUNGRY_BYTES_PER_ELEMENT``, ``HUNGRY_HOLD_MS``,
``HUNGRY_SERIAL`` (``1``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

import numpy as np
from sluiceway_pod.models import DeviceOOMSignal, Tensors, TensorSpec
from sluiceway_pod.sizing import SimulatedDeviceMemory, SimulatedOOM


class HungryRunner:
    def __init__(self, total: int, bytes_per_element: int, hold_ms: float, serial: bool = False,
                 inputs: list[TensorSpec] | None = None) -> None:
        self.memory_probe = SimulatedDeviceMemory(total)
        self.bytes_per_element = bytes_per_element
        self.hold = hold_ms / 1000.0
        self.inputs = inputs or [TensorSpec("INPUT0", "FP32", (-1, -1))]
        self.outputs = [TensorSpec("OUTPUT0", "FP32", (-1, -1))]
        self.device = "sim"
        self._serial = threading.Lock() if serial else None
        self.calls = 0

    def need(self, requests: Sequence[Tensors]) -> int:
        scale = max(1.0, float(np.asarray(requests[0]["INPUT0"]).reshape(-1)[0])) if requests else 1.0
        elements = sum(int(np.asarray(r["INPUT0"]).size) for r in requests)
        return int(elements * self.bytes_per_element * scale)

    def predict(self, requests: Sequence[Tensors]) -> list[Tensors]:
        n = self.need(requests)
        try:
            self.memory_probe.allocate(n)
        except SimulatedOOM as e:
            raise DeviceOOMSignal(str(e)) from e
        try:
            if self._serial is not None:
                with self._serial:
                    time.sleep(self.hold)
            else:
                time.sleep(self.hold)
            self.calls += 1
            return [{"OUTPUT0": np.asarray(r["INPUT0"], dtype=np.float32) * 2} for r in requests]
        finally:
            self.memory_probe.release(n)


def hungry() -> HungryRunner:
    env = os.environ
    return HungryRunner(
        int(env.get("HUNGRY_TOTAL_BYTES", str(1 << 30))),
        int(env.get("HUNGRY_BYTES_PER_ELEMENT", "1000")),
        float(env.get("HUNGRY_HOLD_MS", "20")),
        env.get("HUNGRY_SERIAL") == "1",
    )
