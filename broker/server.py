"""The gRPC service: each RPC validates, delegates to storage/locks/offsets/transactions, and
turns any error into a precise status (one place: ``_serve``). The broker keeps serving whatever
a request holds."""

from __future__ import annotations

import functools
import logging
import threading
from collections import defaultdict
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError

import broker
from broker.config import BrokerConfig
from broker.locks import LockManager
from broker.membership import Membership
from broker.offsets import OffsetStore
from broker.persist import wall_ms
from broker.proto import orderlymq_pb2 as pb
from broker.proto import orderlymq_pb2_grpc as pb_grpc
from broker.storage import Store
from broker.transactions import TransactionManager
from broker.wire import codec
from broker.wire.errors import ERROR_KIND_KEY, InvalidRequestError, OffsetOutOfRangeError, status_metadata, to_status
from broker.wire.pull_response import encode_pull_response
from broker.wire.tags import parse_tag_expression

__all__ = ["BrokerService", "RunningBroker", "start_broker"]

log = logging.getLogger(__name__)


def _serve(method):
    """Run an RPC body; map every exception to a gRPC status naming the error class."""

    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except Exception as exc:  # noqa: BLE001 - every failure must become a status
            code, message, _ = to_status(exc)
            if code == grpc.StatusCode.INTERNAL:
                log.exception("%s failed", method.__name__)
            context.set_trailing_metadata(status_metadata(exc))
            context.abort(code, message)

    return wrapper


def _require(value: str, what: str) -> str:
    if not value:
        raise InvalidRequestError(f"{what} is required")
    return value


