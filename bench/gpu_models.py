"""Models for ``bench/gpu_check.py``, loaded by the pod (and the thread-pool peer) as
``bench.gpu_models:<factory>``. Knobs come from ``GC_*`` environment variables (a factory takes no
arguments); ``GC_DEVICE=cpu`` makes the memory-hungry ones keep their "device memory" in a
:class:`~sluiceway_pod.sizing.SimulatedDeviceMemory` of ``GC_SIM_TOTAL`` bytes, read by the pod
through the same MemoryProbe interface as CUDA's allocator.

* ``hungry``: holds ``GC_HUNGRY_BYTES`` of device memory per request row for the whole request,
  ``GC_STEPS`` steps of ``GC_STEP_MS`` each with a host sync per step (a decode loop). Input
  ``(-1, 16)``, output = 2 x input.
* ``image``: a ``(-1, 3, -1, -1)`` image model whose memory grows with the image: a 3 -> ``GC_CHANNELS``
  convolution kept alive for the steps above, then a global mean. Output ``(-1, GC_CHANNELS)``.
* ``cnn``: a small seeded CNN on ``(-1, 3, 96, 96)`` -> ``(-1, 10)``, the correctness reference.
* ``gemm``: device-bound: ``GC_GEMM_REPS`` products of ``GC_GEMM_N`` square matrices with a host
  sync, per batch. Input ``(-1, 16)``, output = 2 x input.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sluiceway_pod.models import DeviceOOMSignal, Tensors, TensorSpec
from sluiceway_pod.sizing import SimulatedDeviceMemory, SimulatedOOM


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _steps() -> tuple[int, float]:
    return int(_env("GC_STEPS", "20")), float(_env("GC_STEP_MS", "5")) / 1000.0


def _cpu() -> bool:
    return _env("GC_DEVICE", "cuda") == "cpu"


class SimRunner:
    """A CPU runner holding simulated device memory: ``need(batch)`` bytes for ``steps`` steps."""

    def __init__(self, inputs: list[TensorSpec], outputs: list[TensorSpec],
                 need: Callable[[Tensors], int], compute: Callable[[Tensors], Tensors]) -> None:
        self.memory_probe = SimulatedDeviceMemory(int(_env("GC_SIM_TOTAL", str(1 << 30))))
        self.inputs, self.outputs, self.device = inputs, outputs, "sim"
        self._need, self._compute = need, compute
        self.steps, self.step_s = _steps()

    def predict(self, requests: Sequence[Tensors]) -> list[Tensors]:
        out = []
        for r in requests:  # one allocation per request, all held for the whole batch
            n = self._need(r)
            try:
                self.memory_probe.allocate(n)
            except SimulatedOOM as e:
                raise DeviceOOMSignal(str(e)) from e
            out.append(n)
        try:
            time.sleep(self.steps * self.step_s)
            return [self._compute(r) for r in requests]
        finally:
            for n in out:
                self.memory_probe.release(n)


def hungry() -> Any:
    per_row = int(_env("GC_HUNGRY_BYTES", str(64 << 20)))
    if _cpu():
        return SimRunner([TensorSpec("INPUT0", "FP32", (-1, 16))], [TensorSpec("OUTPUT0", "FP32", (-1, 16))],
                         lambda r: per_row * int(r["INPUT0"].shape[0]), lambda r: {"OUTPUT0": r["INPUT0"] * 2})
    import torch

    steps, step_s = _steps()

    class Hungry(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            buf = torch.empty(per_row * x.shape[0] // 4, dtype=torch.float32, device=x.device)
            buf.zero_()
            acc = 0.0
            for i in range(steps):  # a decode loop: one host sync per step, memory held throughout
                acc += float(buf[i])
                time.sleep(step_s)
            return x * 2 + acc

    return Hungry()


def image() -> Any:
    channels = int(_env("GC_CHANNELS", "64"))
    if _cpu():
        return SimRunner(
            [TensorSpec("INPUT0", "FP32", (-1, 3, -1, -1))], [TensorSpec("OUTPUT0", "FP32", (-1, channels))],
            lambda r: int(r["INPUT0"].size // 3 * channels * 4),
            lambda r: {"OUTPUT0": np.repeat(r["INPUT0"].mean(axis=(1, 2, 3))[:, None], channels, axis=1)},
        )
    import torch

    steps, step_s = _steps()

    class Image(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu_(self.conv(x))
            acc = 0.0
            for _ in range(steps):  # activations held across host-synced steps
                acc += float(y[0, 0, 0, 0])
                time.sleep(step_s)
            return y.mean(dim=(2, 3)) + 0 * acc

    return Image()


def build_cnn() -> Any:
    import torch

    gen = torch.Generator().manual_seed(20261201)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    )
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return net


def cnn() -> Any:
    return build_cnn()


def gemm() -> Any:
    import torch

    n, reps = int(_env("GC_GEMM_N", "4096")), int(_env("GC_GEMM_REPS", "8"))

    class Gemm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            gen = torch.Generator().manual_seed(7)
            self.register_buffer("w", torch.randn(n, n, generator=gen) / n**0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = self.w
            for _ in range(reps):
                a = a @ self.w
            return x * 2 + 0 * float(a[0, 0])  # host sync: the batch holds its permit until done

    return Gemm()
