"""Open Inference Protocol v2 (KServe / Triton REST): request decoding and response encoding.

Transport-free and pure: bytes and header values in, numpy arrays out, and back. Supports JSON
tensors and the binary tensor data extension (``Inference-Header-Content-Length``), which is what
``tritonclient.http`` sends and asks for by default. Every client mistake raises
:class:`~sluiceway_pod.errors.InvalidInput` with a message naming the tensor and the problem.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from .errors import InvalidInput
from .models import DTYPES, TensorSpec, exceeds_max_shape, oip_datatype

HEADER_LEN = "inference-header-content-length"


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    binary_outputs: dict[str, bool] = field(default_factory=dict)  # per requested output
    requested: list[str] | None = None
    binary_default: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"request body is not valid JSON: {e}") from None


#: Flat JSON data lists longer than this are converted in slices of this many values, so a worker
#: thread decoding a huge body lets the event loop take the GIL between slices (probes stay fast).
CONVERT_SLICE = 65536


def _as_array(data: Any, dtype: np.dtype[Any]) -> np.ndarray:
    if not isinstance(data, list) or len(data) <= CONVERT_SLICE or isinstance(data[0], list):
        return np.asarray(data, dtype=dtype)
    out = np.empty(len(data), dtype=dtype)
    for i in range(0, len(data), CONVERT_SLICE):
        out[i : i + CONVERT_SLICE] = data[i : i + CONVERT_SLICE]
    return out


def decode_request(body: bytes, header_length: str | None, specs: Sequence[TensorSpec]) -> InferRequest:
    """Parse and validate an infer request against the model's declared inputs."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise InvalidInput("Inference-Header-Content-Length must be an integer") from None
        if not 0 < n <= len(body):
            raise InvalidInput(f"Inference-Header-Content-Length {n} is outside the body ({len(body)} bytes)")
        doc, binary = _loads(body[:n]), memoryview(body)[n:]
    else:
        doc, binary = _loads(body), memoryview(b"")
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    want = {s.name: s for s in specs}
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for i, t in enumerate(raw_inputs):
        if not isinstance(t, dict):
            raise InvalidInput(f"inputs[{i}] must be an object")
        name = t.get("name")
        if not isinstance(name, str) or name not in want:
            raise InvalidInput(f"inputs[{i}]: unknown input {name!r}; the model takes {sorted(want)}")
        if name in arrays:
            raise InvalidInput(f"input {name!r} given twice")
        spec = want[name]
        dtype_name = t.get("datatype")
        if dtype_name != spec.datatype:
            raise InvalidInput(f"input {name!r}: datatype {dtype_name!r}, expected {spec.datatype!r}")
        shape = t.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise InvalidInput(f"input {name!r}: shape must be a list of non-negative integers")
        if len(shape) != len(spec.shape) or any(w != -1 and w != d for w, d in zip(spec.shape, shape, strict=True)):
            raise InvalidInput(f"input {name!r}: shape {shape} does not match {list(spec.shape)} (-1 = any)")
        too_big = exceeds_max_shape(spec, shape)
        if too_big is not None:
            raise InvalidInput(too_big)
        dtype = np.dtype(DTYPES[spec.datatype])
        count = math.prod(shape)
        params = t.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInput(f"input {name!r}: parameters must be an object")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0:
                raise InvalidInput(f"input {name!r}: binary_data_size must be a non-negative integer")
            if size != count * dtype.itemsize:
                raise InvalidInput(f"input {name!r}: binary_data_size {size} != {count} x {dtype.itemsize} bytes")
            if offset + size > len(binary):
                raise InvalidInput(f"input {name!r}: binary data is shorter than binary_data_size")
            arr = np.frombuffer(binary[offset : offset + size], dtype=dtype.newbyteorder("<")).reshape(shape)
            offset += size
        else:
            data = t.get("data")
            if data is None:
                raise InvalidInput(f"input {name!r}: 'data' is missing")
            try:
                arr = _as_array(data, dtype)
            except (TypeError, ValueError, OverflowError) as e:
                raise InvalidInput(f"input {name!r}: data is not {spec.datatype}: {e}") from None
            if arr.dtype == object:
                raise InvalidInput(f"input {name!r}: data must be numbers")
            if arr.size != count:
                raise InvalidInput(f"input {name!r}: {arr.size} values for shape {shape} ({count} expected)")
            arr = arr.reshape(shape)
        if dtype.kind == "f" and not np.isfinite(arr).all():
            raise InvalidInput(f"input {name!r}: NaN or infinite values")
        arrays[name] = arr
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} trailing bytes after the binary tensors")
    missing = sorted(set(want) - set(arrays))
    if missing:
        raise InvalidInput(f"missing inputs {missing}")
    rows = {a.shape[0] for a in arrays.values() if a.ndim}
    if len(rows) > 1:
        raise InvalidInput("all inputs must have the same size in dimension 0")

    req_params = doc.get("parameters") or {}
    if not isinstance(req_params, dict):
        raise InvalidInput("'parameters' must be an object")
    binary_default = bool(req_params.get("binary_data_output", False))
    requested: list[str] | None = None
    binary_outputs: dict[str, bool] = {}
    outs = doc.get("outputs")
    if outs is not None:
        if not isinstance(outs, list):
            raise InvalidInput("'outputs' must be a list")
        requested = []
        for o in outs:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise InvalidInput("each requested output needs a 'name'")
            requested.append(o["name"])
            p = o.get("parameters") or {}
            binary_outputs[o["name"]] = bool(p.get("binary_data", binary_default)) if isinstance(p, dict) else False
    rid = doc.get("id")
    return InferRequest(
        id=str(rid) if rid is not None else None,
        inputs=arrays,
        binary_outputs=binary_outputs,
        requested=requested,
        binary_default=binary_default,
        parameters=req_params,
    )


