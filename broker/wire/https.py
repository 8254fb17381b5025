"""What the HTTP endpoints (the broker's metrics, the console) share to be served safely: HTTPS
with certificates re-read when renewed, HTTP Basic credentials, and whether an address is
reachable from other machines at all."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import logging
import ssl
import threading
import time
from typing import Any

from broker.wire.file_watch import FileWatch

__all__ = ["ReloadingSslContext", "TlsAccepting", "basic_credentials", "is_loopback"]

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


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
