"""Secrets kept as salted scrypt hashes: the ACL file never holds a secret itself.

scrypt (``hashlib.scrypt``, OpenSSL's) is slow and memory-hard on purpose, so a stolen ACL file
does not give its secrets away cheaply; the broker verifies a secret once and then remembers it
(``broker.security.guard``), so the cost is not paid on every call.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

__all__ = ["hash_secret", "verify_secret"]

_SCHEME = "scrypt"
_N, _R, _P = 2**14, 8, 1  # ~16 MiB and tens of ms per hash: OWASP's minimum for scrypt
_SALT_BYTES = 16
_HASH_BYTES = 32


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(secret.encode(), salt=salt, n=n, r=r, p=p, maxmem=2 * 128 * n * r * p,
                          dklen=_HASH_BYTES)


def hash_secret(secret: str) -> str:
    """``scrypt$N$r$p$<salt>$<hash>`` (base64) of ``secret`` with a fresh random salt."""
    salt = os.urandom(_SALT_BYTES)
    return "$".join([_SCHEME, str(_N), str(_R), str(_P), _b64(salt), _b64(_scrypt(secret, salt, _N, _R, _P))])


def verify_secret(secret: str, stored: str) -> bool:
    """Whether ``secret`` hashes to ``stored``; False (never an error) for a malformed ``stored``."""
    try:
        scheme, n, r, p, salt, expected = stored.split("$")
        if scheme != _SCHEME:
            return False
        actual = _scrypt(secret, base64.b64decode(salt), int(n), int(r), int(p))
        return hmac.compare_digest(actual, base64.b64decode(expected))
    except (ValueError, TypeError, OverflowError):
        return False
