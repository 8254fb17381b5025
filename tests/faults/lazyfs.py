"""A FUSE file system that forgets what was not fsynced when the power is cut, in the manner of LazyFS.

Run as its own process (``tests.faults.lazymount.LazyMount`` does)::

    python tests/faults/lazyfs.py BACKING MOUNTPOINT CONTROL_SOCKET

``BACKING/root`` holds exactly the *durable* state: what a machine would find on its disk after
losing power. Everything else lives in this process's memory and is lost with it:

- **File data.** A write goes to the file's dirty pages (4 KiB, like a page cache); reads see the
  dirty pages over the durable content. ``fsync``/``fdatasync`` of the file writes its dirty pages
  (and a pending truncation) to the durable copy of the inode.
- **Directory entries.** A create, mkdir, link, rename, unlink or rmdir changes only the live
  directory. ``fsync`` of a directory makes its durable entries those of the live directory:
  names removed since go, names added come (a file by a hard link to its inode's durable copy, a
  directory by moving its durable copy under the new name).

So a file that was fsynced but whose directory never was is lost after a cut, and a name removed
or renamed without a directory fsync comes back, as POSIX allows. Each inode's durable copy sits
in ``BACKING/inodes/<n>``; the durable names in ``BACKING/root`` are hard links to it, so an
fsync of the data reaches every durable name of the inode. Two approximations: a directory lives
at one durable place, so a directory renamed between two directories moves there durably when the
new parent is fsynced (the old parent loses it at that moment); and attributes (mode, times) are
not modelled as volatile.

Control socket (one command per connection, one reply line):

- ``ping`` -> ``ok``;
- ``stats`` -> JSON counters (fsyncs, writes, dirty pages and directories now);
- ``fail-fsync N`` -> ``ok``: the next N fsyncs of files fail with EIO, as a disk's write error
  fails Linux's writeback: the file's dirty pages are marked clean without reaching the disk, so
  reads still see them but no later fsync writes them (an fsync after a failed one succeeds), and
  a cut loses them, leaving a hole if the file grew past them and was fsynced since;
- ``fail-dir-fsync N`` -> ``ok``: the next N fsyncs of directories fail with EIO, making none of
  their entries durable;
- ``cut [PID ...]`` -> JSON of what is dropped: the power is cut between two operations. The
  processes PID are killed with SIGKILL in that same instant (so none can answer a client after
  the cut), every volatile change is forgotten and every later operation fails at once with EIO
  (it must not wait: a process killed in the middle of a request cannot die before the request
  is answered). The caller then unmounts (``fusermount3 -u -z``) and this process exits;
  mounting again starts from ``BACKING/root`` alone.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import functools
import json
import os
import shutil
import signal
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import mfusepy

PAGE = 4096


class FileNode:
    """A regular file: durable copy ``anchor`` plus dirty pages, live size and truncation floor."""

    def __init__(self, ino: int, anchor: Path, mode: int) -> None:
        self.ino, self.anchor, self.mode = ino, anchor, mode
        self.fd = os.open(anchor, os.O_RDWR)
        self.anchor_ino = os.fstat(self.fd).st_ino
        self.size = os.fstat(self.fd).st_size
        self.floor = self.size  # bytes at or past the floor read as zeros (a pending truncation)
        self.pages: dict[int, bytearray] = {}
        self.lost: dict[int, bytearray] = {}  # pages a failed fsync marked clean: read, never written
        self.nlink = 0
        self.opens = 0
        self.mtime = time.time_ns()

    def page(self, index: int) -> bytes:
        """The live content of page ``index`` (PAGE bytes, zero-filled)."""
        live = self.pages.get(index, self.lost.get(index))
        if live is not None:
            return bytes(live)
        start = index * PAGE
        durable = os.pread(self.fd, max(0, min(PAGE, self.floor - start)), start) if start < self.floor else b""
        return durable + bytes(PAGE - len(durable))

    def read(self, size: int, offset: int) -> bytes:
        end = min(offset + size, self.size)
        if end <= offset:
            return b""
        out = bytearray()
        for index in range(offset // PAGE, (end - 1) // PAGE + 1):
            out += self.page(index)
        skip = offset - (offset // PAGE) * PAGE
        return bytes(out[skip:skip + end - offset])

    def write(self, data: bytes, offset: int) -> int:
        at = offset
        while at < offset + len(data):
            index, within = divmod(at, PAGE)
            page = self.pages.get(index)
            if page is None:
                page = self.pages[index] = bytearray(self.page(index))
                self.lost.pop(index, None)  # dirty again: the next fsync writes it whole
            take = min(PAGE - within, offset + len(data) - at)
            page[within:within + take] = data[at - offset:at - offset + take]
            at += take
        self.size = max(self.size, offset + len(data))
        self.mtime = time.time_ns()
        return len(data)

    def truncate(self, length: int) -> None:
        if length < self.size:
            for index in [i for i in self.pages if i * PAGE >= length]:
                del self.pages[index]
            for index in [i for i in self.lost if i * PAGE >= length]:
                del self.lost[index]
            index, within = divmod(length, PAGE)
            if index in self.lost:  # the page's tail is zeroed, which dirties it
                self.pages[index] = self.lost.pop(index)
            if index in self.pages:
                self.pages[index][within:] = bytes(PAGE - within)
            self.floor = min(self.floor, length)
        self.size = length
        self.mtime = time.time_ns()

    @property
    def dirty(self) -> bool:
        return bool(self.pages) or self.floor != os.fstat(self.fd).st_size or self.size != self.floor

    def sync(self) -> None:
        """Make the live content durable (what ``fsync`` promises)."""
        if self.floor < os.fstat(self.fd).st_size:
            os.ftruncate(self.fd, self.floor)
        for index in sorted(self.pages):
            start = index * PAGE
            if start < self.size:
                os.pwrite(self.fd, bytes(self.pages[index][: self.size - start]), start)
        os.ftruncate(self.fd, self.size)
        self.pages.clear()
        self.floor = self.size

    def lose_dirty(self) -> None:
        """A failed writeback: the dirty pages are clean now, and never reach the durable copy."""
        self.lost.update(self.pages)
        self.pages.clear()

    def forget(self) -> None:
        """The inode is gone from every live directory and closed: drop its durable copy."""
        os.close(self.fd)
        self.anchor.unlink(missing_ok=True)


class DirNode:
    """A directory: live entries, and ``loc``, the backing directory holding its durable entries."""

    def __init__(self, ino: int, loc: Path, mode: int) -> None:
        self.ino, self.loc, self.mode = ino, loc, mode
        self.entries: dict[str, FileNode | DirNode] = {}
        self.alive = True
        self.dirty = False  # entries changed since the last fsync of the directory
        self.mtime = time.time_ns()


def _op(method):
    """Serialise every operation on the one lock; after a cut, fail them all with EIO."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._mutex:
            if self.cut_done:
                raise mfusepy.FuseOSError(errno.EIO)
            return method(self, *args, **kwargs)

    return wrapper


