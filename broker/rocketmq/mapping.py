"""Messages between RocketMQ's model and ours: pure functions, no I/O.

=====================================  =====================================================
RocketMQ 5                             orderlymq
=====================================  =====================================================
message group (FIFO)                   ``key``: the sharding key, routed by ``queue_for_key``
tag                                    ``tag``
user properties                        ``properties`` (as they are)
keys                                   property ``rocketmq.keys`` (space separated)
message id                             property ``rocketmq.message_id``; a message without
                                       one is given ``OMQ<queue>-<offset>`` when delivered
born timestamp / store timestamp       ``born_timestamp`` / ``store_timestamp``
queue id / queue offset                queue id / ``queue_offset``
=====================================  =====================================================

A FIFO message lands in ``queue_for_key(message_group, queue_count)``, the queue our producer and
Spark sink give the same key, so one key keeps one order whoever wrote it. A normal message (no
group) lands in ``queue_for_key(message_id, ...)``: spread over the queues, and the same queue
when the client retries it, which is what lets the retry be recognized (``producer_identity``).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Mapping
from typing import Any

from broker.rocketmq.protocol import Code, definition
from broker.rocketmq.statuses import RocketMQStatusError
from broker.wire.routing import queue_for_key

__all__ = [
    "KEYS_PROPERTY",
    "MESSAGE_ID_PROPERTY",
    "message_id_of",
    "producer_identity",
    "target_queue",
    "to_rocketmq",
    "to_row",
    "with_digest",
]

MESSAGE_ID_PROPERTY = "rocketmq.message_id"
KEYS_PROPERTY = "rocketmq.keys"
_RESERVED = (MESSAGE_ID_PROPERTY, KEYS_PROPERTY)
_SUPPORTED_TYPES = (definition.MessageType.NORMAL, definition.MessageType.FIFO,
                    definition.MessageType.TRANSACTION, definition.MessageType.MESSAGE_TYPE_UNSPECIFIED)
# Message ids of the RocketMQ 5 clients: "01", MAC (12 hex), pid (4 hex), then seconds since
# 2021 (8 hex) and a per-process counter (8 hex). Version, MAC and pid name the producing process.
_V1_PREFIX, _V1_LENGTH, _V1_PROCESS_END = "01", 34, 18


def _ms(timestamp) -> int:
    return timestamp.seconds * 1000 + timestamp.nanos // 1_000_000


def _body(message: definition.Message) -> bytes:
    encoding = message.system_properties.body_encoding
    if encoding == definition.Encoding.GZIP:  # the Java client compresses large bodies
        try:
            return gzip.decompress(message.body)
        except (OSError, EOFError, zlib.error):
            raise RocketMQStatusError(Code.MESSAGE_CORRUPTED, "the message body is marked GZIP but does not "
                                      "decompress") from None
    if encoding not in (definition.Encoding.IDENTITY, definition.Encoding.ENCODING_UNSPECIFIED):
        raise RocketMQStatusError(Code.BAD_REQUEST, f"body encoding {encoding} is not supported; send "
                                  "IDENTITY or GZIP bodies")
    return message.body


def _check_type(message: definition.Message) -> None:
    props = message.system_properties
    kind = props.message_type
    name = definition.MessageType.Name(kind) if kind in definition.MessageType.values() else str(kind)
    if kind not in _SUPPORTED_TYPES:
        raise RocketMQStatusError(Code.UNSUPPORTED, f"{name} messages are not supported by orderlymq; send "
                                  "NORMAL, FIFO or TRANSACTION messages")
    if props.HasField("delivery_timestamp"):
        raise RocketMQStatusError(Code.UNSUPPORTED, "delayed delivery (delivery_timestamp) is not supported by "
                                  "orderlymq; messages are delivered when stored")
    if kind == definition.MessageType.TRANSACTION and props.message_group:
        raise RocketMQStatusError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a transactional message cannot "
                                  "have a message group")
    if kind == definition.MessageType.FIFO and not props.message_group:
        raise RocketMQStatusError(Code.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group: it is the "
                                  "key that decides its queue and its order")


def to_row(message: definition.Message) -> dict[str, Any]:
    """The message as one of our rows (``codec.messages_to_batch`` input); refuses what we cannot keep."""
    _check_type(message)
    body = _body(message)
    if not body:
        raise RocketMQStatusError(Code.MESSAGE_BODY_EMPTY, "the message body is empty; send at least one byte")
    props = message.system_properties
    properties = dict(message.user_properties)
    if props.message_id:
        properties[MESSAGE_ID_PROPERTY] = props.message_id
    if props.keys:
        properties[KEYS_PROPERTY] = " ".join(props.keys)
    return {
        "key": props.message_group or None,
        "tag": props.tag or None,
        "body": body,
        "properties": properties,
        "born_timestamp": _ms(props.born_timestamp) if props.HasField("born_timestamp") else None,
    }


def target_queue(message: definition.Message, queue_count: int, fallback: int) -> int:
    """Where a message goes: its group's queue, else its id's, else ``fallback``."""
    props = message.system_properties
    if props.message_group:
        return queue_for_key(props.message_group, queue_count)
    if props.message_id:
        return queue_for_key(props.message_id, queue_count)
    return fallback % queue_count


def producer_identity(message_id: str, client_id: str) -> tuple[str, int]:
    """``(producer_id, sequence)`` for our idempotent append, from a RocketMQ 5 message id and the
    id of the client instance that sends it.

    The client keeps a message's id across its send retries, so a retry maps to the same pair and
    is stored once. The client instance id (unique: host, pid, a random part) keeps two processes
    whose message ids share MAC and pid bits apart. Without a client id, or for ids of another
    shape, ``("", -1)``: stored without that check.
    """
    if not client_id or len(message_id) != _V1_LENGTH or not message_id.startswith(_V1_PREFIX):
        return "", -1
    try:
        sequence = int(message_id[_V1_PROCESS_END:], 16)
        int(message_id[len(_V1_PREFIX):_V1_PROCESS_END], 16)
    except ValueError:
        return "", -1
    return f"rocketmq:{client_id}:{message_id[len(_V1_PREFIX):_V1_PROCESS_END]}", sequence


def message_id_of(properties: Mapping[str, str], queue_id: int, offset: int) -> str:
    return properties.get(MESSAGE_ID_PROPERTY) or f"OMQ{queue_id:04X}-{offset:016X}"


def with_digest(message: definition.Message) -> definition.Message:
    """``message`` with the CRC32 body digest clients check (and complain about when missing)."""
    message.system_properties.body_digest.type = definition.DigestType.CRC32
    message.system_properties.body_digest.checksum = format(zlib.crc32(message.body) & 0xFFFFFFFF, "08X")
    return message


def to_rocketmq(row: Mapping[str, Any], topic: str, queue_id: int, *, receipt_handle: str,
                delivery_attempt: int, invisible_ms: int) -> definition.Message:
    """A stored row (``STORED_SCHEMA`` as Python values, timestamps as ms) as the Message a consumer
    receives."""
    properties = dict(row.get("properties") or ())
    offset = row["queue_offset"]
    message = definition.Message(body=row["body"])
    message.topic.name = topic
    props = message.system_properties
    props.message_id = message_id_of(properties, queue_id, offset)
    keys = properties.get(KEYS_PROPERTY)
    if keys:
        props.keys.extend(keys.split(" "))
    for name in _RESERVED:
        properties.pop(name, None)
    message.user_properties.update(properties)
    if row.get("tag"):
        props.tag = row["tag"]
    if row.get("key"):
        props.message_group = row["key"]
        props.message_type = definition.MessageType.FIFO
    else:
        props.message_type = definition.MessageType.NORMAL
    props.body_encoding = definition.Encoding.IDENTITY
    if row.get("born_timestamp") is not None:
        props.born_timestamp.FromMilliseconds(row["born_timestamp"])
    if row.get("store_timestamp") is not None:
        props.store_timestamp.FromMilliseconds(row["store_timestamp"])
    props.queue_id = queue_id
    props.queue_offset = offset
    props.receipt_handle = receipt_handle
    props.delivery_attempt = delivery_attempt
    props.invisible_duration.FromMilliseconds(invisible_ms)
    return with_digest(message)
