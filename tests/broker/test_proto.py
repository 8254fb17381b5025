"""The committed stubs are exactly what ``make proto`` generates from the committed .proto."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ["orderlymq_pb2.py", "orderlymq_pb2.pyi", "orderlymq_pb2_grpc.py"]


def test_stubs_match_the_proto(tmp_path):
    (tmp_path / "broker" / "proto").mkdir(parents=True)
    shutil.copy(ROOT / "broker" / "proto" / "orderlymq.proto", tmp_path / "broker" / "proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.", "--grpc_python_out=.", "--pyi_out=.",
         "broker/proto/orderlymq.proto"],
        cwd=tmp_path, check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "broker" / "proto" / name).read_text()
        committed = (ROOT / "broker" / "proto" / name).read_text()
        assert fresh == committed, f"broker/proto/{name} is stale: run `make proto` and commit the result"
