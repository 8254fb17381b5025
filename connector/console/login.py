"""Who may read the console: HTTP Basic credentials (access key, secret key) the broker checks.

A login is checked by a ``ListGroups`` call with those credentials: the broker-wide listing the
console shows, so exactly the users with ``admin`` on ``broker`` get in. The broker's ACL decides
(a rule change applies at once) and its throttle slows guessing. A login the broker accepted is
remembered for ``ttl`` seconds, keyed by a hash of the key and secret, never the secret itself.
"""

from __future__ import annotations

import hashlib
import threading
import time
from http import HTTPStatus

from broker.wire.credentials import Credentials
from broker.wire.errors import OrderlyMQError, PermissionDeniedError, UnauthenticatedError
from broker.wire.https import basic_credentials
from broker.wire.tls import TlsOptions
from connector.client.admin import Admin

__all__ = ["BrokerLogin", "LoginRefused"]

_CHECK_TIMEOUT_S = 5.0


class LoginRefused(Exception):
    """Why a request may not read the console, with the HTTP status to answer."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class BrokerLogin:
    """``check(authorization_header)``: the user, or ``LoginRefused``."""

    def __init__(self, brokers: str, tls: TlsOptions | None = None, *, ttl: float = 30.0) -> None:
        self._brokers = brokers
        self._tls = tls
        self._ttl = ttl
        self._accepted: dict[bytes, float] = {}  # hash of key and secret -> until when
        self._lock = threading.Lock()

    def check(self, authorization: str) -> str:
        credentials = basic_credentials(authorization)
        if credentials is None or not credentials[0]:
            raise LoginRefused(HTTPStatus.UNAUTHORIZED, "log in with an access key and secret key of the broker")
        key, secret = credentials
        token = hashlib.sha256(f"{key}\0{secret}".encode()).digest()
        with self._lock:
            if self._accepted.get(token, 0.0) > time.monotonic():
                return key
        self._ask_broker(Credentials(key, secret))
        with self._lock:
            self._accepted[token] = time.monotonic() + self._ttl
        return key

    def _ask_broker(self, credentials: Credentials) -> None:
        try:
            with Admin(self._brokers, timeout=_CHECK_TIMEOUT_S, retry_timeout=0, tls=self._tls,
                       credentials=credentials) as admin:
                admin.groups()
        except UnauthenticatedError as exc:
            raise LoginRefused(HTTPStatus.UNAUTHORIZED, str(exc)) from None
        except PermissionDeniedError as exc:
            raise LoginRefused(HTTPStatus.FORBIDDEN, f"{exc} (the console shows what admin on broker may list)") from None
        except OrderlyMQError as exc:
            raise LoginRefused(HTTPStatus.SERVICE_UNAVAILABLE, f"the broker could not check the login: {exc}") from None