class BrokerService(pb_grpc.OrderlyMQServicer):
    """The orderlymq.v1 service over one data directory."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        data = Path(config.data_dir)
        self.store = Store(
            data,
            segment_bytes=config.segment_bytes,
            index_interval_bytes=config.index_interval_bytes,
            sync=config.flush == "sync",
        )
        self.offsets = OffsetStore(data / "offsets.json")
        self.locks = LockManager(data / "lock-epochs.json", lease_ms=config.lock_lease_ms)
        self.members = Membership(timeout_ms=config.consumer_timeout_ms)
        self.txns = TransactionManager(data / "txns", timeout_ms=config.txn_timeout_ms, fsync=config.flush == "sync")
        for report in self.store.cut_reports():
            log.warning("recovered %s: cut %d damaged bytes at byte %d (%s); messages from offset %d lost",
                        report.path, report.bytes_cut, report.position, report.reason, report.first_lost_offset)
        for txn_id in self.txns.committing():
            log.info("finishing transaction %s interrupted during commit", txn_id)
            self._apply_commit(txn_id)

    # -- topics --------------------------------------------------------------------------------

    def _route(self, topic: str) -> pb.TopicRoute:
        return pb.TopicRoute(topic=topic, broker_name=self.config.broker_name,
                             queue_count=self.store.queue_count(topic))

    @_serve
    def CreateTopic(self, request, context):
        count = self.store.create_topic(request.topic, request.queue_count, request.if_not_exists)
        return pb.TopicRoute(topic=request.topic, broker_name=self.config.broker_name, queue_count=count)

    @_serve
    def UpdateTopic(self, request, context):
        self.store.grow_topic(request.topic, request.queue_count)
        return self._route(request.topic)

    @_serve
    def DescribeTopic(self, request, context):
        return self._route(request.topic)

    @_serve
    def ListTopics(self, request, context):
        return pb.ListTopicsResponse(topics=[
            pb.TopicRoute(topic=t, broker_name=self.config.broker_name, queue_count=n)
            for t, n in sorted(self.store.topics().items())
        ])

    @_serve
    def DeleteTopic(self, request, context):
        self.store.delete_topic(request.topic)
        self.offsets.drop_topic(request.topic)
        self.locks.drop_topic(request.topic)
        return pb.DeleteTopicResponse()

    # -- produce -------------------------------------------------------------------------------

    def _send(self, request) -> pb.SendResponse:
        queue = self.store.queue(request.topic, request.queue_id)
        body, count = codec.message_batch(request.batch)
        if request.txn_id:
            self.txns.stage(request.txn_id, request.topic, request.queue_id, body)
            return pb.SendResponse(base_offset=-1, count=count, queue_id=request.queue_id)
        result = queue.append(body, count, request.producer_id, request.sequence if request.producer_id else -1)
        return pb.SendResponse(base_offset=result.base_offset, count=result.count,
                               store_timestamp=result.store_timestamp, duplicate=result.duplicate,
                               queue_id=request.queue_id)

    @_serve
    def Send(self, request, context):
        return self._send(request)

    def SendStream(self, request_iterator, context):
        for raw in request_iterator:
            try:
                request = pb.SendRequest.FromString(raw)
            except DecodeError:
                yield pb.SendResponse(error_code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                      error_kind="InvalidRequestError", error_message=_malformed(raw, pb.SendRequest))
                continue
            try:
                yield self._send(request)
            except Exception as exc:  # noqa: BLE001 - reported per request, the stream stays open
                code, message, kind = to_status(exc)
                if code == grpc.StatusCode.INTERNAL:
                    log.exception("SendStream request failed")
                yield pb.SendResponse(queue_id=request.queue_id, error_code=code.value[0], error_kind=kind,
                                      error_message=message)

    # -- consume -------------------------------------------------------------------------------

    @_serve
    def Pull(self, request, context):
        queue = self.store.queue(request.topic, request.queue_id)
        if request.group:
            self.locks.check(request.group, request.topic, request.queue_id, request.client_id, request.epoch)
        tags = parse_tag_expression(request.tag_expression)
        if request.max_messages < 0 or request.max_bytes < 0 or request.wait_ms < 0:
            raise InvalidRequestError("max_messages, max_bytes and wait_ms must not be negative")
        queue.check_offset(request.offset)
        if request.wait_ms and request.offset >= queue.max_offset:
            wait_s = min(request.wait_ms, self.config.max_wait_ms) / 1000
            remaining = context.time_remaining()  # never outlive the caller's deadline
            if remaining is not None:
                wait_s = min(wait_s, max(remaining - 0.05, 0))
            queue.wait_for_data(request.offset, wait_s)
        result = queue.read(
            request.offset,
            min(request.max_messages or self.config.max_pull_messages, self.config.max_pull_messages),
            min(request.max_bytes or self.config.max_pull_bytes, self.config.max_pull_bytes),
        )
        table = result.table if tags is None else _with_tags(result.table, tags)
        batches = [codec.encode_parts(table)] if table.num_rows else []
        return encode_pull_response(batches, next_offset=result.next_offset, count=table.num_rows,
                                    min_offset=queue.min_offset, max_offset=queue.max_offset)

    @_serve
    def QueryOffsets(self, request, context):
        queue = self.store.queue(request.topic, request.queue_id)
        at = queue.offset_for_timestamp(request.timestamp) if request.has_timestamp else queue.max_offset
        return pb.QueryOffsetsResponse(min_offset=queue.min_offset, max_offset=queue.max_offset,
                                       offset_for_timestamp=at)

    # -- group offsets -------------------------------------------------------------------------

    @_serve
    def CommitOffset(self, request, context):
        _require(request.group, "group")
        queue = self.store.queue(request.topic, request.queue_id)
        if request.epoch or request.client_id:
            self.locks.check(request.group, request.topic, request.queue_id, request.client_id, request.epoch)
        if request.offset > queue.max_offset:
            raise OffsetOutOfRangeError(
                f"cannot commit offset {request.offset} for {request.topic}/{request.queue_id}: "
                f"only {queue.max_offset} messages have been stored"
            )
        self.offsets.commit(request.group, request.topic, request.queue_id, request.offset, request.client_id)
        return pb.CommitOffsetResponse()

    @_serve
    def GetOffset(self, request, context):
        _require(request.group, "group")
        self.store.queue(request.topic, request.queue_id)
        offset, client_id = self.offsets.committed(request.group, request.topic, request.queue_id)
        return pb.GetOffsetResponse(offset=offset, committed_by=client_id)

    # -- locks ---------------------------------------------------------------------------------

    def _check_queues(self, topic: str, queue_ids) -> list[int]:
        for qid in queue_ids:
            self.store.queue(topic, qid)
        return list(queue_ids)

    @_serve
    def LockBatch(self, request, context):
        queue_ids = self._check_queues(request.topic, request.queue_ids)
        held = self.locks.lock_batch(request.group, request.client_id, request.topic, queue_ids)
        expires_at_ms = wall_ms() + self.locks.lease_ms
        return pb.LockBatchResponse(locked=[
            pb.QueueLock(topic=request.topic, queue_id=qid, epoch=epoch, client_id=request.client_id,
                         expires_at_ms=expires_at_ms)
            for qid, epoch in sorted(held.items())
        ])

    @_serve
    def UnlockBatch(self, request, context):
        queue_ids = self._check_queues(request.topic, request.queue_ids)
        released = self.locks.unlock_batch(request.group, request.client_id, request.topic, queue_ids)
        return pb.UnlockBatchResponse(unlocked=sorted(released))

    @_serve
    def QueryLocks(self, request, context):
        self.store.queue_count(request.topic)
        return pb.QueryLocksResponse(locks=[
            pb.QueueLock(topic=i.topic, queue_id=i.queue_id, epoch=i.epoch, client_id=i.client_id,
                         expires_at_ms=i.expires_at_ms)
            for i in self.locks.holders(request.group, request.topic)
        ])

    # -- membership ----------------------------------------------------------------------------

    @_serve
    def Heartbeat(self, request, context):
        self.members.heartbeat(_require(request.group, "group"), _require(request.client_id, "client_id"),
                               request.topics)
        return pb.HeartbeatResponse()

    @_serve
    def LeaveGroup(self, request, context):
        self.members.unregister(_require(request.group, "group"), _require(request.client_id, "client_id"))
        return pb.LeaveGroupResponse()

    @_serve
    def ListConsumers(self, request, context):
        return pb.ListConsumersResponse(client_ids=self.members.consumers(_require(request.group, "group")))

    # -- transactions --------------------------------------------------------------------------

    @_serve
    def BeginTxn(self, request, context):
        return pb.BeginTxnResponse(state=self.txns.begin(request.txn_id, request.timeout_ms))

    def _apply_commit(self, txn_id: str) -> tuple[bool, int]:
        """Append a transaction's staged batches: one record per queue, in send order. Appends
        carry (txn, sequence 0) as producer identity, so re-applying after a crash stores nothing twice."""
        already, staged = self.txns.prepare_commit(txn_id)
        if already:
            return True, 0
        per_queue: dict[tuple[str, int], list[bytes]] = defaultdict(list)
        for topic, queue_id, payload in staged:
            per_queue[(topic, queue_id)].append(payload)
        count = 0
        for (topic, queue_id), payloads in per_queue.items():
            table = codec.decode_records(payloads)  # staged sends are message_batch bodies, like records
            self.store.queue(topic, queue_id).append(codec.encode(table), table.num_rows, f"txn:{txn_id}", 0)
            count += table.num_rows
        self.txns.mark_committed(txn_id)
        return False, count

    @_serve
    def CommitTxn(self, request, context):
        already, count = self._apply_commit(_require(request.txn_id, "txn_id"))
        return pb.CommitTxnResponse(already_committed=already, count=count)

    @_serve
    def AbortTxn(self, request, context):
        self.txns.abort(_require(request.txn_id, "txn_id"))
        return pb.AbortTxnResponse()

    @_serve
    def Health(self, request, context):
        return pb.HealthResponse(status="SERVING", broker_name=self.config.broker_name, version=broker.__version__)

    # -- housekeeping --------------------------------------------------------------------------

    def housekeeping(self, stop: threading.Event) -> None:
        """Flush (async mode), expire transactions and apply retention until ``stop`` is set."""
        interval = self.config.flush_interval_ms / 1000
        next_retention = 0.0
        elapsed = 0.0
        while not stop.wait(interval):
            elapsed += interval
            try:
                self.store.flush()
                for txn_id in self.txns.expire():
                    log.info("aborted transaction %s: idle past its timeout", txn_id)
                if elapsed >= next_retention:
                    next_retention = elapsed + self.config.retention_check_interval_ms / 1000
                    self.store.apply_retention(self.config.retention_ms, self.config.retention_bytes)
            except Exception:  # noqa: BLE001 - housekeeping must never stop
                log.exception("housekeeping failed")

    def close(self) -> None:
        self.store.flush()
        self.store.close()
        self.txns.close()


def _with_tags(table: pa.Table, tags: frozenset[str]) -> pa.Table:
    wanted = pa.array(sorted(tags), pa.string())
    return table.filter(pc.fill_null(pc.is_in(table.column("tag"), value_set=wanted), False))


def _parsed(method, request_type):
    """Parse the request bytes ourselves so a malformed message gets INVALID_ARGUMENT and a
    message naming the expected type (gRPC's own deserializer answers INTERNAL)."""

    def handler(raw: bytes, context):
        try:
            request = request_type.FromString(raw)
        except DecodeError:
            context.set_trailing_metadata(((ERROR_KIND_KEY, "InvalidRequestError"),))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _malformed(raw, request_type))
        return method(request, context)

    return handler


