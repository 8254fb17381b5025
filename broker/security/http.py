"""The broker's HTTP endpoint (Prometheus ``/metrics``) under its TLS and access control.

TLS uses the broker's certificate, re-read when its files change (checked at most once a second
when a connection arrives), mutual under ``tls_client_ca_file``. Under access control a scrape
must authenticate with HTTP Basic credentials (access key, secret key: Prometheus'
``basic_auth``) of a user with ``admin`` on ``broker`` (the right of the broker-wide listings),
or it gets 401 / 403; failed secrets are throttled like any.
"""

from __future__ import annotations

import base64
import binascii
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import make_server

from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family, _SilentHandler

from broker.security.guard import AccessGuard
from broker.security.watch import FileWatch
from broker.wire.credentials import ACCESS_KEY_HEADER, SECRET_KEY_HEADER
from broker.wire.errors import OrderlyMQError, PermissionDeniedError

__all__ = ["ReloadingSslContext", "TlsAccepting", "basic_credentials", "serve_http"]

log = logging.getLogger(__name__)

_RIGHT = ("admin", "broker")


class ReloadingSslContext:
    """A server ``ssl.SSLContext`` of the certificate files, rebuilt when they change (a bad
    renewal is logged and the current context kept)."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str = "", check_interval_s: float = 1.0,
                 *, server_name: str = "metrics endpoint") -> None:
        self._name = server_name
        self._files = (cert_file, key_file, client_ca_file)
        self._watch = FileWatch(*(f for f in self._files if f))
        self._interval = check_interval_s
        self._next_check = time.monotonic() + check_interval_s
        self._lock = threading.Lock()
        self._context = self._build()

    def _build(self) -> ssl.SSLContext:
        cert_file, key_file, client_ca_file = self._files
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        if client_ca_file:
            context.load_verify_locations(client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def current(self) -> ssl.SSLContext:
        with self._lock:
            if time.monotonic() >= self._next_check:
                self._next_check = time.monotonic() + self._interval
                if self._watch.changed():
                    try:
                        self._context = self._build()
                    except (ssl.SSLError, OSError) as exc:
                        log.error("%s keeps its current TLS certificate: %s", self._name, exc)
            return self._context


def basic_credentials(authorization: str) -> tuple[str, str] | None:
    """(access key, secret key) of an HTTP Basic ``Authorization`` header; None when it is not one."""
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        key, _, secret = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return key, secret


def _metadata(environ: dict) -> tuple[tuple[str, str], ...]:
    credentials = basic_credentials(environ.get("HTTP_AUTHORIZATION", ""))
    return () if credentials is None else ((ACCESS_KEY_HEADER, credentials[0]), (SECRET_KEY_HEADER, credentials[1]))


def _guarded(app: Callable, guard: AccessGuard) -> Callable:
    def guarded(environ: dict, start_response: Callable) -> Iterable[bytes]:
        try:
            user = guard.authenticate(_metadata(environ), environ.get("REMOTE_ADDR", ""))
            if not guard.allows(user, *_RIGHT):
                raise PermissionDeniedError(f"user {user!r} may not read the metrics: it needs admin on broker "
                                            f"(`orderlymq-broker acl allow {user} admin broker`)")
        except OrderlyMQError as exc:
            status = "403 Forbidden" if isinstance(exc, PermissionDeniedError) else "401 Unauthorized"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                                    ("WWW-Authenticate", 'Basic realm="orderlymq", charset="UTF-8"')])
            return [f"{exc}\n".encode()]
        return app(environ, start_response)

    return guarded


class TlsAccepting:
    """A ``socketserver`` mix-in: every accepted connection is wrapped in ``tls``'s current
    context (None: plain), the handshake left to the handler's thread (its first read)."""

    tls: ReloadingSslContext | None = None

    def get_request(self) -> tuple[Any, Any]:
        connection, address = self.socket.accept()
        if self.tls is not None:
            connection = self.tls.current().wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
        return connection, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that fails the TLS handshake (no or a wrong certificate, plain HTTP) is refused
        # quietly: a scanner must not fill the log with tracebacks.
        log.debug("connection from %s refused", client_address, exc_info=True)


class _Server(TlsAccepting, ThreadingWSGIServer):
    pass


def serve_http(app: Callable, host: str, port: int, *, tls: ReloadingSslContext | None = None,
               guard: AccessGuard | None = None) -> ThreadingWSGIServer:
    """Serve the WSGI ``app`` on ``host:port`` (0: a free port) on a thread of its own."""
    family, host = _get_best_family(host, port)  # IPv6 hosts too

    class Server(_Server):
        address_family = family

    server = make_server(host, port, _guarded(app, guard) if guard is not None else app, Server,
                         handler_class=_SilentHandler)
    server.tls = tls
    threading.Thread(target=server.serve_forever, name="orderlymq-metrics-http", daemon=True).start()
    return server
