"""``apache.rocketmq.v2.MessagingService`` over a ``BrokerService``: RocketMQ 5 clients, unchanged.

Served on the broker's own port beside ``orderlymq.v1``. Each RPC parses its request itself (a
malformed one is answered BAD_REQUEST), runs its work on the broker's worker threads, and answers
with a RocketMQ status in the response body, as RocketMQ clients expect; the gRPC status stays OK.
A long-polling ReceiveMessage waits on the event loop, holding no thread. Topic and group names
are RocketMQ's: a client namespace ``ns`` makes them ``ns%name``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from broker.proto import orderlymq_pb2 as pb
from broker.rocketmq import mapping
from broker.rocketmq.consumption import AUTO_RENEW_MS, Consumption
from broker.rocketmq.protocol import SERVICE_NAME, Code, definition, service
from broker.rocketmq.settings import LONG_POLLING_S, RECEIVE_BATCH_SIZE, settings_for
from broker.rocketmq.statuses import RocketMQStatusError, ok, status, status_for
from broker.rocketmq.transactions import HalfMessages
from broker.thread_hops import ThreadHops
from broker.wire.errors import NotMasterError, TopicNotFoundError
from broker.wire.one_message import encode_one
from broker.wire.tags import parse_tag_expression

__all__ = ["RocketMQService"]

log = logging.getLogger(__name__)

CLIENT_ID_HEADER = "x-mq-client-id"
DEFAULT_INVISIBLE_MS = 30_000
MAX_BATCH = 1024
_RECHECK_S = 1.0  # a long poll also looks again this often: invisibility running out, other queues
_ACCEPTED_TYPES = (definition.MessageType.NORMAL, definition.MessageType.FIFO, definition.MessageType.TRANSACTION)
# What changes state: served by the master of a broker group only (a slave's copy must not diverge).
_MASTER_ONLY = frozenset({"SendMessage", "QueryAssignment", "AckMessage", "ChangeInvisibleDuration",
                          "ForwardMessageToDeadLetterQueue", "EndTransaction"})
_CHECK_EVERY_S = 1.0  # how often a producer's Telemetry stream looks for orphaned transactions to check
_UNSUPPORTED = {
    "PullMessage": "PullMessage (the pull consumer) is not supported; use a SimpleConsumer or PushConsumer",
    "UpdateOffset": "offsets of RocketMQ pull consumers are not supported; SimpleConsumer and PushConsumer "
                    "acks move the group's offsets",
    "GetOffset": "offsets of RocketMQ pull consumers are not supported",
    "QueryOffset": "offsets of RocketMQ pull consumers are not supported",
    "RecallMessage": "delayed messages (and so their recall) are not supported by orderlymq",
    "SyncLiteSubscription": "lite topics are not supported by orderlymq",
}


def _name(resource: definition.Resource, what: str, code: int) -> str:
    if not resource.name:
        raise RocketMQStatusError(code, f"the {what} name is required")
    ns = resource.resource_namespace
    return f"{ns}%{resource.name}" if ns else resource.name


def _topic(resource: definition.Resource) -> str:
    return _name(resource, "topic", Code.ILLEGAL_TOPIC)


def _group(resource: definition.Resource) -> str:
    return _name(resource, "consumer group", Code.ILLEGAL_CONSUMER_GROUP)


def _ms(duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def _summary(statuses: list[definition.Status]) -> definition.Status:
    """One status for a request of several entries: the failure when there is one, else OK."""
    failed = [s for s in statuses if s.code != Code.OK]
    if not failed:
        return ok()
    return failed[0] if len(statuses) == 1 else status(Code.MULTIPLE_RESULTS, f"{len(failed)} of {len(statuses)} "
                                                       f"entries failed; the first: {failed[0].message}")


def _tags(expression: definition.FilterExpression) -> frozenset[str] | None:
    if expression.type == definition.FilterType.SQL:
        raise RocketMQStatusError(Code.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not supported by orderlymq; "
                                  "filter by tag ('TagA || TagB' or '*')")
    return parse_tag_expression(expression.expression or "*")


class RocketMQService:
    """The RocketMQ 5 RPCs; ``generic_handler()`` registers them on the broker's gRPC server."""

    def __init__(self, broker, threads: ThreadHops) -> None:
        self.broker = broker
        self.threads = threads
        self.consumption = Consumption(broker)
        self.half_messages = HalfMessages(broker)
        self._round_robin = itertools.count()

    async def _on_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.threads.run(fn, *args)

    def _queue_count(self, topic: str) -> int:
        try:
            return self.broker.store.queue_count(topic)
        except TopicNotFoundError:
            raise RocketMQStatusError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist on broker "
                                      f"{self.broker.config.broker_name!r}; create it first (orderlymq topic create "
                                      f"{topic} --queues N)") from None

    def _queue(self, topic: definition.Resource, queue_id: int,
               endpoints: definition.Endpoints) -> definition.MessageQueue:
        queue = definition.MessageQueue(topic=topic, id=queue_id, permission=definition.Permission.READ_WRITE,
                                        accept_message_types=_ACCEPTED_TYPES)
        queue.broker.name = self.broker.config.broker_name
        queue.broker.endpoints.CopyFrom(endpoints)
        return queue

    @staticmethod
    def _endpoints(request) -> definition.Endpoints:
        if not request.endpoints.addresses:
            raise RocketMQStatusError(Code.ILLEGAL_ACCESS_POINT, "the request names no endpoints; clients send the "
                                      "address they connected to, which routes point back to")
        return request.endpoints

    def _require_master(self) -> None:
        if self.broker.cluster is not None:
            self.broker.cluster.require_master()

    def _route_endpoints(self, request) -> definition.Endpoints:
        """Where the topic is served: the address the client used, or its group's master from a slave."""
        try:
            self._require_master()
        except NotMasterError as exc:
            if not exc.master:
                raise
            return _endpoints_of(exc.master)
        return self._endpoints(request)

    # -- route, heartbeat, settings --------------------------------------------------------------

    def QueryRoute(self, request, client_id: str):
        topic = _topic(request.topic)
        endpoints = self._route_endpoints(request)
        queues = [self._queue(request.topic, q, endpoints) for q in range(self._queue_count(topic))]
        return service.QueryRouteResponse(status=ok(), message_queues=queues)

    def Heartbeat(self, request, client_id: str):
        if request.group.name:
            self.consumption.heartbeat(_group(request.group), client_id)
        return service.HeartbeatResponse(status=ok())

    def NotifyClientTermination(self, request, client_id: str):
        if request.group.name:
            released = self.consumption.release(_group(request.group), client_id)
            if released:
                log.info("RocketMQ client %s left group %s: %d message(s) visible again", client_id,
                         request.group.name, released)
        return service.NotifyClientTerminationResponse(status=ok())

    def QueryAssignment(self, request, client_id: str):
        """Every queue, to every consumer: the broker decides who gets which message (pop model)."""
        topic, _ = _topic(request.topic), _group(request.group)
        endpoints = self._endpoints(request)
        queues = [self._queue(request.topic, q, endpoints) for q in range(self._queue_count(topic))]
        return service.QueryAssignmentResponse(status=ok(), assignments=[
            definition.Assignment(message_queue=q) for q in queues])

    async def telemetry(self, request_iterator, context) -> AsyncIterator[service.TelemetryCommand]:
        """Answer each client's settings; ask producers about their orphaned transactions."""
        client_id, outbox, topics = _client_id(context), asyncio.Queue(), set()
        reader = asyncio.ensure_future(self._answer_settings(request_iterator, outbox, topics))
        try:
            while not (reader.done() and outbox.empty()):
                try:
                    yield await asyncio.wait_for(outbox.get(), _CHECK_EVERY_S)
                except asyncio.TimeoutError:
                    pass
                if client_id:
                    for command in self.half_messages.checks_for(client_id, topics):
                        yield command
        finally:
            reader.cancel()

    async def _answer_settings(self, request_iterator, outbox: asyncio.Queue, topics: set[str]) -> None:
        async for raw in request_iterator:
            try:
                command = service.TelemetryCommand.FromString(raw)
            except DecodeError:
                outbox.put_nowait(service.TelemetryCommand(status=status(Code.BAD_REQUEST, "malformed TelemetryCommand")))
                continue
            if command.HasField("settings"):
                asked = command.settings
                topics.update(_name(t, "topic", Code.ILLEGAL_TOPIC) for t in asked.publishing.topics if t.name)
                settings = settings_for(asked, self.broker.config.max_request_bytes)
                outbox.put_nowait(service.TelemetryCommand(status=ok(), settings=settings))
            # Other commands answer server commands this broker never sends: nothing to do.

    # -- produce ---------------------------------------------------------------------------------

    def SendMessage(self, request, client_id: str):
        if not request.messages:
            raise RocketMQStatusError(Code.BAD_REQUEST, "SendMessage carries no message")
        entries = []
        for message in request.messages:
            try:
                entries.append(self._send(message, client_id))
            except Exception as exc:  # noqa: BLE001 - each entry gets its own status
                entries.append(service.SendResultEntry(status=status_for(exc)))
        return service.SendMessageResponse(status=_summary([e.status for e in entries]), entries=entries)

    def _send(self, message: definition.Message, client_id: str) -> service.SendResultEntry:
        topic = _topic(message.topic)
        row = mapping.to_row(message)
        queue_id = mapping.target_queue(message, self._queue_count(topic), next(self._round_robin))
        batch = encode_one(row)
        if message.system_properties.message_type == definition.MessageType.TRANSACTION:
            check = mapping.with_digest(definition.Message.FromString(message.SerializeToString()))
            txn_id = self.half_messages.stage(topic, queue_id, batch, check, client_id)
            return service.SendResultEntry(status=ok(), message_id=message.system_properties.message_id,
                                           transaction_id=txn_id)
        producer_id, sequence = mapping.producer_identity(message.system_properties.message_id, client_id)
        # Through the broker's own Send: a master-only, replicated, counted, idempotent append.
        result = self.broker.Send(pb.SendRequest(topic=topic, queue_id=queue_id, batch=batch, producer_id=producer_id,
                                                 sequence=max(sequence, 0)))
        message_id = message.system_properties.message_id or mapping.message_id_of({}, queue_id, result.base_offset)
        return service.SendResultEntry(status=ok(), message_id=message_id, offset=result.base_offset)

    # -- consume ---------------------------------------------------------------------------------

    async def receive(self, raw: bytes, context) -> AsyncIterator[service.ReceiveMessageResponse]:
        started = time.perf_counter()
        try:
            request = service.ReceiveMessageRequest.FromString(raw)
            messages = await self._receive(request, _client_id(context), context)
        except Exception as exc:  # noqa: BLE001 - every failure is a status
            answer = status_for(exc) if not isinstance(exc, DecodeError) else _malformed(raw, "ReceiveMessageRequest")
            self._done("ReceiveMessage", started, answer)
            yield service.ReceiveMessageResponse(status=answer)
            return
        if messages:  # when the broker handed them out: clients measure their receive latency from it
            delivered = service.ReceiveMessageResponse()
            delivered.delivery_timestamp.GetCurrentTime()
            yield delivered
        for message in messages:
            yield service.ReceiveMessageResponse(message=message)
        answer = ok() if messages else status(Code.MESSAGE_NOT_FOUND, "no new message")
        self._done("ReceiveMessage", started, answer)
        yield service.ReceiveMessageResponse(status=answer)

    async def _receive(self, request, client_id: str, context) -> list[definition.Message]:
        self._require_master()
        if not client_id:
            raise RocketMQStatusError(Code.CLIENT_ID_REQUIRED, f"a consumer must send its client id in the "
                                      f"{CLIENT_ID_HEADER} header")
        group, topic = _group(request.group), _topic(request.message_queue.topic)
        count = self._queue_count(topic)
        asked = request.message_queue.id
        if not 0 <= asked < count:
            raise RocketMQStatusError(Code.BAD_REQUEST, f"queue {asked} does not exist: topic {topic!r} has {count}")
        # A push consumer polls each queue it was assigned; a simple consumer takes any queue with messages.
        queue_ids = [asked] if request.auto_renew else [(asked + i) % count for i in range(count)]
        invisible_ms = _ms(request.invisible_duration) if request.HasField("invisible_duration") else (
            AUTO_RENEW_MS if request.auto_renew else DEFAULT_INVISIBLE_MS)
        if invisible_ms <= 0:
            raise RocketMQStatusError(Code.ILLEGAL_INVISIBLE_TIME, "the invisible duration must be positive")
        batch = min(request.batch_size or RECEIVE_BATCH_SIZE, MAX_BATCH)
        tags = _tags(request.filter_expression)
        wait_s = _ms(request.long_polling_timeout) / 1000 if request.HasField("long_polling_timeout") else LONG_POLLING_S
        wait_s = min(wait_s, self.broker.config.max_wait_ms / 1000)  # the broker's bound of any long poll
        remaining = context.time_remaining()
        if remaining is not None:
            wait_s = min(wait_s, max(remaining - 1.0, 0.0))  # answer before the caller's deadline
        deadline = time.monotonic() + wait_s
        args = (group, topic, queue_ids, client_id, batch, invisible_ms, request.auto_renew, tags)
        wakeups = self.consumption.wakeups(group, topic)
        queue = self.broker.store.queue(topic, asked)
        while True:
            acked = wakeups.register()  # before looking: an ack meanwhile resolves it
            end = queue.max_offset
            try:
                messages = await self._on_thread(self.consumption.receive, *args)
                left = deadline - time.monotonic()
                if messages or left <= 0:
                    for message in messages:  # the topic as the client names it (namespace apart)
                        message.topic.CopyFrom(request.message_queue.topic)
                    return messages
                await _first_of(acked, queue.wait_for_data_async(end, left), timeout=min(_RECHECK_S, left))
            finally:
                wakeups.discard(acked)

    def AckMessage(self, request, client_id: str):
        group, topic = _group(request.group), _topic(request.topic)
        entries = []
        for entry in request.entries:
            try:
                self.consumption.ack(group, topic, entry.receipt_handle)
                answer = ok()
            except Exception as exc:  # noqa: BLE001 - each entry gets its own status
                answer = status_for(exc)
            entries.append(service.AckMessageResultEntry(message_id=entry.message_id,
                                                         receipt_handle=entry.receipt_handle, status=answer))
        if not entries:
            raise RocketMQStatusError(Code.BAD_REQUEST, "AckMessage carries no entry")
        return service.AckMessageResponse(status=_summary([e.status for e in entries]), entries=entries)

    def ChangeInvisibleDuration(self, request, client_id: str):
        group, topic = _group(request.group), _topic(request.topic)
        invisible_ms = _ms(request.invisible_duration)
        if invisible_ms < 0:
            raise RocketMQStatusError(Code.ILLEGAL_INVISIBLE_TIME, "the invisible duration must not be negative")
        handle = self.consumption.change_invisible(group, topic, request.receipt_handle, invisible_ms)
        return service.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle)

    def EndTransaction(self, request, client_id: str):
        if not request.transaction_id:
            raise RocketMQStatusError(Code.INVALID_TRANSACTION_ID, "EndTransaction needs the transaction id the "
                                      "half message's send returned")
        self.half_messages.end(request.transaction_id, request.resolution)
        return service.EndTransactionResponse(status=ok())

    def ForwardMessageToDeadLetterQueue(self, request, client_id: str):
        self.consumption.dead_letter(_group(request.group), _topic(request.topic), request.receipt_handle)
        return service.ForwardMessageToDeadLetterQueueResponse(status=ok())

    # -- gRPC plumbing ---------------------------------------------------------------------------

    def _done(self, name: str, started: float, answer: definition.Status) -> None:
        failed = answer.code not in (Code.OK, Code.MESSAGE_NOT_FOUND)
        self.broker.metrics.rpc_done(f"rocketmq.{name}", started, Code.Name(answer.code) if failed else None)
        if answer.code in (Code.INTERNAL_ERROR, Code.INTERNAL_SERVER_ERROR):
            log.error("RocketMQ %s failed: %s", name, answer.message)

    def _unary(self, name: str, request_type, response_type) -> Callable:
        body = getattr(self, name, None)

        async def handler(raw: bytes, context):
            started = time.perf_counter()
            try:
                request = request_type.FromString(raw)
                if body is None:
                    raise RocketMQStatusError(Code.UNSUPPORTED, _unsupported(name))
                if name in _MASTER_ONLY:
                    self._require_master()
                answer = await self._on_thread(body, request, _client_id(context))
                self._done(name, started, answer.status)
                return answer
            except DecodeError:
                failure = _malformed(raw, request_type.DESCRIPTOR.name)
            except Exception as exc:  # noqa: BLE001 - every failure is a status
                failure = status_for(exc)
            self._done(name, started, failure)
            return response_type(status=failure)

        return handler

    def _unsupported_stream(self, name: str, response_type) -> Callable:
        async def handler(raw: bytes, context):
            yield response_type(status=status(Code.UNSUPPORTED, _unsupported(name)))

        return handler

    def generic_handler(self) -> grpc.GenericRpcHandler:
        handlers = {}
        for method in service.DESCRIPTOR.services_by_name["MessagingService"].methods:
            request_type = getattr(service, method.input_type.name)
            response_type = getattr(service, method.output_type.name)
            serialize = response_type.SerializeToString
            if method.name == "Telemetry":
                handler = grpc.stream_stream_rpc_method_handler(self.telemetry, response_serializer=serialize)
            elif method.name == "ReceiveMessage":
                handler = grpc.unary_stream_rpc_method_handler(self.receive, response_serializer=serialize)
            elif method.server_streaming:
                handler = grpc.unary_stream_rpc_method_handler(
                    self._unsupported_stream(method.name, response_type), response_serializer=serialize)
            else:
                handler = grpc.unary_unary_rpc_method_handler(
                    self._unary(method.name, request_type, response_type), response_serializer=serialize)
            handlers[method.name] = handler
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


async def _first_of(future: asyncio.Future, coroutine, timeout: float) -> None:
    """Wait until ``future`` resolves, ``coroutine`` returns or ``timeout`` passes."""
    task = asyncio.ensure_future(coroutine)
    try:
        await asyncio.wait({future, task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()


def _endpoints_of(address: str) -> definition.Endpoints:
    """``host:port`` as RocketMQ endpoints."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        scheme = (definition.AddressScheme.IPv4 if ipaddress.ip_address(host).version == 4
                  else definition.AddressScheme.IPv6)
    except ValueError:
        scheme = definition.AddressScheme.DOMAIN_NAME
    endpoints = definition.Endpoints(scheme=scheme)
    endpoints.addresses.add(host=host, port=int(port))
    return endpoints


def _unsupported(name: str) -> str:
    return _UNSUPPORTED.get(name, f"{name} is not supported by orderlymq")


def _client_id(context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_HEADER:
            return value
    return ""


def _malformed(raw: bytes, type_name: str) -> definition.Status:
    return status(Code.BAD_REQUEST, f"malformed request: {len(raw)} bytes that are not a valid apache.rocketmq.v2."
                  f"{type_name}; use the stubs of the RocketMQ 5 protocol (apache/rocketmq-apis)")