def check_outputs(req: InferRequest, specs: Sequence[TensorSpec]) -> None:
    if req.requested is None:
        return
    names = {s.name for s in specs}
    unknown = [n for n in req.requested if n not in names]
    if unknown:
        raise InvalidInput(f"unknown outputs {unknown}; the model produces {sorted(names)}")


def batch_key(inputs: dict[str, np.ndarray]) -> Hashable:
    """Requests with equal keys can share a batch: same dtypes and trailing dims, and a row count in
    the same power-of-two bucket (so one large input does not inflate a batch of small ones)."""
    parts = []
    for name in sorted(inputs):
        a = inputs[name]
        rows = a.shape[0] if a.ndim else 0
        bucket = 1 << max(0, (rows - 1)).bit_length() if rows > 0 else 0
        parts.append((name, a.dtype.str, a.shape[1:], bucket))
    return tuple(parts)


def content_hash(model: str, inputs: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(model.encode())
    for name in sorted(inputs):
        a = np.ascontiguousarray(inputs[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def encode_response(
    model: str, version: str, req: InferRequest, outputs: dict[str, np.ndarray]
) -> tuple[bytes, dict[str, str]]:
    """Returns (body, extra headers). Binary outputs follow the JSON header when asked for."""
    names = req.requested if req.requested is not None else list(outputs)
    json_outputs = []
    chunks: list[bytes] = []
    for name in names:
        arr = outputs[name]
        entry: dict[str, Any] = {"name": name, "datatype": oip_datatype(arr), "shape": list(arr.shape)}
        if req.binary_outputs.get(name, req.binary_default):
            raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = arr.reshape(-1).tolist()
        json_outputs.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": json_outputs}
    if req.id is not None:
        doc["id"] = req.id
    header = orjson.dumps(doc)
    if not chunks:
        return header, {"content-type": "application/json"}
    return header + b"".join(chunks), {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }
