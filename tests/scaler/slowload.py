"""A model factory for ``sluiceway-pod serve --model slowload:echo_after_sleep`` whose load takes
``SLOWLOAD_SECONDS`` (default 8): a pod whose metrics port answers while its model is still
loading, as a GPU pod's does while it downloads and loads weights. The runner echoes ``INPUT0``."""

from __future__ import annotations

import os
import time
from typing import Any


class _Echo:
    def __init__(self) -> None:
        from sluiceway_pod.models import TensorSpec

        self.inputs = [TensorSpec("INPUT0", "FP32", (-1, -1))]
        self.outputs = [TensorSpec("OUTPUT0", "FP32", (-1, -1))]
        self.device = "cpu"

    def predict(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"OUTPUT0": r["INPUT0"].copy()} for r in requests]


def echo_after_sleep() -> _Echo:
    time.sleep(float(os.environ.get("SLOWLOAD_SECONDS", "8")))
    return _Echo()


def crash_after_sleep() -> _Echo:
    """A model whose load fails after ``SLOWLOAD_SECONDS``: the pod's process exits, as a pod in a
    crash loop does (its metrics port answered while it loaded)."""
    time.sleep(float(os.environ.get("SLOWLOAD_SECONDS", "8")))
    raise RuntimeError("slowload: the model failed to load (on purpose)")
