"""The broker's TLS certificate, picked up again when its files are renewed: no restart.

grpcio's dynamic server credentials ask, before each new connection's handshake, whether the
certificate changed. The answer looks at the files at most once per ``check_interval_s``; when
the certificate, key or client CA file changed, it checks them (the key must belong to the
certificate, as ``ssl`` sees it) and only then hands the new ones to gRPC: a renewal caught half
written, or a wrong file, is logged and the current certificate stays in force until a good set
appears. Open connections keep the certificate they were made with.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable

import grpc

from broker.wire.errors import InvalidOptionError
from broker.wire.file_watch import FileWatch
from broker.wire.tls import read_pem

__all__ = ["server_credentials"]

log = logging.getLogger(__name__)


def _certificate_configuration(cert_file: str, key_file: str, client_ca_file: str | None):
    cert = read_pem(cert_file, "tls_cert_file")
    key = read_pem(key_file, "tls_key_file")
    client_ca = read_pem(client_ca_file, "tls_client_ca_file")
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        if client_ca_file:
            context.load_verify_locations(client_ca_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise InvalidOptionError(f"tls_cert_file {cert_file!r} / tls_key_file {key_file!r}"
                                 f"{f' / tls_client_ca_file {client_ca_file!r}' if client_ca_file else ''}: not a "
                                 f"matching PEM certificate and key ({exc})") from None
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=client_ca)


def server_credentials(cert_file: str, key_file: str, client_ca_file: str | None = None, *,
                       check_interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                       ) -> grpc.ServerCredentials:
    """The broker's TLS: its certificate and key; with ``client_ca_file``, mutual TLS (a client must
    present a certificate signed by that CA, or the handshake fails). Renewed files apply to the
    connections made after them. Raises ``InvalidOptionError`` naming the setting of a bad file."""
    initial = _certificate_configuration(cert_file, key_file, client_ca_file)
    watch = FileWatch(*(path for path in (cert_file, key_file, client_ca_file) if path))
    lock = threading.Lock()
    next_check = clock() + check_interval_s

    def renewed():
        nonlocal next_check
        if clock() < next_check or not lock.acquire(blocking=False):
            return None
        try:
            next_check = clock() + check_interval_s
            if not watch.changed():
                return None
            try:
                configuration = _certificate_configuration(cert_file, key_file, client_ca_file)
            except InvalidOptionError as exc:
                log.error("keeping the current TLS certificate: %s", exc)
                return None
            log.info("TLS certificate reloaded from %s", cert_file)
            return configuration
        finally:
            lock.release()

    return grpc.dynamic_ssl_server_credentials(initial, renewed,
                                               require_client_authentication=client_ca_file is not None)
