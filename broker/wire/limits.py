"""Size limits of names and message metadata, and the one check of them.

Names are kept in memory and on disk for as long as they are in use (a group's offsets, a lock's
holder), so a name of megabytes would cost megabytes per entry. The limits follow RocketMQ's
(topic 127 characters, group 255) and are counted in UTF-8 bytes, what the broker stores.

=====================  ===========
what                   max bytes
=====================  ===========
topic                  127
consumer group         255
client id              255
message tag            255
property key           255
property value         32,768
=====================  ===========
"""

from __future__ import annotations

from broker.wire.errors import InvalidRequestError

__all__ = [
    "MAX_CLIENT_ID_BYTES",
    "MAX_GROUP_BYTES",
    "MAX_PROPERTY_KEY_BYTES",
    "MAX_PROPERTY_VALUE_BYTES",
    "MAX_TAG_BYTES",
    "MAX_TOPIC_BYTES",
    "check_name",
    "shown",
]

MAX_TOPIC_BYTES = 127
MAX_GROUP_BYTES = 255
MAX_CLIENT_ID_BYTES = 255
MAX_TAG_BYTES = 255
MAX_PROPERTY_KEY_BYTES = 255
MAX_PROPERTY_VALUE_BYTES = 32 * 1024

_SHOWN_CHARS = 40


def shown(value: object) -> str:
    """``repr(value)`` cut to a few dozen characters, so an error about a huge name stays short."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}... ({len(text)} characters)"


def check_name(what: str, value: object, max_bytes: int) -> str:
    """``value`` if it is a non-empty string of at most ``max_bytes`` UTF-8 bytes.

    Raises
    ------
    InvalidRequestError
        Naming ``what``, the limit and the size found.
    """
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{what} must be a non-empty string, got {shown(value)}")
    if len(value) > max_bytes or len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        size = len(value.encode("utf-8", "surrogatepass"))
        raise InvalidRequestError(
            f"{what} {shown(value)} is {size} bytes long; the limit is {max_bytes} bytes (UTF-8): use a shorter {what}"
        )
    return value
