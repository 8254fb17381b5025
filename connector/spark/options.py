"""Options of the ``orderlymq`` source and sink: frozen dataclasses built by ``from_options``.

Spark hands a data source its options as a case-insensitive mapping of strings. ``SourceOptions``
and ``SinkOptions`` parse and check them once, when the query is planned, so a bad option fails
before any task runs. Every error is an ``InvalidOptionError`` that names the option and the fix.
Checks that need the broker (does the topic exist, are the offsets in range) happen at query start
in the readers and writers; checks that need the input schema live in ``SinkOptions.check_schema``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.wire.errors import InvalidOptionError
from connector.client.connection import BrokerConnection, parse_brokers
from connector.client.routed import RoutedConnection
from connector.spark.connections import shared_connection, shared_direct_connection
from connector.spark.security import SECURITY_OPTIONS, ConnectionSecurity

__all__ = [
    "EARLIEST",
    "GROUP_OFFSET_CONFLICT_MODES",
    "LATEST",
    "SINK_OPTIONS",
    "SOURCE_OPTIONS",
    "OffsetSpec",
    "SinkOptions",
    "SourceOptions",
]

#: In per-queue offsets JSON: -2 means the earliest retained offset, -1 the latest (end of queue).
EARLIEST = -2
LATEST = -1

SOURCE_OPTIONS = (
    "brokers",
    "topic",
    "topics",
    "consumerGroup",
    "tags",
    "startingOffsets",
    "startingTimestamp",
    "endingOffsets",
    "endingTimestamp",
    "maxMessagesPerTrigger",
    "failOnDataLoss",
    "lockTimeoutMs",
    "pollTimeoutMs",
    "includeProperties",
    "groupOffsetConflict",
    *SECURITY_OPTIONS,
)
SINK_OPTIONS = (
    "brokers",
    "topic",
    "shardingKey",
    "tagColumn",
    "propertiesColumns",
    "bodyColumn",
    "exactlyOnce",
    "maxBatchBytes",
    "transactionTimeoutMs",
    "requestTimeoutMs",
    *SECURITY_OPTIONS,
)
# Options Spark itself may pass along with the user's; never an error.
_SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})

DEFAULT_LOCK_TIMEOUT_MS = 65_000  # a little over the broker's default lease: a crashed holder expires meanwhile
DEFAULT_POLL_TIMEOUT_MS = 30_000
DEFAULT_REQUEST_TIMEOUT_MS = 30_000  # the sink's pollTimeoutMs
DEFAULT_MAX_BATCH_BYTES = 4 * 1024 * 1024
# How long a task's staged rows wait for the driver's commit: a batch's first tasks wait for its
# last, which in a long backfill may be hours later.
DEFAULT_COMMIT_WAIT_MS = 24 * 60 * 60 * 1000

#: What a query restarted from its checkpoint does when another client moved the group's offsets.
GROUP_OFFSET_CONFLICT_MODES = ("fail", "group", "checkpoint")


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends.

    ``kind`` is ``committed``, ``earliest``, ``latest``, ``offsets`` (per-queue ``offsets``:
    ``{topic: {queue_id: offset}}`` where ``EARLIEST``/``LATEST`` are allowed) or ``timestamp``
    (``timestamp`` in ms since the epoch: the first message stored at or after it).
    """

    kind: str
    offsets: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    timestamp: int | None = None

    @property
    def option_name(self) -> str:
        return "startingTimestamp" if self.kind == "timestamp" else "startingOffsets"


