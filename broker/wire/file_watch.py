"""Tells whether files changed since they were last looked at: how the broker picks up a new ACL
file or renewed certificates without a restart."""

from __future__ import annotations

import os

__all__ = ["FileWatch"]

Signature = tuple[tuple[int, int, int] | None, ...]


class FileWatch:
    """The (mtime, size, inode) of each of ``paths``; ``changed()`` compares with the last look.
    A file replaced by a rename (an atomic update) has a new inode, so it counts as changed even
    within the same mtime tick."""

    def __init__(self, *paths: str) -> None:
        self.paths = paths
        self.seen = self.signature()

    def signature(self) -> Signature:
        return tuple(_stat(path) for path in self.paths)

    def changed(self) -> bool:
        now = self.signature()
        if now == self.seen:
            return False
        self.seen = now
        return True


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino
