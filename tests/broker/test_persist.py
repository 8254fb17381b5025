"""Atomic JSON state files: round trip, no torn file after a kill -9 mid-write, corrupt files named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from broker.clocks import wall_ms
from broker.persist import read_json, write_json_atomic
from broker.wire.errors import InternalBrokerError

ROOT = Path(__file__).resolve().parents[2]


def test_round_trip_and_default(tmp_path):
    path = tmp_path / "sub" / "state.json"
    assert read_json(path, {"empty": True}) == {"empty": True}
    write_json_atomic(path, {"a": [1, 2, 3], "b": "é"})
    assert read_json(path, None) == {"a": [1, 2, 3], "b": "é"}
    write_json_atomic(path, {"a": 4}, fsync=False)
    assert read_json(path, None) == {"a": 4}


def test_no_temporary_files_left(tmp_path):
    path = tmp_path / "state.json"
    for i in range(5):
        write_json_atomic(path, i)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_failed_serialisation_keeps_old_content(tmp_path):
    path = tmp_path / "state.json"
    write_json_atomic(path, {"v": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"v": object()})
    assert read_json(path, None) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_corrupt_file_names_the_path(tmp_path):
    path = tmp_path / "offsets.json"
    path.write_bytes(b'{"a": 1')
    with pytest.raises(InternalBrokerError, match="offsets.json is corrupt"):
        read_json(path, {})


def test_wall_ms_is_milliseconds():
    assert abs(wall_ms() - time.time() * 1000) < 5_000


def test_kill_9_mid_writes_leaves_old_or_new_never_torn(tmp_path):
    """A writer process killed at an arbitrary moment leaves a file that parses as one full version."""
    path = tmp_path / "state.json"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from broker.persist import write_json_atomic
        path = Path({str(path)!r})
        i = 0
        while True:
            write_json_atomic(path, {{"i": i, "pad": "x" * (1000 + i % 5000)}}, fsync=i % 10 == 0)
            if i == 0:
                print("ready", flush=True)
            i += 1
        """
    )
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        state = json.loads(path.read_text())
        assert state["pad"] == "x" * (1000 + state["i"] % 5000)