class _Options:
    """A case-insensitive view of the user's options that remembers which ones were read."""

    def __init__(self, mapping: Mapping[str, Any], known: tuple[str, ...], role: str) -> None:
        self._values = {str(k).lower(): v for k, v in dict(mapping).items()}
        self._canonical = {name.lower(): name for name in known}
        self._role = role
        unknown = [k for k in self._values if k not in self._canonical and k not in _SPARK_OPTIONS]
        if unknown:
            name = next(k for k in mapping if str(k).lower() == unknown[0])
            close = difflib.get_close_matches(unknown[0], list(self._canonical), n=1, cutoff=0.6)
            hint = f"did you mean '{self._canonical[close[0]]}'? " if close else ""
            raise InvalidOptionError(
                f"unknown option '{name}' for the orderlymq {role}: {hint}the {role} options are {', '.join(known)}"
            )

    def get(self, name: str) -> str | None:
        value = self._values.get(name.lower())
        if value is None:
            return None
        text = str(value).strip()
        return text or None

    def has(self, name: str) -> bool:
        return self.get(name) is not None

    def required(self, name: str, example: str) -> str:
        value = self.get(name)
        if value is None:
            raise InvalidOptionError(f"option '{name}' is required for the orderlymq {self._role}, e.g. {example}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise InvalidOptionError(f"option '{name}' must be true or false, got {value!r}")

    def integer(self, name: str, default: int | None, *, minimum: int, maximum: int | None = None,
                unit: str = "") -> int | None:
        value = self.get(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise InvalidOptionError(f"option '{name}' must be an integer{unit}, got {value!r}") from None
        if number < minimum:
            raise InvalidOptionError(f"option '{name}' must be at least {minimum}{unit}, got {number}")
        if maximum is not None and number > maximum:
            raise InvalidOptionError(f"option '{name}' must be at most {maximum}{unit}, got {number}")
        return number


def _brokers(opts: _Options) -> str:
    brokers = opts.required("brokers", ".option('brokers', '127.0.0.1:9876')")
    parse_brokers(brokers)
    return brokers


def _topic_list(text: str, name: str) -> tuple[str, ...]:
    topics = tuple(t.strip() for t in text.split(","))
    if any(not t for t in topics):
        raise InvalidOptionError(f"option '{name}' has an empty topic name in {text!r}: list names separated by commas")
    if len(set(topics)) != len(topics):
        raise InvalidOptionError(f"option '{name}' names a topic twice in {text!r}: list each topic once")
    return topics


def _parse_offsets_json(text: str, name: str, topics: tuple[str, ...], *, ending: bool) -> dict[str, dict[int, int]]:
    example = '{"orders": {"0": 42, "1": -2}}' if not ending else '{"orders": {"0": 100, "1": -1}}'
    special = "-1 for the latest offset" + ("" if ending else " and -2 for the earliest")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidOptionError(
            f"option '{name}' is not valid JSON ({exc.msg} at position {exc.pos}): give per-queue offsets "
            f"like {example}, with {special}"
        ) from None
    if not isinstance(parsed, dict) or not parsed:
        raise InvalidOptionError(f"option '{name}' must be a JSON object of topics to queue offsets, e.g. {example}")
    out: dict[str, dict[int, int]] = {}
    for topic, queues in parsed.items():
        if topic not in topics:
            raise InvalidOptionError(
                f"option '{name}' names topic {topic!r}, which the query does not read "
                f"(topics: {', '.join(topics)}): remove it or add it to 'topic'"
            )
        if not isinstance(queues, dict) or not queues:
            raise InvalidOptionError(f"option '{name}': topic {topic!r} must map queue ids to offsets, e.g. {example}")
        per_queue: dict[int, int] = {}
        for queue, offset in queues.items():
            try:
                queue_id = int(queue)
            except (TypeError, ValueError):
                raise InvalidOptionError(
                    f"option '{name}': queue id {queue!r} of topic {topic!r} is not an integer, e.g. {example}"
                ) from None
            lowest = LATEST if ending else EARLIEST
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < lowest or queue_id < 0:
                raise InvalidOptionError(
                    f"option '{name}': offset {offset!r} of queue {topic}/{queue} is not valid: use an offset "
                    f">= 0, or {special}"
                )
            per_queue[queue_id] = offset
        out[topic] = per_queue
    missing = [t for t in topics if t not in out]
    if missing:
        raise InvalidOptionError(
            f"option '{name}' gives no offsets for topic(s) {', '.join(missing)}: add them, e.g. {example}"
        )
    return out


def _group_offset_conflict(opts: _Options, *, streaming: bool) -> str:
    value = opts.get("groupOffsetConflict")
    if value is None:
        return "fail"
    if not streaming:
        raise InvalidOptionError(
            "option 'groupOffsetConflict' applies to streaming reads only (a batch read keeps no checkpoint): "
            "remove it"
        )
    mode = value.lower()
    if mode not in GROUP_OFFSET_CONFLICT_MODES:
        raise InvalidOptionError(
            f"option 'groupOffsetConflict' must be fail, group or checkpoint, got {value!r}: fail stops a query "
            "restarted from its checkpoint when another client moved the group's offsets, group follows the "
            "group's offsets, checkpoint keeps the checkpoint's"
        )
    return mode


@dataclass(frozen=True)
class SourceOptions:
    """The checked options of a read (``spark.read`` / ``spark.readStream``)."""

    brokers: str
    topics: tuple[str, ...]
    consumer_group: str | None = None
    tags: str = "*"
    starting: OffsetSpec = field(default_factory=lambda: OffsetSpec("committed"))
    ending: OffsetSpec = field(default_factory=lambda: OffsetSpec("latest"))
    max_messages_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    include_properties: bool = True
    group_offset_conflict: str = "fail"
    security: ConnectionSecurity = field(default_factory=ConnectionSecurity)

    def connect(self) -> RoutedConnection:
        """A connection to the broker or cluster (each queue's calls go to its group's master) whose
        calls, and retries while a broker is down, last up to ``pollTimeoutMs``."""
        seconds = self.poll_timeout_ms / 1000
        return RoutedConnection(self.brokers, timeout=seconds, retry_timeout=seconds, **self.security.connect_kwargs())

    def connect_direct(self, addresses: Sequence[str] = ()) -> BrokerConnection:
        """This process's plain connection to ``addresses`` (a broker group, which it follows to its
        master by itself), or to ``brokers`` (a single broker); calls last up to ``pollTimeoutMs``.
        Shared by the process's tasks (``connector.spark.connections``): never closed by its users."""
        return shared_direct_connection(",".join(addresses) or self.brokers, self.security,
                                        timeout=self.poll_timeout_ms / 1000)

    @classmethod
    def from_options(cls, mapping: Mapping[str, Any], *, streaming: bool = True) -> SourceOptions:
        """Parse Spark's options; ``InvalidOptionError`` naming the option and the fix when wrong."""
        opts = _Options(mapping, SOURCE_OPTIONS, "source")
        brokers = _brokers(opts)
        if opts.has("topic") and opts.has("topics"):
            raise InvalidOptionError("options 'topic' and 'topics' are both set: give one of them")
        name = "topics" if opts.has("topics") else "topic"
        topics = _topic_list(opts.required(name, ".option('topic', 'orders') or .option('topics', 'a,b')"), name)
        group = opts.get("consumerGroup")
        if streaming and group is None:
            raise InvalidOptionError(
                "option 'consumerGroup' is required for a streaming read: the group owns the queue locks and "
                "the committed offsets, e.g. .option('consumerGroup', 'billing')"
            )
        starting = cls._starting(opts, topics, streaming=streaming, group=group)
        ending = cls._ending(opts, topics, streaming=streaming)
        max_per_trigger = opts.integer("maxMessagesPerTrigger", None, minimum=1)
        if max_per_trigger is not None and not streaming:
            raise InvalidOptionError(
                "option 'maxMessagesPerTrigger' applies to streaming reads only: remove it, or bound a batch "
                "read with 'endingOffsets'"
            )
        return cls(
            brokers=brokers,
            topics=topics,
            consumer_group=group,
            tags=opts.get("tags") or "*",
            starting=starting,
            ending=ending,
            max_messages_per_trigger=max_per_trigger,
            fail_on_data_loss=opts.boolean("failOnDataLoss", True),
            lock_timeout_ms=opts.integer("lockTimeoutMs", DEFAULT_LOCK_TIMEOUT_MS, minimum=0, unit=" (ms)"),
            poll_timeout_ms=opts.integer("pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS, minimum=1, unit=" (ms)"),
            include_properties=opts.boolean("includeProperties", True),
            group_offset_conflict=_group_offset_conflict(opts, streaming=streaming),
            security=ConnectionSecurity.from_options(opts.get),
        )

    @staticmethod
    def _starting(opts: _Options, topics: tuple[str, ...], *, streaming: bool, group: str | None) -> OffsetSpec:
        text = opts.get("startingOffsets")
        stamp = opts.integer("startingTimestamp", None, minimum=0, unit=" (ms since the epoch)")
        if text is not None and stamp is not None:
            raise InvalidOptionError("options 'startingOffsets' and 'startingTimestamp' are both set: give one of them")
        if stamp is not None:
            return OffsetSpec("timestamp", timestamp=stamp)
        default = "committed" if streaming else "earliest"
        text = text or default
        lowered = text.lower()
        if lowered in ("earliest", "latest"):
            return OffsetSpec(lowered)
        if lowered == "committed":
            if group is None:
                raise InvalidOptionError(
                    "option 'startingOffsets' is 'committed' but no 'consumerGroup' is set: set the group whose "
                    "offsets to start from, or use startingOffsets='earliest'"
                )
            return OffsetSpec("committed")
        if not text.startswith("{"):
            raise InvalidOptionError(
                f"option 'startingOffsets' must be committed, earliest, latest or per-queue JSON such as "
                f'{{"orders": {{"0": 42}}}}, got {text!r}'
            )
        return OffsetSpec("offsets", offsets=_parse_offsets_json(text, "startingOffsets", topics, ending=False))

    @staticmethod
    def _ending(opts: _Options, topics: tuple[str, ...], *, streaming: bool) -> OffsetSpec:
        text = opts.get("endingOffsets")
        stamp = opts.integer("endingTimestamp", None, minimum=0, unit=" (ms since the epoch)")
        if streaming and (text is not None or stamp is not None):
            which = "endingOffsets" if text is not None else "endingTimestamp"
            raise InvalidOptionError(
                f"option '{which}' applies to batch reads only: a stream runs until stopped; to stop at the data "
                "available now use .trigger(availableNow=True)"
            )
        if text is not None and stamp is not None:
            raise InvalidOptionError("options 'endingOffsets' and 'endingTimestamp' are both set: give one of them")
        if stamp is not None:
            return OffsetSpec("timestamp", timestamp=stamp)
        if text is None or text.lower() == "latest":
            return OffsetSpec("latest")
        if not text.startswith("{"):
            raise InvalidOptionError(
                f'option \'endingOffsets\' must be latest or per-queue JSON such as {{"orders": {{"0": 100}}}}, '
                f"got {text!r}"
            )
        return OffsetSpec("offsets", offsets=_parse_offsets_json(text, "endingOffsets", topics, ending=True))


@dataclass(frozen=True)
class SinkOptions:
    """The checked options of a write (``df.write`` / ``df.writeStream``)."""

    brokers: str
    topic: str | None = None
    sharding_key: str | None = None
    tag_column: str | None = None
    properties_columns: tuple[str, ...] = ()
    body_column: str = "body"
    exactly_once: bool = True
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    transaction_timeout_ms: int = DEFAULT_COMMIT_WAIT_MS
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    security: ConnectionSecurity = field(default_factory=ConnectionSecurity)

    def connect(self) -> RoutedConnection:
        """This process's connection to the broker or cluster (each queue's sends go to its group's
        master), shared by the sink's tasks and commits (``connector.spark.connections``): never
        closed by its users. Calls, and retries while a broker is down, last up to ``requestTimeoutMs``."""
        return shared_connection(self.brokers, self.security, timeout=self.request_timeout_ms / 1000)

    @classmethod
    def from_options(cls, mapping: Mapping[str, Any]) -> SinkOptions:
        """Parse Spark's options; ``InvalidOptionError`` naming the option and the fix when wrong."""
        opts = _Options(mapping, SINK_OPTIONS, "sink")
        brokers = _brokers(opts)
        topic = opts.get("topic")
        if topic is not None and "," in topic:
            raise InvalidOptionError(
                f"option 'topic' names one topic, got {topic!r}: to write several topics, drop the option and "
                "give each row a 'topic' column"
            )
        props = opts.get("propertiesColumns")
        properties = tuple(c.strip() for c in props.split(",")) if props else ()
        if any(not c for c in properties):
            raise InvalidOptionError(
                f"option 'propertiesColumns' has an empty column name in {props!r}: list columns separated by commas"
            )
        return cls(
            brokers=brokers,
            topic=topic,
            sharding_key=opts.get("shardingKey"),
            tag_column=opts.get("tagColumn"),
            properties_columns=properties,
            body_column=opts.get("bodyColumn") or "body",
            exactly_once=opts.boolean("exactlyOnce", True),
            max_batch_bytes=opts.integer("maxBatchBytes", DEFAULT_MAX_BATCH_BYTES, minimum=1024, unit=" bytes"),
            transaction_timeout_ms=opts.integer("transactionTimeoutMs", DEFAULT_COMMIT_WAIT_MS, minimum=0,
                                                maximum=2**31 - 1, unit=" (ms)"),
            request_timeout_ms=opts.integer("requestTimeoutMs", DEFAULT_REQUEST_TIMEOUT_MS, minimum=1, unit=" (ms)"),
            security=ConnectionSecurity.from_options(opts.get),
        )
