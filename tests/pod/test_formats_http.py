"""Issue 22, section 2: each model format, made here (no download), served by a real ``sluiceway-pod``
over OIP with tritonclient; outputs equal to running the model directly; the permits sizing runs on it.

Formats: TorchScript (``.pt``), ``torch.export`` (``.pt2``), ONNX (``.onnx``, onnxruntime's CPU
provider) and safetensors weights with a ``module:factory`` (``podmodels:mlp_16_4@model.safetensors``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from podtools import PodProcess, start_pod
from sluiceway_core.config import build_config
from sluiceway_pod.formats import ModelFormatError, detect_format, resolve_model_file
from sluiceway_pod.models import Tensors, TensorSpec, load_runner
from sluiceway_pod.runtime import measure
from sluiceway_pod.sizing import SimulatedDeviceMemory

onnx = pytest.importorskip("onnx", reason="needs the onnx package (pip install onnx) to build the ONNX test model")
ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install onnxruntime) to serve ONNX")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="needs safetensors (pip install safetensors)")

ROWS = np.array([[i / 7.0 - j / 5.0 for i in range(16)] for j in range(3)], dtype=np.float32)


class Scorer(torch.nn.Module):
    """16 features -> 4 scores; the argument name ``features`` is what ``.pt2`` metadata shows."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(features)))