class LazyFS(mfusepy.Operations):
    use_ns = True

    def __init__(self, backing: Path, control: str) -> None:
        self.backing, self.control = backing, control
        self.inodes_dir = backing / "inodes"
        self._mutex = threading.Lock()
        self.cut_done = False
        self.failing_fsyncs = self.failing_dir_fsyncs = 0
        self.next_ino = 1
        self.handles: dict[int, FileNode | DirNode] = {}
        self.next_fh = 1
        self.dirs_at: dict[Path, DirNode] = {}  # backing location -> directory
        self.counters = dict(writes=0, fsyncs=0, failed_fsyncs=0, dir_fsyncs=0, failed_dir_fsyncs=0, bytes_written=0,
                             bytes_synced=0)
        self.root = self._load()

    # -- the durable state, at mount ---------------------------------------------------------

    def _ino(self) -> int:
        self.next_ino += 1
        return self.next_ino

    def _load(self) -> DirNode:
        """The live tree as ``BACKING/root`` holds it; inodes not durably linked are freed (fsck)."""
        shutil.rmtree(self.inodes_dir, ignore_errors=True)
        self.inodes_dir.mkdir(parents=True)
        top = self.backing / "root"
        top.mkdir(exist_ok=True)
        by_backing_ino: dict[int, FileNode] = {}

        def load_dir(loc: Path) -> DirNode:
            node = DirNode(self._ino(), loc, stat.S_IFDIR | 0o755)
            self.dirs_at[loc] = node
            for entry in os.scandir(loc):
                path = Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    node.entries[entry.name] = load_dir(path)
                    continue
                st = entry.stat(follow_symlinks=False)
                child = by_backing_ino.get(st.st_ino)
                if child is None:
                    ino = self._ino()
                    anchor = self.inodes_dir / str(ino)
                    os.link(path, anchor)
                    child = by_backing_ino[st.st_ino] = FileNode(ino, anchor, stat.S_IFREG | (st.st_mode & 0o7777))
                child.nlink += 1
                node.entries[entry.name] = child
            return node

        return load_dir(top)

    # -- paths and handles -------------------------------------------------------------------

    def _lookup(self, path: str) -> FileNode | DirNode:
        node: FileNode | DirNode = self.root
        for part in [p for p in path.split("/") if p]:
            if not isinstance(node, DirNode) or part not in node.entries:
                raise mfusepy.FuseOSError(errno.ENOENT)
            node = node.entries[part]
        return node

    def _parent(self, path: str) -> tuple[DirNode, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head or "/")
        if not isinstance(parent, DirNode):
            raise mfusepy.FuseOSError(errno.ENOTDIR)
        return parent, name

    def _file(self, path: str | None, fh: int | None) -> FileNode:
        node = self.handles.get(fh) if fh else None
        node = node if node is not None else self._lookup(path)
        if not isinstance(node, FileNode):
            raise mfusepy.FuseOSError(errno.EISDIR)
        return node

    def _handle(self, node: FileNode | DirNode) -> int:
        self.next_fh += 1
        self.handles[self.next_fh] = node
        if isinstance(node, FileNode):
            node.opens += 1
        return self.next_fh

    def _unref(self, node: FileNode) -> None:
        if node.nlink == 0 and node.opens == 0:
            node.forget()

    # -- the volatile namespace ---------------------------------------------------------------

    def _detach(self, parent: DirNode, name: str) -> FileNode | DirNode:
        node = parent.entries.pop(name)
        parent.dirty = True
        parent.mtime = time.time_ns()
        if isinstance(node, FileNode):
            node.nlink -= 1
            self._unref(node)
        return node

    def _attach(self, parent: DirNode, name: str, node: FileNode | DirNode) -> None:
        if name in parent.entries:
            self._detach(parent, name)
        parent.entries[name] = node
        parent.dirty = True
        parent.mtime = time.time_ns()
        if isinstance(node, FileNode):
            node.nlink += 1

    def _relocate(self, node: DirNode, loc: Path) -> None:
        """``node``'s durable copy moved to ``loc``: update it and every directory below it."""
        old = node.loc
        for at, d in list(self.dirs_at.items()):
            if at == old or old in at.parents:
                del self.dirs_at[at]
                d.loc = loc / at.relative_to(old)
                self.dirs_at[d.loc] = d

    def _sync_dir(self, node: DirNode) -> None:
        """Make ``node``'s durable entries its live ones (what ``fsync`` of a directory promises)."""
        for entry in list(os.scandir(node.loc)):
            path, live = Path(entry.path), node.entries.get(entry.name)
            if entry.is_dir(follow_symlinks=False):
                durable = self.dirs_at.get(path)
                if durable is not None and durable is live:
                    continue
                if durable is not None and durable.alive:  # live elsewhere, not yet durable there
                    orphan = self.inodes_dir / str(durable.ino)
                    os.rename(path, orphan)
                    self._relocate(durable, orphan)
                else:
                    for at in [a for a in self.dirs_at if a == path or path in a.parents]:
                        del self.dirs_at[at]
                    shutil.rmtree(path)
            elif not (isinstance(live, FileNode) and entry.stat(follow_symlinks=False).st_ino == live.anchor_ino):
                os.unlink(path)
        for name, child in node.entries.items():
            target = node.loc / name
            if isinstance(child, FileNode):
                if not target.exists():
                    os.link(child.anchor, target)
            elif child.loc != target:
                os.rename(child.loc, target)
                self._relocate(child, target)
        node.dirty = False

    # -- operations ---------------------------------------------------------------------------

    @_op
    def getattr(self, path, fh=None):
        node = self.handles.get(fh) if fh else None
        node = node if node is not None else self._lookup(path)
        if isinstance(node, DirNode):
            links = 2 + sum(isinstance(c, DirNode) for c in node.entries.values())
            return dict(st_mode=node.mode, st_nlink=links, st_size=4096, st_ino=node.ino,
                        st_mtime=node.mtime, st_ctime=node.mtime, st_atime=node.mtime)
        return dict(st_mode=node.mode, st_nlink=node.nlink, st_size=node.size, st_ino=node.ino,
                    st_blocks=(node.size + 511) // 512, st_blksize=PAGE,
                    st_mtime=node.mtime, st_ctime=node.mtime, st_atime=node.mtime)

    @_op
    def readdir(self, path, fh):
        node = self.handles.get(fh) or self._lookup(path)
        return [".", "..", *node.entries]

    @_op
    def opendir(self, path):
        node = self._lookup(path)
        if not isinstance(node, DirNode):
            raise mfusepy.FuseOSError(errno.ENOTDIR)
        return self._handle(node)

    @_op
    def releasedir(self, path, fh):
        self.handles.pop(fh, None)
        return 0

    @_op
    def fsyncdir(self, path, datasync, fh):
        node = self.handles.get(fh) or self._lookup(path)
        if self.failing_dir_fsyncs:
            self.failing_dir_fsyncs -= 1
            self.counters["failed_dir_fsyncs"] += 1
            raise mfusepy.FuseOSError(errno.EIO)
        self._sync_dir(node)
        self.counters["dir_fsyncs"] += 1
        return 0

    @_op
    def mkdir(self, path, mode):
        parent, name = self._parent(path)
        if name in parent.entries:
            raise mfusepy.FuseOSError(errno.EEXIST)
        ino = self._ino()
        node = DirNode(ino, self.inodes_dir / str(ino), stat.S_IFDIR | (mode & 0o7777))
        node.loc.mkdir()
        self.dirs_at[node.loc] = node
        self._attach(parent, name, node)
        return 0

    @_op
    def rmdir(self, path):
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if not isinstance(node, DirNode):
            raise mfusepy.FuseOSError(errno.ENOTDIR if node else errno.ENOENT)
        if node.entries:
            raise mfusepy.FuseOSError(errno.ENOTEMPTY)
        self._detach(parent, name)
        self._drop_dir(node)
        return 0

    def _drop_dir(self, node: DirNode) -> None:
        """A removed directory: its durable copy stays where it is durably linked, else goes."""
        node.alive = False
        if node.loc.parent == self.inodes_dir:
            del self.dirs_at[node.loc]
            shutil.rmtree(node.loc)

    @_op
    def create(self, path, mode, flags=0):
        parent, name = self._parent(path)
        existing = parent.entries.get(name)
        if isinstance(existing, FileNode):
            return self._handle(existing)
        ino = self._ino()
        anchor = self.inodes_dir / str(ino)
        anchor.touch()
        node = FileNode(ino, anchor, stat.S_IFREG | (mode & 0o7777))
        self._attach(parent, name, node)
        return self._handle(node)

    @_op
    def open(self, path, flags):
        return self._handle(self._file(path, None))

    @_op
    def release(self, path, fh):
        node = self.handles.pop(fh, None)
        if isinstance(node, FileNode):
            node.opens -= 1
            self._unref(node)
        return 0

    @_op
    def read(self, path, size, offset, fh):
        return self._file(path, fh).read(size, offset)

    @_op
    def write(self, path, data, offset, fh):
        self.counters["writes"] += 1
        self.counters["bytes_written"] += len(data)
        return self._file(path, fh).write(data, offset)

    @_op
    def truncate(self, path, length, fh=None):
        self._file(path, fh).truncate(length)
        return 0

    @_op
    def fsync(self, path, datasync, fh):
        node = self._file(path, fh)
        if self.failing_fsyncs:
            self.failing_fsyncs -= 1
            self.counters["failed_fsyncs"] += 1
            node.lose_dirty()
            raise mfusepy.FuseOSError(errno.EIO)
        self.counters["fsyncs"] += 1
        self.counters["bytes_synced"] += len(node.pages) * PAGE
        node.sync()
        return 0

    @_op
    def flush(self, path, fh):
        return 0

    @_op
    def unlink(self, path):
        parent, name = self._parent(path)
        if not isinstance(parent.entries.get(name), FileNode):
            raise mfusepy.FuseOSError(errno.EISDIR if name in parent.entries else errno.ENOENT)
        self._detach(parent, name)
        return 0

    @_op
    def rename(self, old, new):
        old_parent, old_name = self._parent(old)
        new_parent, new_name = self._parent(new)
        node = old_parent.entries.get(old_name)
        if node is None:
            raise mfusepy.FuseOSError(errno.ENOENT)
        target = new_parent.entries.get(new_name)
        if target is node:
            return 0
        if isinstance(target, DirNode) and target.entries:
            raise mfusepy.FuseOSError(errno.ENOTEMPTY)
        if isinstance(node, FileNode):
            node.nlink += 1  # keep it referenced between detach and attach
        self._detach(old_parent, old_name)
        if isinstance(target, DirNode):
            self._detach(new_parent, new_name)
            self._drop_dir(target)
        self._attach(new_parent, new_name, node)
        if isinstance(node, FileNode):
            node.nlink -= 1
        return 0

    @_op
    def link(self, target, source):
        node = self._file(source, None)
        parent, name = self._parent(target)
        if name in parent.entries:
            raise mfusepy.FuseOSError(errno.EEXIST)
        self._attach(parent, name, node)
        return 0

    @_op
    def chmod(self, path, mode):
        node = self._lookup(path)
        node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
        return 0

    @_op
    def chown(self, path, uid, gid):
        return 0

    @_op
    def utimens(self, path, times=None):
        if path is not None:
            node = self._lookup(path)
            node.mtime = times[1] if times else time.time_ns()
        return 0

    @_op
    def statfs(self, path):
        st = os.statvfs(self.backing)
        return {key: getattr(st, key) for key in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                   "f_files", "f_ffree", "f_favail", "f_namemax")}

    def init(self, path):
        serve_control(self, self.control)  # the socket answers once the mount is up

    # -- control ------------------------------------------------------------------------------

    def _all(self):
        stack: list[DirNode] = [self.root]
        while stack:
            node = stack.pop()
            yield node
            for child in node.entries.values():
                if isinstance(child, DirNode):
                    stack.append(child)
                else:
                    yield child

    def volatile(self) -> dict:
        """What a cut would drop now."""
        nodes = {id(n): n for n in self._all()} | {id(n): n for n in self.handles.values()}
        files = [n for n in nodes.values() if isinstance(n, FileNode) and n.dirty]
        dirs = [n for n in nodes.values() if isinstance(n, DirNode) and n.dirty]
        return dict(dirty_files=len(files), dirty_pages=sum(len(f.pages) for f in files), dirty_dirs=len(dirs))

    def command(self, line: str) -> str:
        if line == "ping":
            return "ok"
        if line == "stats":
            with self._mutex:
                return json.dumps(self.counters | self.volatile())
        if line.split()[:1] == ["fail-fsync"]:
            with self._mutex:
                self.failing_fsyncs = int(line.split()[1])
            return "ok"
        if line.split()[:1] == ["fail-dir-fsync"]:
            with self._mutex:
                self.failing_dir_fsyncs = int(line.split()[1])
            return "ok"
        if line.split()[:1] == ["cut"]:
            with self._mutex:  # between two operations: none is half applied
                for pid in line.split()[1:]:  # the writers die with the power, before any can answer
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                self.cut_done = True
                return json.dumps(self.volatile())
        return f"unknown command {line!r}"


def serve_control(fs: LazyFS, path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                line = conn.makefile("r").readline().strip()
                conn.sendall((fs.command(line) + "\n").encode())

    threading.Thread(target=loop, name="lazyfs-control", daemon=True).start()


def main(argv: list[str]) -> None:
    backing, mountpoint, control = argv
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack in the log
    fs = LazyFS(Path(backing), control)
    # One thread serves every request, in order: the model has no concurrency of its own to get wrong.
    mfusepy.FUSE(fs, mountpoint, foreground=True, nothreads=True, fsname="lazyfs", default_permissions=True)


if __name__ == "__main__":
    main(sys.argv[1:])
