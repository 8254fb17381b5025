"""How a broker reaches ZooKeeper: TLS and a digest user, like its other links.

With ``zookeeper_tls_ca_file`` the session runs over TLS (ZooKeeper's ``secureClientPort``) and
ZooKeeper's certificate must be signed by that CA and name the host dialed; with
``zookeeper_tls_cert_file`` / ``zookeeper_tls_key_file`` the broker presents a certificate
(ZooKeeper's ``ssl.clientAuth=need``). With ``zookeeper_auth_file`` (one line ``user:password``)
the broker authenticates as that digest user and creates every node readable and writable by
that user alone, so other ZooKeeper clients can neither read nor change the cluster's state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.config import BrokerConfig
from broker.wire.errors import InvalidOptionError
from broker.wire.tls import read_pem

__all__ = ["zookeeper_client_options"]


def _digest_user(path: str) -> tuple[str, str]:
    try:
        text = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidOptionError(f"zookeeper_auth_file: cannot read {path!r} ({getattr(exc, 'strerror', '') or exc})"
                                 ) from None
    user, sep, password = text.partition(":")
    if not sep or not user or not password or "\n" in text:
        raise InvalidOptionError(f"zookeeper_auth_file {path!r} must hold one line user:password")
    return user, password


def zookeeper_client_options(config: BrokerConfig) -> dict[str, Any]:
    """``KazooClient`` keywords for ``config``'s ZooKeeper TLS and digest user (none: plaintext,
    open nodes); the files are checked now, naming their setting."""
    from kazoo.security import make_digest_acl  # kazoo is the `cluster` extra

    options: dict[str, Any] = {}
    if config.zookeeper_tls_ca_file:
        read_pem(config.zookeeper_tls_ca_file, "zookeeper_tls_ca_file")
        read_pem(config.zookeeper_tls_cert_file, "zookeeper_tls_cert_file")
        read_pem(config.zookeeper_tls_key_file, "zookeeper_tls_key_file")
        options.update(use_ssl=True, verify_certs=True, check_hostname=True, ca=config.zookeeper_tls_ca_file,
                       certfile=config.zookeeper_tls_cert_file or None, keyfile=config.zookeeper_tls_key_file or None)
    if config.zookeeper_auth_file:
        user, password = _digest_user(config.zookeeper_auth_file)
        options.update(auth_data=[("digest", f"{user}:{password}")],
                       default_acl=[make_digest_acl(user, password, all=True)])
    return options
