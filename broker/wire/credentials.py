"""A user's credentials as they travel with every call: an access key and its secret.

Both ends agree here on the metadata that carries them. The broker keeps only a salted hash of
each secret (``broker.security``), so the secret itself must cross the wire: use TLS for anything
but loopback. ``Credentials`` never shows its secret in ``repr``, logs or errors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.wire.errors import InvalidOptionError

__all__ = ["ACCESS_KEY_HEADER", "ACCESS_KEY_ENV", "SECRET_KEY_ENV", "SECRET_KEY_HEADER", "Credentials"]

ACCESS_KEY_HEADER = "orderlymq-access-key"
SECRET_KEY_HEADER = "orderlymq-secret-key"
ACCESS_KEY_ENV = "ORDERLYMQ_ACCESS_KEY"
SECRET_KEY_ENV = "ORDERLYMQ_SECRET_KEY"

# gRPC metadata values must be printable ASCII; a key is also kept short and free of spaces
# so that it can be named in errors and logs as it is.
_MAX_LENGTH = 256


def _check(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidOptionError(f"{name} must be a non-empty string")
    if len(value) > _MAX_LENGTH or not all("!" <= ch <= "~" for ch in value):
        raise InvalidOptionError(f"{name} must be 1-{_MAX_LENGTH} printable ASCII characters without spaces")
    return value


@dataclass(frozen=True)
class Credentials:
    """An access key (the user's name, shown in errors) and its secret key (never shown)."""

    access_key: str
    secret_key: str = field(repr=False)

    def __post_init__(self) -> None:
        _check(self.access_key, "access key")
        _check(self.secret_key, f"secret key of {self.access_key!r}")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata that carries these credentials."""
        return ((ACCESS_KEY_HEADER, self.access_key), (SECRET_KEY_HEADER, self.secret_key))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Credentials | None:
        """``ORDERLYMQ_ACCESS_KEY`` / ``ORDERLYMQ_SECRET_KEY``, or None when neither is set."""
        environ = os.environ if environ is None else environ
        key, secret = environ.get(ACCESS_KEY_ENV), environ.get(SECRET_KEY_ENV)
        if not key and not secret:
            return None
        if not key or not secret:
            missing = ACCESS_KEY_ENV if not key else SECRET_KEY_ENV
            raise InvalidOptionError(f"{missing} is not set: set both {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}, or neither")
        return cls(key, secret)

    def environment(self) -> dict[str, str]:
        """The variables ``from_environment`` reads: how a helper process inherits these credentials."""
        return {ACCESS_KEY_ENV: self.access_key, SECRET_KEY_ENV: self.secret_key}
