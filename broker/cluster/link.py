"""How a slave dials its master: the same TLS and credentials a client would use.

The ``Replication`` service shares the master's client port, so a slave meets the same gates as
any client: TLS when the group serves TLS (it verifies the master's certificate with
``replication_tls_ca_file``, and presents a certificate of its own under mutual TLS), and, with
``acl_file``, the credentials of ``replication_access_key``, whose secret is read from
``replication_secret_file`` at every (re)connection so it can be rotated without a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from broker.config import BrokerConfig
from broker.wire.credentials import Credentials
from broker.wire.errors import InvalidOptionError
from broker.wire.tls import TlsOptions, channel_credentials

__all__ = ["ReplicationLink"]

_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 << 20)]


def _read_secret(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise InvalidOptionError(f"replication_secret_file: cannot read {path!r} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InvalidOptionError(f"replication_secret_file: {path!r} is not text") from None


@dataclass(frozen=True)
class ReplicationLink:
    """TLS options (None: plaintext) and the replication user of one broker's slave side."""

    tls: TlsOptions | None = None
    access_key: str = ""
    secret_file: str = ""
    tls_settings: tuple[str, str, str] = ("replication_tls_ca_file", "tls_cert_file", "tls_key_file")  # for errors

    @classmethod
    def from_config(cls, config: BrokerConfig) -> ReplicationLink:
        """The link ``config`` asks for, with its files checked now (a missing one names its setting)."""
        tls, own = None, not config.replication_tls_cert_file
        if config.tls:  # under mutual TLS the slave presents a certificate: its own one unless told otherwise
            mutual = bool(config.tls_client_ca_file)
            tls = TlsOptions(ca_file=config.replication_tls_ca_file or None,
                             cert_file=(config.replication_tls_cert_file or config.tls_cert_file) if mutual else None,
                             key_file=(config.replication_tls_key_file or config.tls_key_file) if mutual else None)
        names = ("replication_tls_ca_file", *(("tls_cert_file", "tls_key_file") if own else
                                              ("replication_tls_cert_file", "replication_tls_key_file")))
        link = cls(tls, config.replication_access_key, config.replication_secret_file, names)
        if tls is not None:
            link.credentials()
        link.metadata()
        return link

    @property
    def plain(self) -> bool:
        """Plaintext with no credentials: the master's lean port (which has neither) may carry it."""
        return self.tls is None and not self.access_key

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel's TLS credentials, the PEM files read now (renewed files apply to the next link)."""
        return channel_credentials(self.tls, names=self.tls_settings)

    def channel(self, address: str) -> grpc.Channel:
        """A channel to the master at ``address``."""
        if self.tls is None:
            return grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        return grpc.secure_channel(address, self.credentials(), options=_CHANNEL_OPTIONS)

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The call metadata of the replication user (the secret file read now), or None without one."""
        if not self.access_key:
            return None
        secret = _read_secret(self.secret_file)
        try:
            return Credentials(self.access_key, secret).metadata()
        except InvalidOptionError as exc:
            raise InvalidOptionError(f"replication_access_key / replication_secret_file {self.secret_file!r}: "
                                     f"{exc}") from None
