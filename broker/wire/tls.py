"""TLS material as gRPC credentials for everything that dials a broker.

One place builds them from PEM files: ``channel_credentials`` for the clients, the CLI, the Spark
connector and replication links (the broker's own side, which follows renewed files, is
``broker.security.certificates``). A missing or unreadable file is an ``InvalidOptionError``
naming the setting or option that pointed at it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import grpc

from broker.wire.errors import InvalidOptionError

__all__ = ["TLS_ENV", "TlsOptions", "channel_credentials", "channel_options", "read_pem"]

#: The environment variables of each ``TlsOptions`` field (how a helper process inherits them).
TLS_ENV = {"ca_file": "ORDERLYMQ_TLS_CA_FILE", "cert_file": "ORDERLYMQ_TLS_CERT_FILE",
           "key_file": "ORDERLYMQ_TLS_KEY_FILE", "server_name": "ORDERLYMQ_TLS_SERVER_NAME"}


@dataclass(frozen=True)
class TlsOptions:
    """How a client verifies the broker and, for mutual TLS, proves who it is.

    Attributes
    ----------
    ca_file : str or None
        PEM of the certificate authorities that sign broker certificates; None trusts the
        system's roots.
    cert_file, key_file : str or None
        The client's own certificate chain and private key (both or neither), for brokers that
        require client certificates.
    server_name : str or None
        The name to check the broker's certificate against, when it differs from the host dialed.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidOptionError(
                "TLS client certificate and key go together: give both cert_file and key_file, or neither"
            )

    def environment(self) -> dict[str, str]:
        """The variables ``from_environment`` reads back."""
        return {TLS_ENV[f.name]: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> TlsOptions | None:
        """TLS from ``ORDERLYMQ_TLS_*`` variables; None when none is set."""
        environ = os.environ if environ is None else environ
        values = {name: environ.get(var) or None for name, var in TLS_ENV.items()}
        return cls(**values) if any(values.values()) else None


def read_pem(path: str | None, name: str) -> bytes | None:
    """The bytes of the PEM file ``path`` (None when not set); ``name`` is the setting that gave it."""
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidOptionError(f"{name}: cannot read {path!r} ({exc.strerror or exc})") from None


def channel_credentials(tls: TlsOptions, *, names: tuple[str, str, str] = ("ca_file", "cert_file", "key_file"),
                        ) -> grpc.ChannelCredentials:
    """Credentials of a secure channel to a broker; ``names`` are the option names used in errors."""
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(tls.ca_file, names[0]),
        private_key=read_pem(tls.key_file, names[2]),
        certificate_chain=read_pem(tls.cert_file, names[1]),
    )


def channel_options(tls: TlsOptions | None) -> list[tuple[str, str]]:
    """Channel arguments a TLS connection needs beside its credentials."""
    if tls is not None and tls.server_name:
        return [("grpc.ssl_target_name_override", tls.server_name)]
    return []
