"""The console's HTTP server: a page, its script and style, and ``/api/state`` that the page polls.

A poller thread takes a snapshot of the broker every ``interval`` seconds and adds it to the
timeline; requests only read the latest result, so any number of open pages costs the broker
nothing more. A broker that cannot be reached is shown on the page (with the last data seen), never
as a stack trace.

Read-only: GET and HEAD only; every other method is refused with 405 before its body is read, and
no request reaches a broker RPC that changes state. (Admin actions wait for user rights.) A request
naming another host than the one listened on is refused with 403, so a web page elsewhere cannot
read the console through a DNS name rebound to loopback.

Off loopback the console needs a login and HTTPS (``login``, ``https_cert_file`` /
``https_key_file``), as the broker needs access control and TLS there, unless the operator passes
``allow_insecure_remote``. The login is checked by the broker (``connector.console.login``); the
certificate files are re-read when they change.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from broker.wire.errors import InvalidOptionError
from broker.wire.https import ReloadingSslContext, TlsAccepting, is_loopback
from broker.wire.tls import TlsOptions
from connector.client.admin import Admin
from connector.console.login import BrokerLogin, LoginRefused
from connector.console.snapshot import take_snapshot
from connector.console.timeline import Timeline
from connector.errors import OrderlyMQError

__all__ = ["ConsoleServer"]

log = logging.getLogger(__name__)

_ASSETS = Path(__file__).resolve().parent / "assets"
_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console.css": ("console.css", "text/css; charset=utf-8"),
}
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:",  # no inline or foreign code
}


class ConsoleServer:
    """Serve the console of the broker(s) at ``brokers`` on ``host:port`` (port 0: a free one).

    Parameters
    ----------
    brokers : str
        ``"host:port[,host:port]"``, as for every client.
    host : str
        Address to listen on; loopback by default. Any other needs ``login`` and HTTPS, or
        ``allow_insecure_remote``.
    interval : float
        Seconds between two snapshots of the broker (the page polls at the same pace).
    tls : TlsOptions, optional
        How to reach a broker that serves TLS; credentials come from ``ORDERLYMQ_ACCESS_KEY`` /
        ``ORDERLYMQ_SECRET_KEY`` as for every client.
    login : bool
        Ask every request for HTTP Basic credentials (access key, secret key) of a broker user with
        ``admin`` on ``broker``, checked by the broker.
    https_cert_file, https_key_file : str
        Serve HTTPS with this certificate and key (PEM) instead of HTTP.
    allow_insecure_remote : bool
        Listen off loopback without login or HTTPS anyway.
    """

    def __init__(self, brokers: str, *, host: str = "127.0.0.1", port: int = 8080, interval: float = 1.0,
                 tls: TlsOptions | None = None, login: bool = False, https_cert_file: str = "",
                 https_key_file: str = "", allow_insecure_remote: bool = False) -> None:
        _check_exposure(host, login, https_cert_file, https_key_file, allow_insecure_remote)
        self.brokers = brokers
        self.interval = interval
        self.login = BrokerLogin(brokers, tls) if login else None
        self._admin = Admin(brokers, timeout=max(2.0, interval), retry_timeout=interval, tls=tls)
        self._timeline = Timeline()
        self._state: dict[str, Any] = {"snapshot": None, "error": "connecting to the broker…", "error_since_ms": None}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._http = _HttpServer((host, port), _handler_for(self))
        self._http.daemon_threads = True
        if https_cert_file:
            self._http.tls = ReloadingSslContext(https_cert_file, https_key_file, server_name="console")
        self._threads = [
            threading.Thread(target=self._poll, name="console-poller", daemon=True),
            threading.Thread(target=self._http.serve_forever, name="console-http", daemon=True),
        ]

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"{'https' if self._http.tls else 'http'}://{host}:{port}/"

    def serves_host(self, host_header: str) -> bool:
        """Whether a request's ``Host`` names this console: its own address, or loopback when it
        listens there; any host when it listens on every interface (the operator chose to)."""
        listen_host = self._http.server_address[0]
        if listen_host in ("0.0.0.0", "::"):
            return True
        name = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
        name = name.strip("[]").lower()
        loopback = listen_host.startswith("127.") or listen_host == "::1"
        return name == listen_host or (loopback and name in ("localhost", "127.0.0.1", "::1"))

    def start(self) -> ConsoleServer:
        for thread in self._threads:
            thread.start()
        return self

    def state_json(self) -> bytes:
        """What ``/api/state`` answers: the latest snapshot, the error if the last one failed, the series."""
        with self._lock:
            state = {**self._state, "brokers": self.brokers, "refresh_ms": int(self.interval * 1000),
                     "timeline": self._timeline.points()}
        return json.dumps(state, separators=(",", ":")).encode()

    def _poll(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self._refresh()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def _refresh(self) -> None:
        try:
            snapshot = take_snapshot(self._admin, self.brokers)
        except OrderlyMQError as exc:
            self._failed(str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - the page must say what went wrong and the poller live on
            log.exception("console snapshot failed")
            self._failed(f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._timeline.add(snapshot)
            self._state = {"snapshot": snapshot, "error": None, "error_since_ms": None}

    def _failed(self, message: str) -> None:
        with self._lock:
            since = self._state["error_since_ms"] or int(time.time() * 1000)
            self._state = {**self._state, "error": message, "error_since_ms": since}

    def close(self) -> None:
        self._stop.set()
        if self._threads[1].is_alive():  # shutdown() waits for a serve_forever that was never started
            self._http.shutdown()
        self._http.server_close()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=10)
        self._admin.close()

    def __enter__(self) -> ConsoleServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _HttpServer(TlsAccepting, ThreadingHTTPServer):
    pass


def _check_exposure(host: str, login: bool, cert_file: str, key_file: str, allow_insecure_remote: bool) -> None:
    if bool(cert_file) != bool(key_file):
        raise InvalidOptionError("the console's HTTPS needs both a certificate and a key file (--https-cert-file, "
                                 "--https-key-file)")
    if is_loopback(host) or allow_insecure_remote:
        return
    missing = [what for what, given in (("--login", login), ("--https-cert-file/--https-key-file", cert_file))
               if not given]
    if missing:
        raise InvalidOptionError(
            f"the console would listen on {host}, reachable from other machines, without {' and '.join(missing)}: "
            "anyone reaching it could read every topic, group and transaction. Give both, or "
            "--allow-insecure-remote to accept that")


def _handler_for(console: ConsoleServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "orderlymq-console"

        def do_GET(self) -> None:
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def __getattr__(self, name: str):
            # http.server dispatches to do_<METHOD>: every method but GET and HEAD is refused here.
            if name.startswith("do_"):
                return self._refuse
            raise AttributeError(name)

        def _refuse(self) -> None:
            self.close_connection = True  # the request body is never read
            self._reply(HTTPStatus.METHOD_NOT_ALLOWED, b"the console is read-only: GET and HEAD only\n",
                        "text/plain; charset=utf-8", {"Allow": "GET, HEAD"})

        def _answer(self, send_body: bool) -> None:
            if not console.serves_host(self.headers.get("Host", "")):
                self._reply(HTTPStatus.FORBIDDEN, b"unknown host: open the console by the address it listens on\n",
                            "text/plain; charset=utf-8", send_body=send_body)
                return
            if console.login is not None:
                try:
                    console.login.check(self.headers.get("Authorization", ""))
                except LoginRefused as refused:
                    self._reply(refused.status, f"{refused}\n".encode(), "text/plain; charset=utf-8",
                                {"WWW-Authenticate": 'Basic realm="orderlymq console", charset="UTF-8"'},
                                send_body=send_body)
                    return
            path = self.path.split("?", 1)[0]
            if path == "/api/state":
                body, kind = console.state_json(), "application/json"
            elif path in _FILES:
                name, kind = _FILES[path]
                body = (_ASSETS / name).read_bytes()
            else:
                body, kind = b"not found\n", "text/plain; charset=utf-8"
                self._reply(HTTPStatus.NOT_FOUND, body, kind, send_body=send_body)
                return
            self._reply(HTTPStatus.OK, body, kind, send_body=send_body)

        def _reply(self, status: HTTPStatus, body: bytes, kind: str, extra: dict[str, str] | None = None,
                   *, send_body: bool = True) -> None:
            self.send_response(status)
            for name, value in {**_HEADERS, **(extra or {}), "Content-Type": kind,
                                "Content-Length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
