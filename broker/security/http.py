"""The broker's HTTP endpoint (Prometheus ``/metrics``) under its TLS and access control.

TLS uses the broker's certificate, re-read when its files change (checked at most once a second
when a connection arrives), mutual under ``tls_client_ca_file``. Under access control a scrape
must authenticate with HTTP Basic credentials (access key, secret key: Prometheus'
``basic_auth``) of a user with ``admin`` on ``broker`` (the right of the broker-wide listings),
or it gets 401 / 403; failed secrets are throttled like any.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import make_server

from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family, _SilentHandler

from broker.security.guard import AccessGuard
from broker.wire.credentials import ACCESS_KEY_HEADER, SECRET_KEY_HEADER
from broker.wire.errors import OrderlyMQError, PermissionDeniedError
from broker.wire.https import ReloadingSslContext, TlsAccepting, basic_credentials

__all__ = ["ReloadingSslContext", "serve_http"]

log = logging.getLogger(__name__)

_RIGHT = ("admin", "broker")


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
