"""Regenerate the committed gRPC stubs from ``externalscaler.proto``.

``python -m sluiceway_scaler.stubs`` rewrites ``externalscaler_pb2.py``, ``externalscaler_pb2.pyi`` and
``externalscaler_pb2_grpc.py`` next to the proto; ``tests/scaler/test_proto_stubs.py`` generates into
a temporary directory and checks that the committed files match byte for byte. The proto is mapped
to ``sluiceway_scaler/externalscaler.proto`` so that the generated imports are package-relative
(``from sluiceway_scaler import externalscaler_pb2``); the gRPC package stays ``externalscaler``,
which is what KEDA calls.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = "externalscaler.proto"
GENERATED = ("externalscaler_pb2.py", "externalscaler_pb2.pyi", "externalscaler_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run grpc_tools' protoc; return the generated files (under ``out_dir/sluiceway_scaler``)."""
    from grpc_tools import protoc  # dev dependency: grpcio-tools

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"--proto_path=sluiceway_scaler={HERE}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"sluiceway_scaler/{PROTO}",
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}: {' '.join(args)}")
    return [out_dir / "sluiceway_scaler" / name for name in GENERATED]


def main() -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for f in generate(Path(tmp)):
            (HERE / f.name).write_bytes(f.read_bytes())
            print(f"wrote {HERE / f.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
