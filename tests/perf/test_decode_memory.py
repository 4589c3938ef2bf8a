"""Issue 18, item 7: decoding a 16 MiB JSON body must not grow it 8x (per-element Python objects).

Measured with tracemalloc around :func:`sluiceway_pod.protocol.decode_request` itself, in-process:
the peak of what the decode allocates, against the body's size. Before the fix ``orjson.loads`` built
a list of 4 million Python floats (about 128 MiB) before the shape check.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from sluiceway_pod.errors import InvalidInput
from sluiceway_pod.models import TensorSpec
from sluiceway_pod.protocol import decode_request

SPECS = [TensorSpec("INPUT0", "FP32", (-1, -1))]


def _body(values: int, nested: bool = False) -> bytes:
    data = ",".join(["1.5"] * values)
    if nested:
        data = ",".join("[" + ",".join(["1.5"] * 4) + "]" for _ in range(values // 4))
        shape = f"[{values // 4},4]"
    else:
        shape = f"[1,{values}]"
    return ('{"inputs":[{"name":"INPUT0","shape":' + shape + ',"datatype":"FP32","data":[' + data + "]}]}").encode()


@pytest.mark.parametrize("nested", [False, True])
def test_decoding_a_16_mib_json_body_peaks_under_twice_its_size(nested: bool) -> None:
    body = _body(4_000_000, nested)  # about 16 MB (flat) of "1.5," values
    tracemalloc.start()
    try:
        req = decode_request(body, None, SPECS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    arr = req.inputs["INPUT0"]
    print(f"body {len(body):,} B (nested={nested}): decode peak {peak:,} B = {peak / len(body):.2f}x the body")
    assert arr.shape == ((1, 4_000_000) if not nested else (1_000_000, 4)) and float(arr.sum()) == 6_000_000.0
    assert peak < 2 * len(body), peak


@pytest.mark.parametrize(
    ("data", "datatype", "want"),
    [
        ("1, 2.5 ,-3e2", "FP32", [1.0, 2.5, -300.0]),
        ("[1,2],[3,4]", "FP64", [1.0, 2.0, 3.0, 4.0]),
        ("1,2,3", "INT32", [1, 2, 3]),
        ("-5,7,9", "INT64", [-5, 7, 9]),
        ("true,false,true", "BOOL", [True, False, True]),
    ],
)
def test_lifted_data_decodes_like_json(data: str, datatype: str, want: list[object]) -> None:
    n = len(want)
    shape = "[2,2]" if data.startswith("[") else f"[{n}]"
    tensor = '{"name":"X","shape":' + shape + ',"datatype":"' + datatype + '","data":[' + data + "]}"
    body = ('{"inputs":[' + tensor + "]}").encode()
    spec = TensorSpec("X", datatype, (-1, -1) if data.startswith("[") else (-1,))
    arr = decode_request(body, None, [spec]).inputs["X"]
    assert arr.reshape(-1).tolist() == want


@pytest.mark.parametrize(
    ("data", "datatype"),
    [
        ("1,,2", "FP32"),
        ("1,2,", "FP32"),
        ("1,2", "FP32"),  # 2 values for shape [3]
        ("1,2,3,4", "FP32"),
        ("1.5,2,3", "INT32"),
        ("1,2,99999999999", "INT32"),
        ("1,2,99999999999999999999999", "INT64"),
        ("1,2,1e999", "FP32"),
        ("1,2,nan", "FP32"),
        ("1,2,3]", "FP32"),
    ],
)
def test_bad_lifted_data_is_a_400(data: str, datatype: str) -> None:
    body = ('{"inputs":[{"name":"X","shape":[3],"datatype":"' + datatype + '","data":[' + data + "]}]}").encode()
    with pytest.raises(InvalidInput):
        decode_request(body, None, [TensorSpec("X", datatype, (-1,))])


def test_a_data_key_inside_a_string_is_not_lifted() -> None:
    body = b'{"id":"\\"data\\":[1,2]","inputs":[{"name":"X","shape":[2],"datatype":"FP32","data":[1,2]}]}'
    req = decode_request(body, None, [TensorSpec("X", "FP32", (-1,))])
    assert req.id == '"data":[1,2]' and req.inputs["X"].tolist() == [1.0, 2.0]
    np.testing.assert_array_equal(req.inputs["X"], np.array([1.0, 2.0], dtype=np.float32))
