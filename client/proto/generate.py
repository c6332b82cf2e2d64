"""Generate the Python code of ``headwater/v1/*.proto`` next to them (``make setup`` runs this).

grpcio-tools writes ``ranking_pb2.py``, ``ranking_pb2.pyi`` and ``ranking_pb2_grpc.py`` into
``client/proto/headwater/v1/`` (git-ignored). The generated ``_grpc`` module imports its messages
as ``headwater.v1.ranking_pb2``, the proto's own package path; installed, they live in
``headwater.client.proto.headwater.v1``, so that one import is made relative.

Usage: ``python client/proto/generate.py`` (from any folder; needs grpcio-tools, a dev dependency).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = ("headwater/v1/ranking.proto", "headwater/v1/ingest.proto")


def generate() -> list[Path]:
    """Run protoc over ``PROTOS``; return the files written. Raises SystemExit when protoc fails."""
    from grpc_tools import protoc

    written: list[Path] = []
    for proto in PROTOS:
        include = Path(protoc.__file__).parent / "_proto"
        args = ["protoc", f"-I{HERE}", f"-I{include}", f"--python_out={HERE}", f"--pyi_out={HERE}",
                f"--grpc_python_out={HERE}", str(HERE / proto)]  # fmt: skip
        if protoc.main(args) != 0:
            msg = f"protoc failed on {HERE / proto} (its message is above); fix the .proto and run again"
            raise SystemExit(msg)
        stem = HERE / proto.removesuffix(".proto")
        module = proto.removesuffix(".proto").replace("/", ".") + "_pb2"
        package, _, name = module.rpartition(".")
        grpc_file = stem.with_name(stem.name + "_pb2_grpc.py")
        text = grpc_file.read_text(encoding="utf-8")
        grpc_file.write_text(text.replace(f"from {package} import {name}", f"from . import {name}"), "utf-8")
        written += [stem.with_name(stem.name + s) for s in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]
    return written


if __name__ == "__main__":
    for path in generate():
        print(f"wrote {path}", file=sys.stderr)
