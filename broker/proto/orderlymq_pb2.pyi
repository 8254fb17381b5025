from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueuePosition(_message.Message):
    __slots__ = ("topic", "queue_id", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ReplicaFetch(_message.Message):
    __slots__ = ("broker_id", "group_epoch", "ends", "offsets_version", "handshake", "txn_seq", "delta", "topics_on_change")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ENDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_VERSION_FIELD_NUMBER: _ClassVar[int]
    HANDSHAKE_FIELD_NUMBER: _ClassVar[int]
    TXN_SEQ_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    TOPICS_ON_CHANGE_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    group_epoch: int
    ends: _containers.RepeatedCompositeFieldContainer[QueuePosition]
    offsets_version: int
    handshake: bool
    txn_seq: int
    delta: bool
    topics_on_change: bool
    def __init__(self, broker_id: _Optional[int] = ..., group_epoch: _Optional[int] = ..., ends: _Optional[_Iterable[_Union[QueuePosition, _Mapping]]] = ..., offsets_version: _Optional[int] = ..., handshake: _Optional[bool] = ..., txn_seq: _Optional[int] = ..., delta: _Optional[bool] = ..., topics_on_change: _Optional[bool] = ...) -> None: ...

class ReplicaRecords(_message.Message):
    __slots__ = ("topic", "queue_id", "frames")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    frames: bytes
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., frames: _Optional[bytes] = ...) -> None: ...

class ReplicaData(_message.Message):
    __slots__ = ("group_epoch", "topics", "records", "offsets_version", "offsets", "epoch_history", "txn_changes", "txn_table", "txn_seq", "error_code", "error_kind", "error_message", "delta_fetches", "topics_unchanged")
    class TopicsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_HISTORY_FIELD_NUMBER: _ClassVar[int]
    TXN_CHANGES_FIELD_NUMBER: _ClassVar[int]
    TXN_TABLE_FIELD_NUMBER: _ClassVar[int]
    TXN_SEQ_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DELTA_FETCHES_FIELD_NUMBER: _ClassVar[int]
    TOPICS_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    group_epoch: int
    topics: _containers.ScalarMap[str, int]
    records: _containers.RepeatedCompositeFieldContainer[ReplicaRecords]
    offsets_version: int
    offsets: bytes
    epoch_history: bytes
    txn_changes: _containers.RepeatedCompositeFieldContainer[TxnChange]
    txn_table: bool
    txn_seq: int
    error_code: int
    error_kind: str
    error_message: str
    delta_fetches: bool
    topics_unchanged: bool
    def __init__(self, group_epoch: _Optional[int] = ..., topics: _Optional[_Mapping[str, int]] = ..., records: _Optional[_Iterable[_Union[ReplicaRecords, _Mapping]]] = ..., offsets_version: _Optional[int] = ..., offsets: _Optional[bytes] = ..., epoch_history: _Optional[bytes] = ..., txn_changes: _Optional[_Iterable[_Union[TxnChange, _Mapping]]] = ..., txn_table: _Optional[bool] = ..., txn_seq: _Optional[int] = ..., error_code: _Optional[int] = ..., error_kind: _Optional[str] = ..., error_message: _Optional[str] = ..., delta_fetches: _Optional[bool] = ..., topics_unchanged: _Optional[bool] = ...) -> None: ...

class TxnChange(_message.Message):
    __slots__ = ("kind", "txn_id", "timeout_ms", "topic", "queue_id", "payload", "state", "starts")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        BEGIN: _ClassVar[TxnChange.Kind]
        STAGE: _ClassVar[TxnChange.Kind]
        ABORT: _ClassVar[TxnChange.Kind]
        COMMIT: _ClassVar[TxnChange.Kind]
        FINISHED: _ClassVar[TxnChange.Kind]
        PREPARE: _ClassVar[TxnChange.Kind]
    BEGIN: TxnChange.Kind
    STAGE: TxnChange.Kind
    ABORT: TxnChange.Kind
    COMMIT: TxnChange.Kind
    FINISHED: TxnChange.Kind
    PREPARE: TxnChange.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    kind: TxnChange.Kind
    txn_id: str
    timeout_ms: int
    topic: str
    queue_id: int
    payload: bytes
    state: str
    starts: _containers.RepeatedCompositeFieldContainer[QueuePosition]
    def __init__(self, kind: _Optional[_Union[TxnChange.Kind, str]] = ..., txn_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., payload: _Optional[bytes] = ..., state: _Optional[str] = ..., starts: _Optional[_Iterable[_Union[QueuePosition, _Mapping]]] = ...) -> None: ...

class TopicRoute(_message.Message):
    __slots__ = ("topic", "broker_name", "queue_count", "groups")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    broker_name: str
    queue_count: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupRoute]
    def __init__(self, topic: _Optional[str] = ..., broker_name: _Optional[str] = ..., queue_count: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupRoute, _Mapping]]] = ...) -> None: ...

class GroupRoute(_message.Message):
    __slots__ = ("broker_name", "master_address", "addresses", "queue_ids")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    master_address: str
    addresses: _containers.RepeatedScalarFieldContainer[str]
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, broker_name: _Optional[str] = ..., master_address: _Optional[str] = ..., addresses: _Optional[_Iterable[str]] = ..., queue_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic", "queue_count", "if_not_exists")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    IF_NOT_EXISTS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_count: int
    if_not_exists: bool
    def __init__(self, topic: _Optional[str] = ..., queue_count: _Optional[int] = ..., if_not_exists: _Optional[bool] = ...) -> None: ...

class UpdateTopicRequest(_message.Message):
    __slots__ = ("topic", "queue_count")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_count: int
    def __init__(self, topic: _Optional[str] = ..., queue_count: _Optional[int] = ...) -> None: ...

class DescribeTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class DescribeClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeClusterResponse(_message.Message):
    __slots__ = ("cluster_name", "groups")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    groups: _containers.RepeatedCompositeFieldContainer[GroupRoute]
    def __init__(self, cluster_name: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[GroupRoute, _Mapping]]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicRoute]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicRoute, _Mapping]]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "batch", "txn_id", "producer_id", "sequence")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    batch: bytes
    txn_id: str
    producer_id: str
    sequence: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., batch: _Optional[bytes] = ..., txn_id: _Optional[str] = ..., producer_id: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("base_offset", "count", "store_timestamp", "duplicate", "queue_id", "error_code", "error_kind", "error_message")
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    base_offset: int
    count: int
    store_timestamp: int
    duplicate: bool
    queue_id: int
    error_code: int
    error_kind: str
    error_message: str
    def __init__(self, base_offset: _Optional[int] = ..., count: _Optional[int] = ..., store_timestamp: _Optional[int] = ..., duplicate: _Optional[bool] = ..., queue_id: _Optional[int] = ..., error_code: _Optional[int] = ..., error_kind: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "max_messages", "max_bytes", "wait_ms", "tag_expression", "group", "client_id", "epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    TAG_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    max_messages: int
    max_bytes: int
    wait_ms: int
    tag_expression: str
    group: str
    client_id: str
    epoch: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ..., wait_ms: _Optional[int] = ..., tag_expression: _Optional[str] = ..., group: _Optional[str] = ..., client_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class AwaitMessagesRequest(_message.Message):
    __slots__ = ("positions", "wait_ms", "boot_id")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[QueuePosition]
    wait_ms: int
    boot_id: int
    def __init__(self, positions: _Optional[_Iterable[_Union[QueuePosition, _Mapping]]] = ..., wait_ms: _Optional[int] = ..., boot_id: _Optional[int] = ...) -> None: ...

class AwaitMessagesResponse(_message.Message):
    __slots__ = ("ready",)
    READY_FIELD_NUMBER: _ClassVar[int]
    ready: _containers.RepeatedCompositeFieldContainer[QueuePosition]
    def __init__(self, ready: _Optional[_Iterable[_Union[QueuePosition, _Mapping]]] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("batches", "next_offset", "min_offset", "max_offset", "count", "error_code", "error_kind", "error_message", "error_next_offset", "boot_id")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedScalarFieldContainer[bytes]
    next_offset: int
    min_offset: int
    max_offset: int
    count: int
    error_code: int
    error_kind: str
    error_message: str
    error_next_offset: int
    boot_id: int
    def __init__(self, batches: _Optional[_Iterable[bytes]] = ..., next_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., count: _Optional[int] = ..., error_code: _Optional[int] = ..., error_kind: _Optional[str] = ..., error_message: _Optional[str] = ..., error_next_offset: _Optional[int] = ..., boot_id: _Optional[int] = ...) -> None: ...

class QueryOffsetsRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "timestamp", "has_timestamp")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    HAS_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    timestamp: int
    has_timestamp: bool
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., timestamp: _Optional[int] = ..., has_timestamp: _Optional[bool] = ...) -> None: ...

