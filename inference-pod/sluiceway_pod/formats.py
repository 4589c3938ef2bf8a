"""Model formats: which one a spec names, and the runners for those that are not plain TorchScript.

Detection (:func:`detect_format`) reads the file, not only its name:

    ``*.onnx``              ONNX (a protobuf ``ModelProto``: first byte 0x08, the ``ir_version`` field)
    ``*.pt2``               a ``torch.export`` program (a zip with ``<dir>/archive_format``)
    ``*.pt|.pth|.ts|...``   TorchScript (a zip with ``<dir>/data.pkl`` and ``<dir>/code/``)
    ``mod:factory@w.safetensors``  safetensors weights loaded into the module ``mod.factory()`` builds
    a directory             the one model file inside it (``sluiceway-pod fetch`` downloads into one)

A zip is told apart by its members whatever its extension, so a ``.pt`` that holds a ``torch.export``
program loads as one. Inputs and outputs come from the model where the format carries them (ONNX:
names, dtypes, dynamic dims as ``-1``; ``.pt2``: the forward's argument names, dtypes and symbolic
dims as ``-1``, outputs named ``OUTPUT0..``); ``model.inputs``/``model.outputs`` override them.

Concurrency: loading runs once, in the server's start-up thread. ``predict`` is called from at most
``permits`` worker threads at once: an ``onnxruntime.InferenceSession`` is safe to ``run`` from
several threads, and the torch runners run under ``torch.inference_mode``.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .models import DeviceOOMSignal, Tensors, TensorSpec, _concat, _split

FORMATS = ("torchscript", "torch-export", "onnx", "safetensors")
MODEL_SUFFIXES = {
    ".onnx": "onnx",
    ".pt2": "torch-export",
    ".pt": "torchscript",
    ".pth": "torchscript",
    ".ts": "torchscript",
    ".torchscript": "torchscript",
}

ONNX_DTYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
}
TORCH_DTYPES = {
    "torch.bool": "BOOL",
    "torch.uint8": "UINT8",
    "torch.int8": "INT8",
    "torch.int16": "INT16",
    "torch.int32": "INT32",
    "torch.int64": "INT64",
    "torch.float16": "FP16",
    "torch.float32": "FP32",
    "torch.float64": "FP64",
}


class ModelFormatError(ValueError):
    """The spec names no model this pod can load; the message says why and what would work."""


def resolve_model_file(path: str) -> str:
    """A file spec as is; a directory -> the one model file in it (by suffix, not recursing into
    hidden folders). More than one, or none, is an error naming what was found."""
    p = Path(path)
    if not p.is_dir():
        return path
    found = sorted(
        str(f)
        for f in p.rglob("*")
        if f.is_file() and f.suffix in MODEL_SUFFIXES and not any(x.startswith(".") for x in f.relative_to(p).parts)
    )
    if len(found) != 1:
        what = ", ".join(found) if found else f"no file ending in {', '.join(sorted(MODEL_SUFFIXES))}"
        raise ModelFormatError(f"model directory {path} must hold exactly one model file, found: {what}")
    return found[0]


def split_safetensors_spec(spec: str) -> tuple[str, str] | None:
    """``module:factory@/path/weights.safetensors`` -> (``module:factory``, the weights path)."""
    if "@" not in spec:
        return None
    factory, _, weights = spec.partition("@")
    if ":" not in factory or not weights:
        raise ModelFormatError(f"safetensors spec {spec!r}: use module:factory@/path/model.safetensors")
    return factory, weights


def _zip_kind(path: str) -> str | None:
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return None
    if any(n.endswith("/archive_format") or n == "archive_format" for n in names):
        return "torch-export"
    if any(n.endswith("/data.pkl") for n in names):
        return "torchscript"
    return None


def detect_format(path: str) -> str:
    """The format of a model file, from its content first and its suffix second."""
    if not os.path.isfile(path):
        raise ModelFormatError(f"model file {path} does not exist")
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head[:4] == b"PK\x03\x04":
        kind = _zip_kind(path)
        if kind is not None:
            return kind
        raise ModelFormatError(f"{path} is a zip archive but neither TorchScript nor a torch.export program")
    if len(head) >= 9 and head[8:9] == b"{" and path.endswith(".safetensors"):
        return "safetensors"
    suffix = Path(path).suffix
    if suffix == ".onnx" or (head[:1] == b"\x08" and suffix not in MODEL_SUFFIXES):
        if head[:1] != b"\x08":
            raise ModelFormatError(f"{path} ends in .onnx but is not an ONNX ModelProto")
        return "onnx"
    kind = MODEL_SUFFIXES.get(suffix)
    if kind is None:
        raise ModelFormatError(
            f"cannot tell the format of {path}: use .onnx, .pt2, a TorchScript .pt, or "
            "module:factory@weights.safetensors"
        )
    raise ModelFormatError(f"{path} ends in {suffix} but its content is not a {kind} archive")


def _dims(shape: Sequence[Any]) -> tuple[int, ...]:
    return tuple(int(d) if isinstance(d, int) and d >= 0 else -1 for d in shape)


def onnx_specs(session: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    def conv(args: Sequence[Any]) -> list[TensorSpec]:
        out = []
        for a in args:
            dt = ONNX_DTYPES.get(a.type)
            if dt is None:
                raise ModelFormatError(f"ONNX tensor {a.name!r} has type {a.type}, which OIP cannot carry")
            out.append(TensorSpec(a.name, dt, _dims(a.shape)))
        return out

    return conv(session.get_inputs()), conv(session.get_outputs())


def export_specs(program: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs/outputs of a ``torch.export.ExportedProgram`` from its graph's fake tensors."""
    user = list(program.graph_signature.user_inputs)
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}

    def spec(name: str, val: Any) -> TensorSpec:
        dt = TORCH_DTYPES.get(str(val.dtype))
        if dt is None:
            raise ModelFormatError(f"torch.export tensor {name!r} has dtype {val.dtype}, which OIP cannot carry")
        return TensorSpec(name, dt, _dims(list(val.shape)))

    inputs = [spec(n, nodes[n].meta["val"]) for n in user]
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    results = out_node.args[0]
    results = results if isinstance(results, (list, tuple)) else [results]
    outputs = [spec(f"OUTPUT{i}", r.meta["val"]) for i, r in enumerate(results)]
    return inputs, outputs


