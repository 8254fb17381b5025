"""Crash-safe small state files.

``write_json_atomic`` replaces a file so that after a crash (``kill -9`` or power loss) a reader
finds either the old or the new content, never a mix. ``read_json`` does not fall back to a
backup: an atomically replaced file is never torn, so a corrupt one means outside damage, and
silently starting from an older copy could move committed offsets or fencing epochs backwards.
It raises an ``InternalBrokerError`` naming the file instead, and the operator decides.

``write_failure_as_error`` turns a write that failed for want of space (ENOSPC, EDQUOT) into a
``DiskFullError``, and one the disk refused (EIO, EROFS) into a ``BrokerUnavailableError``, each
naming the data directory and what to do: the one translation of them. It lets an
``UnsyncedRenameError`` pass: that write did take place, and only its caller can say what follows.
A full disk first takes back what the broker keeps on disk only to save work later
(``keep_spare_space``: finished transactions' files kept for reuse), so that a retry may succeed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.wire.errors import BrokerUnavailableError, DiskFullError, InternalBrokerError

__all__ = [
    "disk_full_error",
    "fsync_dir",
    "is_disk_full",
    "keep_spare_space",
    "load_state",
    "read_json",
    "UnsyncedRenameError",
    "write_failure_as_error",
    "write_json_atomic",
]

log = logging.getLogger(__name__)

_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_NO_DIRECTORY_FSYNC = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})  # the platform cannot
_REFUSED = frozenset({errno.EIO, errno.EROFS})  # a failing disk, or one the kernel remounted read-only
_WARN_EVERY_S = 10.0  # a full disk refuses every write: one log line per data dir this often is enough
_last_warned: dict[str, float] = {}
_spare_space_keepers: weakref.WeakSet = weakref.WeakSet()
_keepers_lock = threading.Lock()  # a set must not change while it is copied


def keep_spare_space(keeper: Any) -> None:
    """Register ``keeper``, whose ``give_back_space()`` deletes what it keeps only to save work
    later and returns the bytes it freed: a write refused for want of space calls it."""
    with _keepers_lock:
        _spare_space_keepers.add(keeper)


def _give_back_space() -> int:
    with _keepers_lock:
        keepers = list(_spare_space_keepers)
    return sum(keeper.give_back_space() for keeper in keepers)


class UnsyncedRenameError(OSError):
    """``write_json_atomic`` replaced the file, but the fsync of its directory failed: every reader,
    a restarted broker included, finds the new content, yet a power cut may bring the old back."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write refused for want of space (ENOSPC) or quota (EDQUOT)."""
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE


def disk_full_error(data_dir: Path | str, what: str, cause: str = "No space left on device") -> DiskFullError:
    """A ``DiskFullError`` saying that ``what`` failed in ``data_dir``, that nothing of it was kept,
    and how to get going again; the broker log says so too, at most every few seconds. Space kept
    only to save work (``keep_spare_space``) is given back first, and the error says so."""
    freed = _give_back_space()
    now = time.monotonic()
    if now - _last_warned.get(str(data_dir), -_WARN_EVERY_S) >= _WARN_EVERY_S:
        _last_warned[str(data_dir)] = now
        log.warning("disk full in data dir %s (%s): could not %s; writes are refused until space is freed",
                    data_dir, cause, what)
    given_back = f" The broker deleted {freed:,} bytes of files it kept for reuse: retrying may succeed now." \
        if freed else ""
    return DiskFullError(
        f"disk full: could not {what}: {cause} in the broker's data dir {data_dir}; nothing of it was stored "
        "or changed. Free space on that file system (delete unused topics, lower retention_bytes / "
        f"retention_ms, or move the data dir to a larger volume), then retry.{given_back}",
        str(data_dir),
    )


def write_failure_as_error(data_dir: Path | str, what: str) -> _WriteFailureAsError:
    """Raise ``disk_full_error(data_dir, what)`` for an ENOSPC or EDQUOT ``OSError`` in the block,
    and a ``BrokerUnavailableError`` (clients send again) for an EIO or EROFS one; other errors pass
    unchanged. The block must leave nothing half-done when it raises."""
    return _WriteFailureAsError(data_dir, what)


class _WriteFailureAsError:
    """``write_failure_as_error``'s block: a class, not a generator, as every append enters one."""

    __slots__ = ("data_dir", "what")

    def __init__(self, data_dir: Path | str, what: str) -> None:
        self.data_dir, self.what = data_dir, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        if not isinstance(exc, OSError) or isinstance(exc, UnsyncedRenameError):
            return False
        if is_disk_full(exc):
            raise disk_full_error(self.data_dir, self.what, os.strerror(exc.errno)) from exc
        if exc.errno not in _REFUSED:
            return False
        log.error("data dir %s: could not %s: %s", self.data_dir, self.what, os.strerror(exc.errno))
        raise BrokerUnavailableError(
            f"could not {self.what}: the disk of the broker's data dir {self.data_dir} refused the write "
            f"({os.strerror(exc.errno)}); nothing of it was stored. Check that disk; sending again is safe"
        ) from exc


def fsync_dir(directory: Path) -> None:
    """Make a rename or file creation inside ``directory`` durable.

    Some platforms cannot open or fsync a directory; there the rename is as durable as the
    platform allows and nothing more can be done. A disk's failure (EIO) is raised: the entry may
    be gone after a power cut, so what depends on it must not be acknowledged.
    """
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_DIRECTORY_FSYNC:
            raise
    finally:
        os.close(fd)


def make_durable_dir(directory: Path) -> None:
    """Create ``directory`` (and its parents) if missing, so that it survives a power cut."""
    if not directory.exists():
        directory.mkdir(parents=True)
        fsync_dir(directory.parent)


def write_json_atomic(path: Path, obj: Any, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``obj`` as JSON: all or nothing, even across a crash.

    The JSON goes to a temporary file in the same directory (a rename is only atomic within one
    file system), which is fsynced before ``os.replace`` and whose directory is fsynced after it,
    so the new name cannot outlive a crash pointing at unwritten data. Raises
    ``UnsyncedRenameError`` when only that last fsync fails.

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
        try:
            fsync_dir(path.parent)
        except OSError as exc:
            raise UnsyncedRenameError(exc.errno, f"{path} was replaced, but its directory's fsync failed "
                                      f"({exc.strerror})") from exc


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
