"""Model runners: what actually computes. Loaded once, called from worker threads.

A runner takes a *list* of requests (each a dict of named numpy arrays) and returns one dict of
named numpy arrays per request. Runners whose inputs all have a leading batch dimension (``-1``)
concatenate the requests along dim 0, run one forward pass and split the outputs back.

Specs:
    ``demo``                a small MLP built deterministically at start (seeded), 16 -> 4, no download
    ``synthetic:<ms>``      holds the device for exactly ``ms`` per forward pass; output = input
    ``/path/model.pt``      a TorchScript file (``torch.jit.load``)
    ``/path/model.pt2``     a ``torch.export`` program (``torch.export.load``)
    ``/path/model.onnx``    ONNX through ``onnxruntime`` (CPU provider, CUDA provider on a CUDA device)
    ``/path/dir``           the one model file in the directory (where ``sluiceway-pod fetch`` put it)
    ``mod:factory@/path/model.safetensors``  ``factory()`` builds the module, the file fills its weights
    ``module:factory``      ``factory()`` returns a ``torch.nn.Module`` or a ready runner object

The format of a file is read from its content (see :mod:`sluiceway_pod.formats`); inputs and outputs
come from the model where the format carries them (ONNX, ``.pt2``), and ``model.inputs``/``outputs``
override them.

Concurrency: runners are called from at most ``permits`` worker threads at once; the torch ones run
under ``torch.inference_mode`` and move outputs to the CPU before returning.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sluiceway_core.config import ModelConfig, TensorSpecConfig

Tensors = dict[str, np.ndarray]

DTYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
NP_TO_OIP = {np.dtype(v).str: k for k, v in DTYPES.items()}


class DeviceOOMSignal(Exception):
    """Raised by a runner's ``run_batch`` when the device is out of memory (the runner translates
    CUDA's error into this, so the dispatcher and admission core never import torch)."""



def oip_datatype(arr: np.ndarray) -> str:
    try:
        return NP_TO_OIP[arr.dtype.str]
    except KeyError:
        raise TypeError(f"unsupported output dtype {arr.dtype}") from None


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]
    max_shape: tuple[int, ...] | None = None  # the largest accepted shape (config ``maxShape``)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


class Runner(Protocol):
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    device: str

    def predict(self, requests: Sequence[Tensors]) -> list[Tensors]: ...


def _specs(items: list[TensorSpecConfig] | None, default: list[TensorSpec]) -> list[TensorSpec]:
    if items is None:
        return default
    return [
        TensorSpec(i.name, i.datatype, tuple(i.shape), tuple(i.max_shape) if i.max_shape is not None else None)
        for i in items
    ]


def exceeds_max_shape(spec: TensorSpec, shape: Sequence[int]) -> str | None:
    """Why ``shape`` is larger than the input's declared ``maxShape``, or None when it fits.
    The decoder answers a non-None result with 400 (the memory sizing holds only up to it)."""
    if spec.max_shape is None:
        return None
    over = [i for i, (d, m) in enumerate(zip(shape, spec.max_shape, strict=False)) if d > m]
    if not over:
        return None
    return f"input {spec.name!r}: shape {list(shape)} exceeds maxShape {list(spec.max_shape)} in dims {over}"


def batchable(specs: Sequence[TensorSpec]) -> bool:
    return all(len(s.shape) >= 1 and s.shape[0] == -1 for s in specs)


def _concat(requests: Sequence[Tensors], names: Sequence[str]) -> tuple[Tensors, list[int]]:
    if len(requests) == 1:
        return dict(requests[0]), [0]
    rows = [next((int(a.shape[0]) for a in r.values() if a.ndim > 0), 0) for r in requests]
    return {n: np.concatenate([r[n] for r in requests], axis=0) for n in names}, rows


def _split(outputs: Tensors, rows: list[int]) -> list[Tensors]:
    if len(rows) == 1:
        return [outputs]
    bounds = np.cumsum([0, *rows])
    return [{k: v[bounds[i] : bounds[i + 1]] for k, v in outputs.items()} for i in range(len(rows))]


class TorchRunner:
    """Wraps a ``torch.nn.Module`` (or TorchScript module) taking positional tensors."""

    def __init__(
        self,
        module: Any,
        inputs: list[TensorSpec],
        outputs: list[TensorSpec],
        device: str,
        eval_mode: bool = True,
        platform: str = "pytorch",
    ) -> None:
        import torch

        self._torch = torch
        self.device = device
        self.platform = platform  # the format, as Triton's model metadata names it
        moved = module.to(device) if hasattr(module, "to") else module
        self.module = moved.eval() if eval_mode and hasattr(moved, "eval") else moved
        self.inputs = inputs
        self.outputs = outputs

    def predict(self, requests: Sequence[Tensors]) -> list[Tensors]:
        torch = self._torch
        names = [s.name for s in self.inputs]
        merged, rows = _concat(requests, names)
        try:
            with torch.inference_mode():
                args = [torch.from_numpy(np.ascontiguousarray(merged[n])).to(self.device) for n in names]
                out = self.module(*args)
                if isinstance(out, torch.Tensor):
                    out = (out,)
                elif isinstance(out, dict):
                    out = tuple(out[s.name] for s in self.outputs)
                result = {s.name: o.detach().to("cpu").numpy() for s, o in zip(self.outputs, out, strict=True)}
        except torch.cuda.OutOfMemoryError as e:
            raise DeviceOOMSignal(str(e)) from e
        return _split(result, rows)


def build_demo_module() -> Any:
    import torch

    gen = torch.Generator().manual_seed(20261130)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.25)
    return net


DEMO_INPUTS = [TensorSpec("INPUT0", "FP32", (-1, 16))]
DEMO_OUTPUTS = [TensorSpec("OUTPUT0", "FP32", (-1, 4))]


class SyntheticRunner:
    """Occupies its slot for exactly ``ms`` per forward pass (one pass per batch); echoes INPUT0."""

    def __init__(self, ms: float, inputs: list[TensorSpec], outputs: list[TensorSpec], device: str) -> None:
        self.seconds = ms / 1000.0
        self.inputs = inputs
        self.outputs = outputs
        self.device = device

    def predict(self, requests: Sequence[Tensors]) -> list[Tensors]:
        end = time.perf_counter() + self.seconds
        time.sleep(max(0.0, self.seconds - 0.0005))
        while time.perf_counter() < end:  # the last half millisecond, spun for precision
            pass
        src, dst = self.inputs[0].name, self.outputs[0].name
        return [{dst: np.array(r[src], copy=True)} for r in requests]


def pick_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_runner(cfg: ModelConfig | str, device: str | None = None) -> Runner:
    """Build the runner for a model spec (a :class:`ModelConfig` or a bare spec string)."""
    mc = ModelConfig(spec=cfg) if isinstance(cfg, str) else cfg
    spec = mc.spec
    if spec.startswith("synthetic:"):  # no torch import: starts in well under a second
        generic_in = [TensorSpec("INPUT0", "FP32", (-1, -1))]
        generic_out = [TensorSpec("OUTPUT0", "FP32", (-1, -1))]
        return SyntheticRunner(
            float(spec.split(":", 1)[1]),
            _specs(mc.inputs, generic_in),
            _specs(mc.outputs, generic_out),
            device or "cpu",
        )
    dev = device or pick_device()
    if spec == "demo":
        return TorchRunner(build_demo_module(), _specs(mc.inputs, DEMO_INPUTS), _specs(mc.outputs, DEMO_OUTPUTS), dev)
    from . import formats

    generic = ([TensorSpec("INPUT0", "FP32", (-1, -1))], [TensorSpec("OUTPUT0", "FP32", (-1, -1))])
    weighted = formats.split_safetensors_spec(spec)
    if weighted is not None:
        module = formats.load_safetensors(weighted[0], weighted[1], dev)
        return TorchRunner(
            module, _specs(mc.inputs, generic[0]), _specs(mc.outputs, generic[1]), dev, platform="pytorch_safetensors"
        )
    if spec.endswith(tuple(formats.MODEL_SUFFIXES)) or "/" in spec:
        path = formats.resolve_model_file(spec)
        kind = formats.detect_format(path)
        if kind == "onnx":
            onnx = formats.OnnxRunner(path, dev)
            onnx.inputs, onnx.outputs = _specs(mc.inputs, onnx.inputs), _specs(mc.outputs, onnx.outputs)
            return onnx
        if kind == "torch-export":
            module, ins, outs = formats.load_export(path, dev)
            ins, outs = _specs(mc.inputs, ins), _specs(mc.outputs, outs)
            return TorchRunner(module, ins, outs, dev, eval_mode=False, platform="pytorch_export")
        if kind == "safetensors":
            raise formats.ModelFormatError(
                f"{path} holds weights only: name the module that takes them, module:factory@{path}"
            )
        import torch

        module = torch.jit.load(path, map_location=dev)  # type: ignore[no-untyped-call]
        return TorchRunner(
            module, _specs(mc.inputs, generic[0]), _specs(mc.outputs, generic[1]), dev, platform="pytorch_torchscript"
        )
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        factory = getattr(importlib.import_module(mod_name), attr)
        obj = factory()
        if hasattr(obj, "predict") and hasattr(obj, "inputs"):
            # a ready runner; declared tensors in the config (e.g. with maxShape) take precedence
            obj.inputs = _specs(mc.inputs, obj.inputs)
            obj.outputs = _specs(mc.outputs, obj.outputs)
            return obj  # type: ignore[no-any-return]
        return TorchRunner(
            obj,
            _specs(mc.inputs, [TensorSpec("INPUT0", "FP32", (-1, -1))]),
            _specs(mc.outputs, [TensorSpec("OUTPUT0", "FP32", (-1, -1))]),
            dev,
        )
    raise ValueError(
        f"unknown model spec {spec!r}: use demo, synthetic:<ms>, a model file or directory (.pt, .pt2, .onnx), "
        "module:factory@weights.safetensors or module:factory"
    )


def example_request(specs: Sequence[TensorSpec], rows: int = 1) -> Tensors:
    """A deterministic input matching the specs: ``-1`` -> ``rows`` in dim 0, and elsewhere the
    declared ``maxShape`` (the largest request, which the memory probe must see) or 1."""
    out: Tensors = {}
    for s in specs:
        shape = tuple(
            (rows if i == 0 else (s.max_shape[i] if s.max_shape is not None else 1)) if d == -1 else d
            for i, d in enumerate(s.shape)
        )
        out[s.name] = np.ones(shape, dtype=DTYPES[s.datatype])
    return out


def max_rows(specs: Sequence[TensorSpec]) -> int:
    """Rows of the largest single request along the batch dimension: the smallest declared
    ``maxShape[0]`` among batchable inputs, 1 when none is declared."""
    declared = [s.max_shape[0] for s in specs if s.max_shape is not None and s.shape and s.shape[0] == -1]
    return min(declared) if declared else 1


def unsized_dims(specs: Sequence[TensorSpec]) -> list[str]:
    """Inputs with a variable non-batch dimension and no ``maxShape``: the probe sees size 1 there."""
    return [s.name for s in specs if s.max_shape is None and any(d == -1 for d in s.shape[1:])]