def onnx_providers(device: str, available: Sequence[str]) -> list[Any]:
    """The onnxruntime providers for a device: CUDA (device 0 or the one named) then CPU, or CPU.
    A CUDA device without the CUDA provider installed is an error, not a silent CPU fallback."""
    if not device.startswith("cuda"):
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        raise ModelFormatError(
            "the device is CUDA but onnxruntime has no CUDAExecutionProvider: install onnxruntime-gpu"
        )
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]


class DeviceMemoryProbe:
    """A memory probe that reads the whole device (``cudaMemGetInfo``): for runtimes with their own
    allocator (onnxruntime's arena), which torch's allocator statistics do not see. The arena keeps
    what it grew to, so the memory used after a pass is its peak. Thread-safe (reads only)."""

    def __init__(self) -> None:
        import torch

        self._cuda = torch.cuda
        self._peak = 0

    def free_total(self) -> tuple[int, int]:
        free, total = self._cuda.mem_get_info()
        return int(free), int(total)

    def allocated(self) -> int:
        free, total = self.free_total()
        return total - free

    def peak(self) -> int:
        self._peak = max(self._peak, self.allocated())
        return self._peak

    def reset_peak(self) -> None:
        self._peak = self.allocated()

    def synchronize(self) -> None:
        self._cuda.synchronize()

    def release_cache(self) -> None:
        pass


class OnnxRunner:
    """An ``onnxruntime`` session: CPU provider on CPU, CUDA provider (then CPU) on a CUDA device."""

    def __init__(self, path: str, device: str, intra_op_threads: int = 1) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads  # permits, not one pass, spread work over cores
        self._session = ort.InferenceSession(
            path, sess_options=opts, providers=onnx_providers(device, ort.get_available_providers())
        )
        self.device = device
        self.platform = "onnxruntime_onnx"  # Triton's name for the format
        self.inputs, self.outputs = onnx_specs(self._session)
        self.memory_probe = DeviceMemoryProbe() if device.startswith("cuda") else None

    def predict(self, requests: Sequence[Tensors]) -> list[Tensors]:
        names = [s.name for s in self.inputs]
        merged, rows = _concat(requests, names)
        feeds = {n: np.ascontiguousarray(merged[n]) for n in names}
        out_names = [s.name for s in self.outputs]
        try:
            values = self._session.run(out_names, feeds)
        except Exception as e:  # onnxruntime raises its own RuntimeException types
            if self.device.startswith("cuda") and "allocate memory" in str(e).lower():
                raise DeviceOOMSignal(str(e)) from e
            raise
        return _split(dict(zip(out_names, values, strict=True)), rows)


def load_export(path: str, device: str) -> tuple[Any, list[TensorSpec], list[TensorSpec]]:
    """A ``torch.export`` program: the callable module (moved to ``device``) and its tensors."""
    import torch

    program = torch.export.load(path)
    inputs, outputs = export_specs(program)
    module = program.module().to(device)  # an exported module refuses .eval(): it is already in eval form
    return module, inputs, outputs


def load_safetensors(factory_spec: str, weights: str, device: str) -> Any:
    """``factory()`` builds the module; the weights file must fill every parameter and buffer
    (``strict``): a missing or unexpected key is an error naming it."""
    import importlib

    from safetensors.torch import load_file

    mod_name, _, attr = factory_spec.partition(":")
    module = getattr(importlib.import_module(mod_name), attr)()
    if not os.path.isfile(weights):
        raise ModelFormatError(f"safetensors weights {weights} do not exist")
    state = load_file(weights, device="cpu")
    result = module.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ModelFormatError(
            f"weights {weights} do not fit {factory_spec}(): missing {list(result.missing_keys)}, "
            f"unexpected {list(result.unexpected_keys)}"
        )
    return module
