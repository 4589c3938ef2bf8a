"""Open Inference Protocol v2 (KServe / Triton REST): request decoding and response encoding.

Transport-free and pure: bytes and header values in, numpy arrays out, and back. Supports JSON
tensors and the binary tensor data extension (``Inference-Header-Content-Length``), which is what
``tritonclient.http`` sends and asks for by default. Every client mistake raises
:class:`~sluiceway_pod.errors.InvalidInput` with a message naming the tensor and the problem.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from .errors import InvalidInput, PayloadTooLarge
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

# --- decoding ``data`` arrays without a Python object per value (issue 18, item 7) -----------------
#: A ``"data": [`` key. Inside a JSON string every ``"`` is escaped, so an unescaped ``"data"``
#: followed by ``:`` is always an object key.
_DATA_KEY = re.compile(rb'"data"[ \t\r\n]*:[ \t\r\n]*\[')
#: What a ``data`` array of numbers or booleans (nested or flat) is made of; it never holds ``"``,
#: ``{`` or ``}``, so a run of these characters cannot cross into the next key.
_DATA_RUN = re.compile(rb"[\[\]0-9+\-.,eE \t\r\ntruefals]*")
_WS = b" \t\r\n"
#: The JSON outside the lifted ``data`` arrays (names, shapes, parameters) is decoded by orjson into
#: Python objects; it may not exceed this (413), so that decoding stays bounded.
SKELETON_MAX_BYTES = 1024 * 1024
#: Lifted ``data`` text is parsed in pieces of about this many bytes (the loop gets the GIL between).
PARSE_PIECE_BYTES = 1024 * 1024
#: What one JSON value may take in a body when ``maxShape`` bounds a request's size: the longest
#: float (``-1.7976931348623157e+308``) and its comma, rounded up.
JSON_BYTES_PER_VALUE = 32
#: The JSON around the tensors (names, shapes, parameters, requested outputs) allowed on top.
ENVELOPE_BYTES = 64 * 1024


@dataclass(frozen=True)
class _Lifted:
    """A ``data`` array left in the body as text: ``body[start:end]`` is its ``[...]``."""

    start: int
    end: int


def _lift_data(raw: bytes) -> tuple[bytes, list[_Lifted]]:
    """``raw`` with every ``data`` array of numbers or booleans replaced by a small placeholder
    object (``{"\\u0000": i}``), and where each array was. Nothing is parsed here: the arrays are
    found by a regular expression over the bytes (C speed, no objects per value). An array that is
    not plainly numbers, booleans and brackets stays in place (and the skeleton size limit bounds
    what it may cost)."""
    pieces: list[bytes] = []
    lifted: list[_Lifted] = []
    prev = 0
    for m in _DATA_KEY.finditer(raw):
        start = m.end() - 1
        if start < prev:
            continue
        run_end = _DATA_RUN.match(raw, start).end()  # type: ignore[union-attr]  # * always matches
        end = run_end
        while end > start and raw[end - 1] in _WS:
            end -= 1
        if end > start and raw[end - 1] == 0x2C:  # the comma before the next key
            end -= 1
            while end > start and raw[end - 1] in _WS:
                end -= 1
        nxt = raw[run_end : run_end + 1]
        if end <= start or raw[end - 1] != 0x5D or nxt not in (b'"', b"}"):
            continue  # not a plain array of numbers or booleans: orjson decides
        if raw.count(b"[", start, end) != raw.count(b"]", start, end):
            continue
        pieces.append(raw[prev:start])
        pieces.append(b'{"\\u0000":%d}' % len(lifted))
        lifted.append(_Lifted(start, end))
        prev = end
    if not lifted:
        return raw, lifted
    pieces.append(raw[prev:])
    return b"".join(pieces), lifted


def _placeholder(data: Any, lifted: list[_Lifted]) -> _Lifted | None:
    if isinstance(data, dict) and len(data) == 1:
        i = data.get("\u0000")
        if isinstance(i, int) and 0 <= i < len(lifted):
            return lifted[i]
    return None


_NUMERIC = b"0123456789+-.,eE \t\r\n"


def _parse_piece(piece: bytes, dtype: np.dtype[Any], name: str, datatype: str) -> np.ndarray:
    """One comma-cut piece of a lifted array (brackets removed) as values of ``dtype``."""
    kind = dtype.kind
    letters = piece.translate(None, _NUMERIC)
    if kind == "b":
        if letters:  # true/false, as 1/0 (what numpy makes of JSON booleans)
            piece = piece.replace(b"true", b"1").replace(b"false", b"0")
            if piece.translate(None, _NUMERIC):
                raise InvalidInput(f"input {name!r}: data is not {datatype}")
        parse_dtype: np.dtype[Any] = np.dtype(np.float32)
    elif letters:
        raise InvalidInput(f"input {name!r}: data is not {datatype}: numbers only")
    elif kind in "iu":
        if re.search(rb"[.eE]", piece):
            raise InvalidInput(f"input {name!r}: data is not {datatype}: integers only")
        if re.search(rb"[0-9]{19}", piece):
            raise InvalidInput(f"input {name!r}: data is not {datatype}: a value is out of range")
        parse_dtype = np.dtype(np.int64)
    else:
        parse_dtype = dtype
    try:
        values = np.fromstring(piece, dtype=parse_dtype, sep=",")
    except ValueError:
        raise InvalidInput(f"input {name!r}: data is not {datatype}") from None
    if kind in "iu" and len(values):
        info = np.iinfo(dtype)
        if int(values.min()) < info.min or int(values.max()) > info.max:
            raise InvalidInput(f"input {name!r}: data is not {datatype}: a value is out of range")
    return values


def _parse_lifted(
    raw: bytes, span: _Lifted, dtype: np.dtype[Any], shape: list[int], name: str, datatype: str
) -> np.ndarray:
    """The values of ``raw[span.start:span.end]`` as a flat array of ``count`` values of ``dtype``,
    parsed by numpy in pieces of about ``PARSE_PIECE_BYTES`` cut at commas (no Python object per
    value, no copy of the whole text). Nested arrays are flattened row-major (their nesting is not
    checked, only the count). Raises :class:`InvalidInput`."""
    lo, hi = span.start + 1, span.end - 1
    count = math.prod(shape)
    if count > hi - lo:  # every value takes a byte at least: nothing huge is allocated for a lie
        raise InvalidInput(f"input {name!r}: fewer values for shape {shape} than the {count} expected")
    out = np.empty(count, dtype=dtype)
    nested = raw.find(b"[", lo, hi) >= 0
    filled, pos, first = 0, lo, True
    while pos < hi:
        cut = raw.find(b",", pos + PARSE_PIECE_BYTES, hi) if hi - pos > PARSE_PIECE_BYTES else -1
        piece = raw[pos:hi] if cut < 0 else raw[pos:cut]
        pos = hi if cut < 0 else cut + 1
        if nested:
            piece = piece.translate(None, b"[]")
        piece = piece.strip(_WS)
        if (first and piece[:1] == b",") or piece[-1:] == b"," or (not piece and (cut >= 0 or not first)):
            raise InvalidInput(f"input {name!r}: data is not {datatype}: an empty value")
        first = False
        values = _parse_piece(piece, dtype, name, datatype)
        if filled + len(values) > count:
            raise InvalidInput(f"input {name!r}: more values for shape {shape} than the {count} expected")
        out[filled : filled + len(values)] = values
        filled += len(values)
    if filled != count:
        raise InvalidInput(f"input {name!r}: {filled} values for shape {shape} ({count} expected)")
    return out


def _as_array(data: Any, dtype: np.dtype[Any]) -> np.ndarray:
    if not isinstance(data, list) or len(data) <= CONVERT_SLICE or isinstance(data[0], list):
        return np.asarray(data, dtype=dtype)
    out = np.empty(len(data), dtype=dtype)
    for i in range(0, len(data), CONVERT_SLICE):
        out[i : i + CONVERT_SLICE] = data[i : i + CONVERT_SLICE]
    return out


def max_request_bytes(specs: Sequence[TensorSpec]) -> int | None:
    """The largest body the inputs' ``maxShape`` allows (every ``-1`` bounded), as JSON
    (``JSON_BYTES_PER_VALUE`` per value) or binary, plus ``ENVELOPE_BYTES``; None when some input
    is unbounded. A declared ``Content-Length`` above it is refused (413) before the body is read."""
    total = ENVELOPE_BYTES
    for s in specs:
        dims = []
        for i, d in enumerate(s.shape):
            if d == -1:
                if s.max_shape is None or i >= len(s.max_shape):
                    return None
                d = s.max_shape[i]
            dims.append(d)
        total += math.prod(dims) * max(JSON_BYTES_PER_VALUE, np.dtype(DTYPES[s.datatype]).itemsize)
    return total


def _json_array(data: Any, dtype: np.dtype[Any], count: int, shape: list[int], name: str, datatype: str) -> np.ndarray:
    """A ``data`` value orjson decoded (one :func:`_lift_data` left in place: small, by the skeleton
    limit)."""
    try:
        arr = _as_array(data, dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidInput(f"input {name!r}: data is not {datatype}: {e}") from None
    if arr.dtype == object:
        raise InvalidInput(f"input {name!r}: data must be numbers")
    if arr.size != count:
        raise InvalidInput(f"input {name!r}: {arr.size} values for shape {shape} ({count} expected)")
    return arr.reshape(shape)


def decode_request(body: bytes, header_length: str | None, specs: Sequence[TensorSpec]) -> InferRequest:
    """Parse and validate an infer request against the model's declared inputs."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise InvalidInput("Inference-Header-Content-Length must be an integer") from None
        if not 0 < n <= len(body):
            raise InvalidInput(f"Inference-Header-Content-Length {n} is outside the body ({len(body)} bytes)")
        json_part, binary = body[:n], memoryview(body)[n:]
    else:
        json_part, binary = body, memoryview(b"")
    skeleton, lifted = _lift_data(json_part)
    if len(skeleton) > SKELETON_MAX_BYTES:
        raise PayloadTooLarge(
            f"the request's JSON outside its numeric 'data' arrays is {len(skeleton)} bytes; "
            f"at most {SKELETON_MAX_BYTES} are accepted"
        )
    doc = _loads(skeleton)
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
            span = _placeholder(data, lifted)
            if span is not None:
                arr = _parse_lifted(json_part, span, dtype, shape, name, spec.datatype).reshape(shape)
            else:
                arr = _json_array(data, dtype, count, shape, name, spec.datatype)
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
            # orjson writes the numpy array itself: no Python object per value (issue 18, item 7)
            entry["data"] = np.ascontiguousarray(arr.reshape(-1), dtype=arr.dtype.newbyteorder("="))
        json_outputs.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": json_outputs}
    if req.id is not None:
        doc["id"] = req.id
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, {"content-type": "application/json"}
    return header + b"".join(chunks), {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }
