"""Test-only models loaded by the pod through ``module:factory`` specs."""

from __future__ import annotations

import torch


class OOMByValue(torch.nn.Module):
    """Doubles its input, but simulates CUDA running out of memory by the first value of a batch:
    7 -> out of memory on the first attempt only; 13 -> out of memory every time."""

    def __init__(self) -> None:
        super().__init__()
        self.seen_seven = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = float(x.reshape(-1)[0])
        if first == 13.0 or (first == 7.0 and not self.seen_seven):
            self.seen_seven = self.seen_seven or first == 7.0
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return x * 2


def oom_model() -> torch.nn.Module:
    return OOMByValue()


class Boom(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < 0).any()):
            raise RuntimeError("negative input breaks this model")
        return x + 1


def boom_model() -> torch.nn.Module:
    return Boom()


class ShortRunner:
    """A broken runner that drops the last result of every batch of two or more."""

    def __init__(self) -> None:
        from sluiceway_pod.models import TensorSpec

        self.inputs = [TensorSpec("INPUT0", "FP32", (-1, -1))]
        self.outputs = [TensorSpec("OUTPUT0", "FP32", (-1, -1))]
        self.device = "cpu"

    def predict(self, requests):  # type: ignore[no-untyped-def]
        out = [{"OUTPUT0": r["INPUT0"]} for r in requests]
        return out[:-1] if len(out) > 1 else out


def short_runner() -> ShortRunner:
    return ShortRunner()


class _EchoRunner:
    """A runner without torch: FP32 ``INPUT0`` [-1, -1] in, the same values as ``OUTPUT0`` out."""

    def __init__(self) -> None:
        from sluiceway_pod.models import TensorSpec

        self.inputs = [TensorSpec("INPUT0", "FP32", (-1, -1))]
        self.outputs = [TensorSpec("OUTPUT0", "FP32", (-1, -1))]
        self.device = "cpu"

    def first(self, requests):  # type: ignore[no-untyped-def]
        return float(requests[0]["INPUT0"].reshape(-1)[0])

    def echo(self, requests):  # type: ignore[no-untyped-def]
        return [{"OUTPUT0": r["INPUT0"].copy()} for r in requests]


class HangRunner(_EchoRunner):
    """A hung device: a batch whose first value is 666 never returns (the thread blocks for good)."""

    def __init__(self) -> None:
        import threading

        super().__init__()
        self._never = threading.Event()

    def predict(self, requests):  # type: ignore[no-untyped-def]
        if self.first(requests) == 666.0:
            self._never.wait()
        return self.echo(requests)


def hang_runner() -> HangRunner:
    return HangRunner()


class ChaosRunner(_EchoRunner):
    """Fast echo, except: a negative first value raises (with a secret in the message), 999 sleeps
    0.3 s (longer than the faults test's execution budget)."""

    def predict(self, requests):  # type: ignore[no-untyped-def]
        import time

        v = self.first(requests)
        if v < 0:
            raise RuntimeError("SECRET-db-password=hunter2 leaked by the model")
        if v == 999.0:
            time.sleep(0.3)
        return self.echo(requests)


def chaos_runner() -> ChaosRunner:
    return ChaosRunner()


def mlp_16_4() -> torch.nn.Module:
    """The module a safetensors weights file fills (``podmodels:mlp_16_4@/path/model.safetensors``):
    16 -> 32 -> 4, weights left as initialised (the file must set every one)."""
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
