"""A TCP proxy on loopback that a test can cut and heal: one network link of a scenario (here a
broker's link to ZooKeeper), cut without touching either end."""

from __future__ import annotations

import socket
import threading

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (``host:port``; or the one ``forward_to`` names
    later, for a target that must know the proxy's address before it starts). ``cut()`` drops
    every connection and refuses new ones (they are closed at once) until ``heal()``.
    ``silence()`` makes the connections open now half-open: what either end sends is dropped and
    neither learns it (no close, no reset), as when the host between them vanishes; new
    connections are forwarded. ``port``: where it listens (a free one by default)."""

    def __init__(self, target: str | None = None, port: int = 0) -> None:
        self.target: tuple[str, int] | None = None  # connections are refused until it is known
        if target is not None:
            self.forward_to(target)
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._silenced: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def forward_to(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for sock in self._open:
                _close(sock)
            self._open.clear()

    def silence(self) -> None:
        with self._lock:
            self._silenced.update(self._open)

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._cut.is_set() or self.target is None:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self._cut.is_set():
                    break
                if src not in self._silenced:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