def seeded(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return module.eval()


def make_torchscript(d: Path) -> tuple[str, Callable[[np.ndarray], np.ndarray]]:
    net = seeded(Scorer(), 1)
    torch.jit.save(torch.jit.script(net), str(d / "model.pt"))  # type: ignore[no-untyped-call]
    return str(d / "model.pt"), lambda x: net(torch.from_numpy(x)).detach().numpy()


def make_export(d: Path) -> tuple[str, Callable[[np.ndarray], np.ndarray]]:
    net = seeded(Scorer(), 2)
    batch = torch.export.Dim("batch", max=1024)
    program = torch.export.export(net, (torch.zeros(2, 16),), dynamic_shapes={"features": {0: batch}})
    torch.export.save(program, str(d / "model.pt2"))
    return str(d / "model.pt2"), lambda x: program.module()(torch.from_numpy(x)).detach().numpy()


def assert_fetched_model_serves(tmp: Path, model_dir: Path, direct: Callable[[np.ndarray], np.ndarray]) -> None:
    """A real pod serves the model fetched into ``model_dir`` (name ``scorer``) over HTTP with
    tritonclient, and its answer to :data:`ROWS` equals ``direct``'s (the fetch tests' end check)."""
    import tritonclient.http as tc

    pod = start_pod(tmp, config={"model": {"name": "scorer", "spec": str(model_dir)}})
    try:
        client = tc.InferenceServerClient(url=f"127.0.0.1:{pod.port}")
        inp = tc.InferInput("features", list(ROWS.shape), "FP32")
        inp.set_data_from_numpy(ROWS)
        got = client.infer("scorer", [inp]).as_numpy("scores")
        np.testing.assert_allclose(got, direct(ROWS.copy()), rtol=1e-5, atol=1e-5)
    finally:
        assert pod.terminate() == 0


def make_onnx(d: Path) -> tuple[str, Callable[[np.ndarray], np.ndarray]]:
    """Gemm -> Relu -> Gemm built node by node; ``batch`` is a symbolic dimension (served as -1)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w1, b1 = rng.normal(0, 0.3, (32, 16)).astype(np.float32), rng.normal(0, 0.3, 32).astype(np.float32)
    w2, b2 = rng.normal(0, 0.3, (4, 32)).astype(np.float32), rng.normal(0, 0.3, 4).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["features", "w1", "b1"], ["h"], transB=1),
            helper.make_node("Relu", ["h"], ["hr"]),
            helper.make_node("Gemm", ["hr", "w2", "b2"], ["scores"], transB=1),
        ],
        "scorer",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = d / "model.onnx"
    onnx.save(model, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def direct(x: np.ndarray) -> np.ndarray:
        out = session.run(["scores"], {"features": x})[0]
        np.testing.assert_allclose(out, np.maximum(x @ w1.T + b1, 0) @ w2.T + b2, rtol=1e-5, atol=1e-5)
        return np.asarray(out)

    return str(path), direct


def make_safetensors(d: Path) -> tuple[str, Callable[[np.ndarray], np.ndarray]]:
    from podmodels import mlp_16_4

    net = seeded(mlp_16_4(), 4)
    safetensors_torch.save_file(net.state_dict(), str(d / "model.safetensors"))
    return f"podmodels:mlp_16_4@{d / 'model.safetensors'}", lambda x: net(torch.from_numpy(x)).detach().numpy()


@dataclass(frozen=True)
class Case:
    make: Callable[[Path], tuple[str, Callable[[np.ndarray], np.ndarray]]]
    inputs: list[dict[str, Any]]  # what /v2/models/<name> must show
    outputs: list[dict[str, Any]]
    declared: list[dict[str, Any]] | None = None  # model.inputs for a format that carries no shapes


FEATURES = [{"name": "INPUT0", "shape": [-1, 16], "maxShape": [4, 16]}]
CASES = {
    "torchscript": Case(make_torchscript, [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
                        [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}], FEATURES),
    "torch-export": Case(make_export, [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}],
                         [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}]),
    "onnx": Case(make_onnx, [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}],
                 [{"name": "scores", "datatype": "FP32", "shape": [-1, 4]}]),
    "safetensors": Case(make_safetensors, [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
                        [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}], FEATURES),
}


@dataclass
class Served:
    pod: PodProcess
    spec: str
    direct: Callable[[np.ndarray], np.ndarray]
    case: Case


@pytest.fixture(scope="module", params=sorted(CASES))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    fmt = request.param
    tmp = tmp_path_factory.mktemp(fmt)
    spec, direct = CASES[fmt].make(tmp)
    pod = start_pod(
        tmp,
        config={
            "model": {"name": "scorer", "spec": spec, "warmupIterations": 2}
            | ({"inputs": CASES[fmt].declared} if CASES[fmt].declared else {}),
            "concurrency": {"permits": "auto", "cpuDefault": 3},
            "queue": {"maxDepth": "auto"},
        },
    )
    yield Served(pod, spec, direct, CASES[fmt])
    assert pod.terminate() == 0


def test_metadata_comes_from_the_model(served: Served) -> None:
    meta = httpx.get(f"{served.pod.url}/v2/models/scorer", timeout=10).json()
    assert meta["inputs"] == served.case.inputs
    assert meta["outputs"] == served.case.outputs
    # permits: auto on a CPU sizes to cpuDefault after the warm-up measured a service time
    assert meta["parameters"]["concurrency"] == 3
    assert meta["parameters"]["service_time_seconds"] > 0


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_outputs_equal_the_model_run_directly(served: Served, binary: bool) -> None:
    import tritonclient.http as tc

    client = tc.InferenceServerClient(url=f"127.0.0.1:{served.pod.port}")
    assert client.is_model_ready("scorer")
    in_name, out_name = served.case.inputs[0]["name"], served.case.outputs[0]["name"]
    inp = tc.InferInput(in_name, list(ROWS.shape), "FP32")
    inp.set_data_from_numpy(ROWS, binary_data=binary)
    result = client.infer("scorer", [inp], outputs=[tc.InferRequestedOutput(out_name, binary_data=binary)])
    got = result.as_numpy(out_name)
    assert got is not None and got.shape == (3, 4)
    np.testing.assert_allclose(got, served.direct(ROWS.copy()), rtol=1e-5, atol=1e-5)


class Metered:
    """A real format runner whose passes charge a simulated device: 100 bytes per input element."""

    def __init__(self, inner: Any, memory: SimulatedDeviceMemory) -> None:
        self.inner, self.memory_probe = inner, memory
        self.inputs: list[TensorSpec] = inner.inputs
        self.outputs: list[TensorSpec] = inner.outputs
        self.device = "sim"
        self.seen: list[tuple[int, ...]] = []

    def predict(self, requests: Sequence[Tensors]) -> list[Tensors]:
        cost = 100 * sum(a.size for r in requests for a in r.values())
        self.seen.append(tuple(next(iter(requests[0].values())).shape))
        self.memory_probe.allocate(cost)
        try:
            return list(self.inner.predict(requests))
        finally:
            self.memory_probe.release(cost)


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_permits_probe_sizes_each_format(fmt: str, tmp_path: Path) -> None:
    """The warm-up memory probe runs the real runner at the shape the model declares (its own
    metadata for ONNX and .pt2; ``model.inputs`` with ``maxShape`` where the format has none)."""
    spec, _ = CASES[fmt].make(tmp_path)
    declared = CASES[fmt].declared
    cfg = build_config({
        "model": {"spec": spec, "warmupIterations": 1, **({"inputs": declared} if declared else {})},
        "concurrency": {"permits": "auto", "memoryReserveBytes": 0, "safetyFactor": 1.0, "probeSeconds": 0},
        "batching": {"maxBatchSize": 1},
    })
    runner = Metered(load_runner(cfg.model, "cpu"), SimulatedDeviceMemory(total=1_000_000))
    platforms = {"onnx": "onnxruntime_onnx", "torch-export": "pytorch_export",
                 "torchscript": "pytorch_torchscript", "safetensors": "pytorch_safetensors"}
    assert runner.inner.platform == platforms[fmt]
    sizing = measure(runner, cfg)  # type: ignore[arg-type]
    rows = 4 if declared else 1
    assert runner.seen[0] == (rows, 16)
    assert sizing.peak_bytes_per_request == 100 * rows * 16
    assert sizing.memory_bound == sizing.permits == min(64, 1_000_000 // (100 * rows * 16))


def test_a_directory_spec_serves_its_one_model_file(tmp_path: Path) -> None:
    _, direct = make_onnx(tmp_path)
    runner = load_runner(str(tmp_path), "cpu")
    assert [s.name for s in runner.inputs] == ["features"]
    assert getattr(runner, "platform", None) == "onnxruntime_onnx"
    out = runner.predict([{"features": ROWS[:1]}, {"features": ROWS[1:]}])
    np.testing.assert_allclose(np.concatenate([o["scores"] for o in out]), direct(ROWS.copy()), rtol=1e-5, atol=1e-5)
    (tmp_path / "other.pt2").write_bytes(b"x")
    with pytest.raises(ModelFormatError, match="exactly one model file"):
        resolve_model_file(str(tmp_path))


def test_format_is_read_from_the_content(tmp_path: Path) -> None:
    ts, _ = make_torchscript(tmp_path)
    pt2, _ = make_export(tmp_path)
    assert detect_format(ts) == "torchscript" and detect_format(pt2) == "torch-export"
    renamed = tmp_path / "exported.pt"  # a torch.export program under a TorchScript name
    renamed.write_bytes(Path(pt2).read_bytes())
    assert detect_format(str(renamed)) == "torch-export"
    (tmp_path / "bad.onnx").write_bytes(b"<html>not a model</html>")
    with pytest.raises(ModelFormatError, match="not an ONNX ModelProto"):
        detect_format(str(tmp_path / "bad.onnx"))
    (tmp_path / "model.bin").write_bytes(b"\x00\x01")
    with pytest.raises(ModelFormatError, match="cannot tell the format"):
        detect_format(str(tmp_path / "model.bin"))


def test_safetensors_that_do_not_fit_the_factory_name_the_keys(tmp_path: Path) -> None:
    safetensors_torch.save_file({"0.weight": torch.zeros(32, 16)}, str(tmp_path / "w.safetensors"))
    with pytest.raises(ModelFormatError, match=r"missing \['0.bias'"):
        load_runner(f"podmodels:mlp_16_4@{tmp_path / 'w.safetensors'}", "cpu")
    with pytest.raises(ModelFormatError, match="weights only"):
        load_runner(str(tmp_path / "w.safetensors"), "cpu")


def test_a_pod_with_an_unreadable_model_exits_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match="not an ONNX ModelProto"):
        start_pod(tmp_path, config={"model": {"name": "m", "spec": str(tmp_path / "model.onnx")}}, timeout=60)


def test_a_request_that_does_not_fit_the_model_is_400(served: Served) -> None:
    """The model's own tensors (or the declared ones) decide: a wrong shape, dtype or name is a
    400 that names it, never a model crash."""
    name = served.case.inputs[0]["name"]
    bad = [
        ({"name": name, "shape": [1, 5], "datatype": "FP32", "data": [1.0] * 5}, "does not match"),
        ({"name": name, "shape": [1, 16], "datatype": "INT64", "data": [1] * 16}, "expected 'FP32'"),
        ({"name": "nope", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}, "unknown input"),
    ]
    for inp, why in bad:
        r = httpx.post(served.pod.infer_url, json={"inputs": [inp]}, timeout=10)
        assert r.status_code == 400 and why in r.json()["error"], r.text
