"""Crash-safe small state files and the wall clock shared by the broker's state modules.

``write_json_atomic`` replaces a file so that after a crash (``kill -9`` or power loss) a reader
finds either the old or the new content, never a mix. ``read_json`` does not fall back to a
backup: an atomically replaced file is never torn, so a corrupt one means outside damage, and
silently starting from an older copy could move committed offsets or fencing epochs backwards.
It raises an ``InternalBrokerError`` naming the file instead, and the operator decides.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.wire.errors import InternalBrokerError

__all__ = ["fsync_dir", "load_state", "read_json", "wall_ms", "write_json_atomic"]


def wall_ms() -> int:
    """Milliseconds since the Unix epoch: the default clock of every state module."""
    return time.time_ns() // 1_000_000


def fsync_dir(directory: Path) -> None:
    """Make a rename or file creation inside ``directory`` durable.

    Some platforms cannot open a directory for fsync; there the rename is as durable as the
    platform allows and nothing more can be done.
    """
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: Path, obj: Any, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``obj`` as JSON: all or nothing, even across a crash.

    The JSON goes to a temporary file in the same directory (a rename is only atomic within one
    file system), which is fsynced before ``os.replace`` and whose directory is fsynced after it,
    so the new name cannot outlive a crash pointing at unwritten data.

    Parameters
    ----------
    path : Path
        The file to replace; its directory is created if missing.
    obj : Any
        A JSON-serialisable value.
    fsync : bool, default True
        False skips both fsyncs (still atomic against a process crash, not a power loss).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("utf-8")
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            if fsync:
                os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    if fsync:
        fsync_dir(path.parent)


def read_json(path: Path, default: Any) -> Any:
    """The JSON value stored in ``path``, or ``default`` when the file does not exist.

    Raises
    ------
    InternalBrokerError
        The file exists but is not valid UTF-8 JSON; the message names the file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InternalBrokerError(
            f"state file {path} is corrupt ({exc}); restore it from a backup, or move it away to start "
            "that state from empty"
        ) from exc


def load_state(path: Path, versions: int | tuple[int, ...], what: str, parse: Callable[[dict[str, Any]], None]) -> None:
    """Hand a versioned state file (``{"version": N, ...}``, N one of ``versions``) to ``parse``; a
    missing file is no state, and a malformed one raises ``InternalBrokerError`` naming ``what`` and
    the path."""
    versions = (versions,) if isinstance(versions, int) else versions
    state = read_json(path, None)
    if state is None:
        return
    try:
        if state.get("version") not in versions:
            raise ValueError(f"unsupported version {state.get('version')!r}")
        parse(state)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise InternalBrokerError(f"{what} {path} is not valid ({exc})") from exc