def _malformed(raw: bytes, request_type) -> str:
    return (f"malformed request: {len(raw)} bytes that are not a valid {request_type.DESCRIPTOR.full_name}; "
            "use the stubs generated from broker/proto/orderlymq.proto")


def _service_handler(service: BrokerService) -> grpc.GenericRpcHandler:
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["OrderlyMQ"].methods:
        request_type = getattr(pb, method.input_type.name)
        # Pull serializes its own response (megabytes of batches, copied once).
        serialize = None if method.name == "Pull" else getattr(pb, method.output_type.name).SerializeToString
        impl = getattr(service, method.name)
        if method.client_streaming:
            # Requests are parsed one by one in the handler: a malformed one gets an error response.
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                impl, request_deserializer=None, response_serializer=serialize)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _parsed(impl, request_type), request_deserializer=None, response_serializer=serialize)
    return grpc.method_handlers_generic_handler("orderlymq.v1.OrderlyMQ", handlers)


@dataclass
class RunningBroker:
    """A broker serving in this process; ``stop()`` shuts it down cleanly."""

    server: grpc.Server
    service: BrokerService
    config: BrokerConfig
    port: int
    _stop_event: threading.Event
    _housekeeper: threading.Thread

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def stop(self, grace: float = 1.0) -> None:
        if self._stop_event.is_set():
            return
        self._stop_event.set()
        self.server.stop(grace).wait()
        self._housekeeper.join(timeout=5)
        self.service.close()
        log.info("broker %s stopped", self.config.broker_name)

    def wait(self) -> None:
        self.server.wait_for_termination()


def start_broker(config: BrokerConfig) -> RunningBroker:
    """Open the data directory (recovering it) and serve on ``config.host:config.port``
    (port 0 picks a free one: read ``.port``)."""
    service = BrokerService(config)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="orderlymq-rpc"),
        options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", max(config.max_request_bytes, 2 * config.max_pull_bytes)),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers((_service_handler(service),))
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        service.close()
        raise OSError(f"cannot listen on {config.host}:{config.port} (in use?); pick another --port")
    server.start()
    stop = threading.Event()
    housekeeper = threading.Thread(target=service.housekeeping, args=(stop,), name="orderlymq-housekeeping", daemon=True)
    housekeeper.start()
    log.info("broker %s listening on %s:%d (data %s, flush=%s)", config.broker_name, config.host, port,
             config.data_dir, config.flush)
    return RunningBroker(server, service, config, port, stop, housekeeper)