class QueryOffsetsResponse(_message.Message):
    __slots__ = ("min_offset", "max_offset", "offset_for_timestamp", "now_ms", "boot_id")
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FOR_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    min_offset: int
    max_offset: int
    offset_for_timestamp: int
    now_ms: int
    boot_id: int
    def __init__(self, min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., offset_for_timestamp: _Optional[int] = ..., now_ms: _Optional[int] = ..., boot_id: _Optional[int] = ...) -> None: ...

class CommitOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset", "client_id", "epoch")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    offset: int
    client_id: str
    epoch: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., client_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class CommitOffsetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class GetOffsetResponse(_message.Message):
    __slots__ = ("offset", "committed_by")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    offset: int
    committed_by: str
    def __init__(self, offset: _Optional[int] = ..., committed_by: _Optional[str] = ...) -> None: ...

class QueueLock(_message.Message):
    __slots__ = ("topic", "queue_id", "epoch", "client_id", "expires_at_ms", "expires_in_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    epoch: int
    client_id: str
    expires_at_ms: int
    expires_in_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., epoch: _Optional[int] = ..., client_id: _Optional[str] = ..., expires_at_ms: _Optional[int] = ..., expires_in_ms: _Optional[int] = ...) -> None: ...

class LockBatchRequest(_message.Message):
    __slots__ = ("group", "client_id", "topic", "queue_ids")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    group: str
    client_id: str
    topic: str
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[str] = ..., client_id: _Optional[str] = ..., topic: _Optional[str] = ..., queue_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class LockBatchResponse(_message.Message):
    __slots__ = ("locked",)
    LOCKED_FIELD_NUMBER: _ClassVar[int]
    locked: _containers.RepeatedCompositeFieldContainer[QueueLock]
    def __init__(self, locked: _Optional[_Iterable[_Union[QueueLock, _Mapping]]] = ...) -> None: ...

class UnlockBatchRequest(_message.Message):
    __slots__ = ("group", "client_id", "topic", "queue_ids")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    group: str
    client_id: str
    topic: str
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[str] = ..., client_id: _Optional[str] = ..., topic: _Optional[str] = ..., queue_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class UnlockBatchResponse(_message.Message):
    __slots__ = ("unlocked",)
    UNLOCKED_FIELD_NUMBER: _ClassVar[int]
    unlocked: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, unlocked: _Optional[_Iterable[int]] = ...) -> None: ...

class QueryLocksRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class QueryLocksResponse(_message.Message):
    __slots__ = ("locks",)
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    locks: _containers.RepeatedCompositeFieldContainer[QueueLock]
    def __init__(self, locks: _Optional[_Iterable[_Union[QueueLock, _Mapping]]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("group", "client_id", "topics")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    group: str
    client_id: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group: _Optional[str] = ..., client_id: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LeaveGroupRequest(_message.Message):
    __slots__ = ("group", "client_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    client_id: str
    def __init__(self, group: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class LeaveGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListConsumersRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class ListConsumersResponse(_message.Message):
    __slots__ = ("client_ids",)
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    client_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class BeginTxnRequest(_message.Message):
    __slots__ = ("txn_id", "timeout_ms")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    timeout_ms: int
    def __init__(self, txn_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class BeginTxnResponse(_message.Message):
    __slots__ = ("state", "numbers_sends", "timeout_ms")
    STATE_FIELD_NUMBER: _ClassVar[int]
    NUMBERS_SENDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    state: str
    numbers_sends: bool
    timeout_ms: int
    def __init__(self, state: _Optional[str] = ..., numbers_sends: _Optional[bool] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class CommitTxnRequest(_message.Message):
    __slots__ = ("txn_id",)
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    def __init__(self, txn_id: _Optional[str] = ...) -> None: ...

class CommitTxnResponse(_message.Message):
    __slots__ = ("already_committed", "count")
    ALREADY_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    already_committed: bool
    count: int
    def __init__(self, already_committed: _Optional[bool] = ..., count: _Optional[int] = ...) -> None: ...

class AbortTxnRequest(_message.Message):
    __slots__ = ("txn_id",)
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    def __init__(self, txn_id: _Optional[str] = ...) -> None: ...

class AbortTxnResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("status", "broker_name", "version", "role", "master_address", "group_epoch", "broker_id", "sync_set", "replicas", "send_port")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    SYNC_SET_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SEND_PORT_FIELD_NUMBER: _ClassVar[int]
    status: str
    broker_name: str
    version: str
    role: str
    master_address: str
    group_epoch: int
    broker_id: int
    sync_set: _containers.RepeatedScalarFieldContainer[int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    send_port: int
    def __init__(self, status: _Optional[str] = ..., broker_name: _Optional[str] = ..., version: _Optional[str] = ..., role: _Optional[str] = ..., master_address: _Optional[str] = ..., group_epoch: _Optional[int] = ..., broker_id: _Optional[int] = ..., sync_set: _Optional[_Iterable[int]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., send_port: _Optional[int] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("broker_id", "connected", "in_sync_set", "behind_messages", "caught_up_ms_ago")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_SET_FIELD_NUMBER: _ClassVar[int]
    BEHIND_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    connected: bool
    in_sync_set: bool
    behind_messages: int
    caught_up_ms_ago: int
    def __init__(self, broker_id: _Optional[int] = ..., connected: _Optional[bool] = ..., in_sync_set: _Optional[bool] = ..., behind_messages: _Optional[int] = ..., caught_up_ms_ago: _Optional[int] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupOffset(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "committed_by")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    committed_by: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., committed_by: _Optional[str] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("group", "offsets", "consumers", "locks")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    group: str
    offsets: _containers.RepeatedCompositeFieldContainer[GroupOffset]
    consumers: _containers.RepeatedScalarFieldContainer[str]
    locks: _containers.RepeatedCompositeFieldContainer[QueueLock]
    def __init__(self, group: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[GroupOffset, _Mapping]]] = ..., consumers: _Optional[_Iterable[str]] = ..., locks: _Optional[_Iterable[_Union[QueueLock, _Mapping]]] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenTransaction(_message.Message):
    __slots__ = ("txn_id", "state", "last_activity_ms", "expires_at_ms", "staged_bytes")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVITY_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STAGED_BYTES_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    state: str
    last_activity_ms: int
    expires_at_ms: int
    staged_bytes: int
    def __init__(self, txn_id: _Optional[str] = ..., state: _Optional[str] = ..., last_activity_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., staged_bytes: _Optional[int] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("transactions",)
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[OpenTransaction]
    def __init__(self, transactions: _Optional[_Iterable[_Union[OpenTransaction, _Mapping]]] = ...) -> None: ...
