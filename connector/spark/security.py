"""TLS and credentials of the Spark source and sink, from their options or the environment.

Options ``tls.caFile``, ``tls.certFile``, ``tls.keyFile``, ``tls.serverName``, ``auth.accessKey``
and ``auth.secretKey``; without the ``auth.*`` options, ``ORDERLYMQ_ACCESS_KEY`` /
``ORDERLYMQ_SECRET_KEY`` of the process that plans the query. Spark redacts options whose name
contains ``secret`` or ``accessKey`` in plans and the UI; ``ConnectionSecurity`` never shows the
secret either. Helper processes (the lock warden) inherit it through their environment, never
through their command line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.wire.credentials import Credentials
from broker.wire.errors import InvalidOptionError
from broker.wire.tls import TlsOptions

__all__ = ["SECURITY_OPTIONS", "ConnectionSecurity"]

_TLS_OPTIONS = {"tls.caFile": "ca_file", "tls.certFile": "cert_file", "tls.keyFile": "key_file"}
SECURITY_OPTIONS = (*_TLS_OPTIONS, "tls.serverName", "auth.accessKey", "auth.secretKey")


def _tls(get: Callable[[str], str | None]) -> TlsOptions | None:
    files = {field: get(option) for option, field in _TLS_OPTIONS.items()}
    for option, field in _TLS_OPTIONS.items():
        path = files[field]
        if path is not None and not os.path.isfile(path):
            raise InvalidOptionError(f"option '{option}' names {path!r}, which is not a readable file")
    if bool(files["cert_file"]) != bool(files["key_file"]):
        raise InvalidOptionError("options 'tls.certFile' and 'tls.keyFile' go together: give both, or neither")
    server_name = get("tls.serverName")
    if not any(files.values()) and server_name is None:
        return None
    return TlsOptions(server_name=server_name, **files)


def _credentials(get: Callable[[str], str | None]) -> Credentials | None:
    key, secret = get("auth.accessKey"), get("auth.secretKey")
    if key is None and secret is None:
        return Credentials.from_environment()
    if key is None or secret is None:
        raise InvalidOptionError(f"option '{'auth.accessKey' if key is None else 'auth.secretKey'}' is missing: "
                                 "give auth.accessKey and auth.secretKey together")
    try:
        return Credentials(key, secret)
    except InvalidOptionError as exc:
        raise InvalidOptionError(f"options auth.accessKey / auth.secretKey: {exc}") from None


@dataclass(frozen=True)
class ConnectionSecurity:
    """How the connector's connections reach a broker: TLS, and whose credentials."""

    tls: TlsOptions | None = None
    credentials: Credentials | None = None

    @classmethod
    def from_options(cls, get: Callable[[str], str | None]) -> ConnectionSecurity:
        """From the options (``get(name)`` is the option's value or None); errors name the option."""
        return cls(_tls(get), _credentials(get))

    @classmethod
    def from_environment(cls) -> ConnectionSecurity:
        return cls(TlsOptions.from_environment(), Credentials.from_environment())

    def environment(self) -> dict[str, str]:
        """Variables that give a child process the same security (``from_environment``)."""
        env = self.tls.environment() if self.tls is not None else {}
        return {**env, **(self.credentials.environment() if self.credentials is not None else {})}

    def connect_kwargs(self) -> dict[str, Any]:
        """``BrokerConnection`` keyword arguments."""
        return {"tls": self.tls, "credentials": self.credentials}
