"""The send port's framing (version 1): ``SendRequest`` / ``SendResponse`` over plain TCP.

A gRPC call costs about as much as storing a small message several times over, so a producer's
synchronous one-message sends may use a lean port instead (docs/client.md). The connection opens
with a hello each way, ``HELLO`` + version (u16) + 2 zero bytes; the broker answers with the version
it speaks, and a client that gets another one closes the connection. Then each request is a frame,
u32 length (little endian) + a serialized ``SendRequest``, and each answer a frame holding a
``SendResponse``, in request order, with the failure of a request in its ``error_*`` fields like a
``SendStream`` answer. A frame longer than the broker's limit gets an error answer and the
connection closes.
"""

from __future__ import annotations

import struct

__all__ = ["HELLO", "HELLO_SIZE", "LENGTH", "VERSION", "hello"]

HELLO = b"OMQS"
VERSION = 1
LENGTH = struct.Struct("<I")
_HELLO = struct.Struct("<4sHH")
HELLO_SIZE = _HELLO.size


def hello(version: int = VERSION) -> bytes:
    return _HELLO.pack(HELLO, version, 0)


def parse_hello(raw: bytes) -> int | None:
    """The version a hello announces; None when ``raw`` is not a hello."""
    magic, version, _ = _HELLO.unpack(raw)
    return version if magic == HELLO else None
