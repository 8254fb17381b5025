"""The gRPC transport of ``BrokerService``: an asyncio server where waiting costs no thread.

Every RPC is a coroutine on one event loop (its own thread, so ``start_broker`` stays a plain call),
uvloop's where it is installed (see ``_new_event_loop``).
What may wait indefinitely lives on the loop: a long-polling ``Pull`` awaits the queue's arrivals
(``QueueLog.wait_for_data_async``) and an open ``SendStream`` awaits its next request, so a thousand
idle polls and streams hold no thread and never starve ``Health`` or a producer. What may block
(fsync, file writes, big reads and encodes) runs on up to ``config.workers`` threads (``ThreadHops``); what is
cheap and in memory runs on the loop itself, where a round trip is fastest.

Every failure becomes a precise status with trailing metadata (error kind, next offset) in one
place, ``_abort``; a malformed request gets INVALID_ARGUMENT naming the expected type, and on a
``SendStream`` an error response while the stream stays open.

Beside the gRPC port, the lean send port (``broker.send_port``) takes ``SendRequest`` frames over
plain TCP on the same loop, for producers' synchronous sends.

With ``acl_file`` set, every call is authenticated (``broker.security``) before its request is
parsed and authorized right after; a ``SendStream`` is authenticated once when it opens and each
of its requests authorized for its topic. Without it, no access-control code runs at all.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pyarrow as pa
from google.protobuf.message import DecodeError

from broker.busy_loop import BusyLoop, busy_poll_limit_us
from broker.config import BrokerConfig
from broker.metrics import BrokerMetrics
from broker.proto import orderlymq_pb2 as pb
from broker.rocketmq import ACL_REFUSAL, refusal_handler, rocketmq_handler
from broker.security.certificates import server_credentials
from broker.security.guard import AccessGuard
from broker.security.http import ReloadingSslContext
from broker.security.throttle import peer_host
from broker.send_port import SendPort, serve_send_port, serves_send_port
from broker.service import BrokerService, ready_queues
from broker.storage.queue_log import QueueLog
from broker.thread_hops import ThreadHops
from broker.wire.errors import (
    ERROR_KIND_KEY,
    InvalidRequestError,
    PermissionDeniedError,
    UnauthenticatedError,
    status_metadata,
    to_status,
)
from broker.wire.pull_response import encode_pull_error
from broker.wire.send_request import SendRequestView, parse_send_request

__all__ = ["BrokerService", "RunningBroker", "start_broker"]

log = logging.getLogger(__name__)

# In memory and quick: answered on the loop. Every other RPC touches files or takes locks that
# are held across file writes, so it runs on a worker thread.
_ON_LOOP = frozenset({"Health", "DescribeTopic", "ListTopics", "Heartbeat", "LeaveGroup", "ListConsumers"})
# In a cluster the topic calls read ZooKeeper: on a thread, never blocking the loop.
_ON_LOOP_CLUSTERED = _ON_LOOP - {"DescribeTopic", "ListTopics"}
# A send at most this big, not transactional, with flush = "async", is stored on the loop: it is a
# page-cache write, cheaper than the hop to a thread. Bigger batches are decoded on a thread.
_ON_LOOP_SEND_BYTES = 64 * 1024
_STORED_AHEAD = 1024  # a broker group's stream: sends stored and waiting for their slaves, at most
_MAX_PENDING_CALLS = 100_000
_STATUS_NAMES = {status.value[0]: status.name for status in grpc.StatusCode}
_DEADLINE_MARGIN_S = 0.05  # a long poll answers this long before the caller's deadline


def _malformed(raw: bytes, request_type) -> str:
    return (f"malformed request: {len(raw)} bytes that are not a valid {request_type.DESCRIPTOR.full_name}; "
            "use the stubs generated from broker/proto/orderlymq.proto")


async def _abort(context: grpc.aio.ServicerContext, method: str, exc: BaseException, metrics: BrokerMetrics,
                 started: float) -> None:
    """End the call with the status of ``exc`` and its trailing metadata (error kind, offsets)."""
    code, message = _record_failure(method, exc, metrics, started)
    context.set_trailing_metadata(status_metadata(exc))
    await context.abort(code, message)


def _record_failure(method: str, exc: BaseException, metrics: BrokerMetrics,
                    started: float) -> tuple[grpc.StatusCode, str]:
    """Count the failed call and log an internal error; its status code and message."""
    code, message, _ = to_status(exc)
    metrics.rpc_done(method, started, code.name)
    if code == grpc.StatusCode.INTERNAL:
        log.error("%s failed", method, exc_info=exc)
    return code, message


async def _abort_malformed(context: grpc.aio.ServicerContext, raw: bytes, request_type) -> None:
    context.set_trailing_metadata(((ERROR_KIND_KEY, "InvalidRequestError"),))
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _malformed(raw, request_type))


class _Transport:
    """The async handlers of one ``BrokerService``: where each call runs, and its error mapping."""

    def __init__(self, service: BrokerService, threads: ThreadHops, guard: AccessGuard | None = None,
                 busy_poll_us: float = 0) -> None:
        self.service = service
        self.threads = threads
        # In a broker group a send may wait for its slaves: on the loop that serves them it awaits
        # them (``BrokerService.send_replicated``), never blocks.
        self.sends_on_loop = service.config.flush == "async"
        self.clustered = service.config.clustered
        self.metrics = service.metrics
        self.guard = guard  # None: access control is off
        self.busy_loop = BusyLoop(busy_poll_us, threads, service.metrics)  # after synchronous lean-port sends

    async def authenticate(self, context: grpc.aio.ServicerContext) -> str:
        """The caller's user; a first sight of its secret costs a scrypt, so that runs on a thread."""
        metadata, host = context.invocation_metadata(), peer_host(context.peer())
        user = self.guard.recognise(metadata, host)
        return user if user is not None else await self.on_thread(self.guard.authenticate, metadata, host)

    async def admit(self, context: grpc.aio.ServicerContext, method: str, started: float | None = None) -> str:
        """The caller's user, or the call ends UNAUTHENTICATED before its request is even parsed."""
        started = time.perf_counter() if started is None else started
        try:
            return await self.authenticate(context)
        except Exception as exc:  # noqa: BLE001 - every failure must become a status
            failure = exc
        await _abort(context, method, failure, self.metrics, started)

    def visible_topics(self, user: str, answer: pb.ListTopicsResponse) -> pb.ListTopicsResponse:
        routes = [route for route in answer.topics if self.guard.visible_topic(user, route.topic)]
        return pb.ListTopicsResponse(topics=routes)

    async def on_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.threads.run(fn, *args)

    def send_on_loop(self, request: pb.SendRequest | SendRequestView, size: int) -> bool:
        """Whether a send of ``size`` bytes on the wire is stored right here on the loop. The size
        as received: ``ByteSize`` serializes the whole message again, reading ``batch`` copies it."""
        return self.sends_on_loop and not request.txn_id and size <= _ON_LOOP_SEND_BYTES

    def answers_at_once(self, request: pb.SendRequest | SendRequestView, size: int) -> bool:
        """Whether the send is stored and answered by one call on the loop: outside a broker
        group, whose sends may await their slaves."""
        return not self.clustered and self.send_on_loop(request, size)

    def stores_before_answering(self, request: pb.SendRequest | SendRequestView, size: int) -> bool:
        """Whether a send may be stored on arrival and answered once its slaves hold it
        (``store_now``), while the sends before it still wait for theirs: a broker group's."""
        return self.clustered and self.send_on_loop(request, size)

    def store_now(self, request: pb.SendRequest | SendRequestView) -> tuple[pb.SendResponse, asyncio.Future | None]:
        """A ``stores_before_answering`` send stored: its answer, and what to await before giving
        it (None: nothing, or an error answer, given as it is)."""
        try:
            return self.service.append_replicated(request)
        except Exception as exc:  # noqa: BLE001 - answered, the connection stays open
            return self.send_failure(request, exc), None

    async def send(self, request: pb.SendRequest | SendRequestView, size: int) -> pb.SendResponse:
        if self.send_on_loop(request, size):
            return await self.service.send_replicated(request) if self.clustered else self.service.Send(request)
        return await self.on_thread(self.service.Send, request)

    def unary(self, name: str, request_type) -> Callable[[bytes, Any], Awaitable[Any]]:
        """The handler of a unary RPC: parse, run on the loop or a thread, map failures."""
        body = getattr(self.service, name)
        run: Callable[[Any, int, Any], Awaitable[Any]]  # (request, its size on the wire, context)
        if name == "Send":
            async def run(request, size, _context):
                return await self.send(request, size)
        elif name in (_ON_LOOP_CLUSTERED if self.service.config.clustered else _ON_LOOP):
            async def run(request, _size, _context):
                return body(request)
        else:
            async def run(request, _size, _context):
                return await self.on_thread(body, request)
        return self._handler(name, request_type, run, parse_send_request if name == "Send" else None)

    def waiting(self, name: str, request_type, answer: Callable[[Any, float | None], Awaitable[Any]]):
        """The handler of a unary RPC that may wait (a long poll): ``answer(request, seconds left
        of the caller's deadline)`` does its own hops to threads and waits on the loop."""
        async def run(request, _size, context):
            return await answer(request, context.time_remaining())
        return self._handler(name, request_type, run)

    def _handler(self, name: str, request_type, run: Callable[[Any, int, Any], Awaitable[Any]], parse=None
                 ) -> Callable[[bytes, Any], Awaitable[Any]]:
        """Authenticate, parse (``request_type``'s, unless ``parse``), authorize, ``run`` and map
        every failure to a status."""
        parse = parse or request_type.FromString

        async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            user = await self.admit(context, name, started) if self.guard is not None else None
            try:
                request = parse(raw)
            except DecodeError:
                await _abort_malformed(context, raw, request_type)
            try:
                if user is not None:
                    self.guard.authorize(user, name, request)
                answer = await run(request, len(raw), context)
                if user is not None and name == "ListTopics":
                    answer = self.visible_topics(user, answer)
                self.metrics.rpc_done(name, started)
                return answer
            except Exception as exc:  # noqa: BLE001 - every failure must become a status
                failure = exc
            await _abort(context, name, failure, self.metrics, started)

        return handler

    async def await_messages(self, request: pb.AwaitMessagesRequest, remaining: float | None
                             ) -> pb.AwaitMessagesResponse:
        """The queues ready now, else the first to become ready within the wait (on the loop)."""
        awaited = await self.on_thread(self.service.awaited_queues, request)
        restarted = request.boot_id not in (0, self.service.boot_id)
        ready = ready_queues(awaited, every=restarted)
        wait_s = _within_deadline(self.service.await_wait_s(request), remaining)
        if not ready and wait_s > 0:
            await _first_arrival(awaited, wait_s)
            ready = ready_queues(awaited)
        return pb.AwaitMessagesResponse(ready=ready)

    async def port_pull(self, raw: bytes) -> list[bytes | pa.Buffer]:
        """The parts of the answer to a pull on the lean port: the ``PullResponse``, or one whose
        ``error_*`` fields name the failure (the connection stays open)."""
        started = time.perf_counter()
        try:
            request = pb.PullRequest.FromString(raw)
        except DecodeError:
            failure: Exception = InvalidRequestError(_malformed(raw, pb.PullRequest))
        else:
            try:
                answer = await self._pull(request, None, joined=False)
                self.metrics.rpc_done("PullPort", started)
                return answer
            except Exception as exc:  # noqa: BLE001 - every failure must become an answer
                failure = exc
        _record_failure("PullPort", failure, self.metrics, started)
        return [encode_pull_error(failure)]

    async def _pull(self, request: pb.PullRequest, remaining: float | None, joined: bool) -> Any:
        """The serialized answer, ``joined`` in one ``bytes`` (gRPC's) or as its parts (a socket's);
        ``remaining``: seconds left of the caller's deadline."""
        service = self.service

        def read(queue) -> bytes | list[bytes | pa.Buffer]:  # on a thread: joining copies megabytes
            parts = service.pull_read(request, queue)
            return b"".join(parts) if joined else parts

        def check_or_read() -> tuple[Any, float, bytes | list[bytes | pa.Buffer] | None]:
            queue = service.pull_queue(request)
            wait_s = service.pull_wait_s(request, queue)
            return queue, wait_s, None if wait_s else read(queue)

        queue, wait_s, answer = await self.on_thread(check_or_read)
        if answer is not None:
            return answer
        wait_s = _within_deadline(wait_s, remaining)
        await queue.wait_for_data_async(request.offset, wait_s)
        return await self.on_thread(read, queue)

    async def send_stream(self, request_iterator, context: grpc.aio.ServicerContext):
        """Answer each request in order; a failed or malformed one gets an error response and the
        stream stays open."""
        user = await self.admit(context, "SendStream", time.perf_counter()) if self.guard is not None else None
        self.metrics.send_streams.inc()
        try:
            if self.clustered:
                async for answer in self._replicated_answers(request_iterator, user):
                    yield answer
            else:
                async for raw in request_iterator:
                    yield await self._stream_answer(raw, user)
        finally:
            self.metrics.send_streams.dec()

    async def _replicated_answers(self, request_iterator, user: str | None):
        """A broker group's stream: each send stored as it is read and answered, in order, once
        its slaves hold it (as the send port does, ``broker.send_port``). A send run on a thread is
        done before the next request is read, which keeps the log in request order."""
        taken: asyncio.Queue = asyncio.Queue(_STORED_AHEAD)

        async def take() -> None:
            try:
                async for raw in request_iterator:
                    await taken.put(await self._stream_store(raw, user))
            except Exception as exc:  # noqa: BLE001 - ends the stream, as it would have in the handler
                await taken.put(exc)
            else:
                await taken.put(None)

        taker = asyncio.get_running_loop().create_task(take())
        try:
            while (entry := await taken.get()) is not None:
                if isinstance(entry, Exception):
                    raise entry
                started, request, answer, replicated = entry
                if replicated is not None:
                    try:
                        await replicated
                    except Exception as exc:  # noqa: BLE001 - reported per request, the stream stays open
                        answer = self.send_failure(request, exc)
                yield self._stream_answered(started, answer)
        finally:
            taker.cancel()

    async def _stream_store(self, raw: bytes, user: str | None) -> tuple[float, Any, pb.SendResponse, Any]:
        """One request of a stream handled: (started, request, answer, what to await before
        answering or None: always None outside a broker group)."""
        started = time.perf_counter()
        request = self.parse_send(raw)
        if isinstance(request, pb.SendResponse):
            return started, None, request, None
        try:
            if user is not None:
                self.guard.authorize(user, "SendStream", request)
            if self.stores_before_answering(request, len(raw)):
                return started, request, *self.store_now(request)
            return started, request, await self.send(request, len(raw)), None
        except Exception as exc:  # noqa: BLE001 - reported per request, the stream stays open
            return started, request, self.send_failure(request, exc), None

    async def _stream_answer(self, raw: bytes, user: str | None) -> pb.SendResponse:
        started, _request, answer, _nothing_to_await = await self._stream_store(raw, user)
        return self._stream_answered(started, answer)

    def _stream_answered(self, started: float, answer: pb.SendResponse) -> pb.SendResponse:
        self.metrics.rpc_done("SendStream", started, _STATUS_NAMES.get(answer.error_code) if answer.error_code else None)
        return answer

    @staticmethod
    def parse_send(raw: bytes | memoryview) -> pb.SendRequest | SendRequestView | pb.SendResponse:
        """A stream's or the send port's request, or the error answer of a malformed one."""
        try:
            return parse_send_request(raw)
        except DecodeError:
            return pb.SendResponse(error_code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                   error_kind="InvalidRequestError", error_message=_malformed(raw, pb.SendRequest))

    @staticmethod
    def send_failure(request: pb.SendRequest | SendRequestView, exc: BaseException) -> pb.SendResponse:
        """The answer of a request that failed, on a stream (or connection) that stays open."""
        code, message, kind = to_status(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.error("send request failed", exc_info=exc)
        return pb.SendResponse(queue_id=request.queue_id, error_code=code.value[0], error_kind=kind,
                               error_message=message)

    def guarded_stream(self, name: str, behaviour: Callable[..., Any]) -> Callable[..., Any]:
        """A stream-stream handler (the Replication service) under access control: authenticated
        and authorized when it opens, each request authorized again (the rules may change)."""
        guard, metrics = self.guard, self.metrics

        async def guarded(requests, context: grpc.aio.ServicerContext):
            started = time.perf_counter()
            user = await self.admit(context, name, started)

            async def authorized():
                try:
                    guard.authorize(user, name, None)
                    async for request in requests:
                        guard.authorize(user, name, request)
                        yield request
                except (PermissionDeniedError, UnauthenticatedError) as exc:
                    await _abort(context, name, exc, metrics, started)

            async for answer in behaviour(authorized(), context):
                yield answer

        return guarded

    def generic_handler(self) -> grpc.GenericRpcHandler:
        handlers = {}
        for method in pb.DESCRIPTOR.services_by_name["OrderlyMQ"].methods:
            serialize = getattr(pb, method.output_type.name).SerializeToString
            if method.name == "Pull":  # serializes its own response (megabytes of batches, copied once)
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(self.waiting(
                    "Pull", pb.PullRequest, lambda request, remaining: self._pull(request, remaining, joined=True)))
            elif method.name == "AwaitMessages":
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    self.waiting("AwaitMessages", pb.AwaitMessagesRequest, self.await_messages),
                    response_serializer=serialize)
            elif method.client_streaming:  # requests parsed one by one: a malformed one gets an answer
                handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                    self.send_stream, response_serializer=serialize)
            else:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    self.unary(method.name, getattr(pb, method.input_type.name)), response_serializer=serialize)
        return grpc.method_handlers_generic_handler("orderlymq.v1.OrderlyMQ", handlers)


def _within_deadline(wait_s: float, remaining: float | None) -> float:
    """A long poll's wait, ending ``_DEADLINE_MARGIN_S`` before the caller's deadline (``remaining``
    seconds away; None: no deadline, the lean port's)."""
    return wait_s if remaining is None else min(wait_s, max(remaining - _DEADLINE_MARGIN_S, 0.0))


async def _first_arrival(awaited: list[tuple[pb.QueuePosition, QueueLog]], wait_s: float) -> None:
    """Return once a message is stored past one of the positions (or its queue closes), or after ``wait_s``."""
    waits = [asyncio.ensure_future(queue.wait_for_data_async(position.offset, wait_s)) for position, queue in awaited]
    try:
        await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop (libuv, in C) where it is installed, else asyncio's. A small synchronous send
    spends more broker CPU in asyncio's Python loop (readiness, callbacks, transports) than in
    being stored; uvloop cuts that part several times over, and gRPC's asyncio server runs on it."""
    try:
        import uvloop
    except ImportError:  # not built for this platform: asyncio's loop serves the same, more slowly
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _LoopThread:
    """An event loop running on its own thread; coroutines are submitted from any other thread."""

    def __init__(self) -> None:
        self.loop = _new_event_loop()
        self.thread = threading.Thread(target=self._run, name="orderlymq-grpc-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


@dataclass
class RunningBroker:
    """A broker serving in this process; ``stop()`` shuts it down cleanly."""

    server: grpc.aio.Server
    service: BrokerService
    config: BrokerConfig
    port: int
    _stop_event: threading.Event
    _housekeeper: threading.Thread
    _loop: _LoopThread
    _threads: ThreadHops
    metrics_port: int | None = None  # the Prometheus endpoint's port, when serving one
    send_port: SendPort | None = None  # the lean send port (broker.send_port), when served
    busy_loop: BusyLoop | None = None  # the event loop's polls after synchronous lean-port sends

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def stop(self, grace: float = 1.0) -> None:
        """Refuse new calls, give running ones ``grace`` seconds, then close the data directory."""
        if self._stop_event.is_set():
            return
        self._stop_event.set()
        if self.send_port is not None:
            self._loop.call(self.send_port.close())
        if self.service.cluster is not None:  # hand the master's role over before draining the calls
            self.service.cluster.stop()
        self._loop.call(self.server.stop(grace))
        self._loop.close()
        self._threads.shutdown(wait=True)
        self._housekeeper.join(timeout=5)
        self.service.close()
        log.info("broker %s stopped", self.config.broker_name)

    def wait(self) -> None:
        """Block until the server stops."""
        self._loop.call(self.server.wait_for_termination())


async def _serve(config: BrokerConfig, transport: _Transport) -> tuple[grpc.aio.Server, int]:
    cluster = transport.service.cluster
    interceptors = []
    if cluster is not None:
        from broker.cluster.gate import MasterGate  # kazoo is the `cluster` extra: imported only when used

        interceptors.append(MasterGate(cluster.require_master, transport.admit if transport.guard else None))
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_receive_message_length", config.max_request_bytes),
        ("grpc.max_send_message_length", max(config.max_request_bytes, 2 * config.max_pull_bytes)),
        ("grpc.so_reuseport", 0),
        # Calls that arrived but that the loop has not taken yet: gRPC refuses them (CANCELLED) past
        # 1,000 by default, which a burst of connecting clients reaches; admitted calls cost no thread.
        ("grpc.server.max_pending_requests", _MAX_PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", _MAX_PENDING_CALLS),
        # A client gone without a word (its host, or a firewall dropping the connection) would keep
        # its streams open for good: pinged when quiet, it is dropped once it stops answering.
        ("grpc.keepalive_time_ms", config.keepalive_ms),
        ("grpc.keepalive_timeout_ms", config.keepalive_timeout_ms),
        ("grpc.http2.ping_timeout_ms", config.keepalive_timeout_ms),  # what this gRPC times a keepalive ping by
        ("grpc.keepalive_permit_without_calls", 1),
        # Clients ping every 10 s, idle or not (connector.client.connection): welcome, not a strike.
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ])
    server.add_generic_rpc_handlers((transport.generic_handler(),))
    if cluster is not None:
        guarded = transport.guarded_stream if transport.guard is not None else None
        server.add_generic_rpc_handlers((cluster.source.rpc_handler(guarded),))
    # RocketMQ 5 clients, same port; refused under access control (they sign requests with their
    # plaintext secret, which the broker does not keep).
    if transport.guard is None:
        rocketmq = rocketmq_handler(transport.service, transport.threads)
    else:
        rocketmq = refusal_handler(ACL_REFUSAL)
        log.warning("RocketMQ 5 protocol not served: %s", ACL_REFUSAL)
    if rocketmq is not None:
        server.add_generic_rpc_handlers((rocketmq,))
    address = f"{config.host}:{config.port}"
    try:
        if config.tls:
            credentials = server_credentials(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file or None)
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:  # gRPC's "Failed to bind": answered below as the OSError callers expect
        port = 0
    if port:
        await server.start()
    return server, port


def start_broker(config: BrokerConfig, *, own_process: bool = False) -> RunningBroker:
    """Open the data directory (recovering it) and serve on ``config.host:config.port``
    (port 0 picks a free one: read ``.port``). ``own_process``: the process runs nothing else (the
    ``orderlymq-broker`` command); the default ``busy_poll_us`` polls only then."""
    guard = AccessGuard(config.acl_file) if config.acl_file else None  # a bad ACL file fails before any open
    link = zookeeper = None
    if config.clustered:
        from broker.cluster.link import ReplicationLink
        from broker.cluster.zk_security import zookeeper_client_options

        link = ReplicationLink.from_config(config)  # likewise its TLS and secret files
        zookeeper = zookeeper_client_options(config)
    service = BrokerService(config)
    if config.clustered:
        from broker.cluster.node import ClusterNode  # kazoo is the `cluster` extra: imported only when used

        service.cluster = ClusterNode(service, link, zookeeper)
    threads = ThreadHops(config.workers, "orderlymq-rpc")
    loop = _LoopThread()
    server = send_port = None

    def abandon() -> None:
        """Undo a start that failed part-way: nothing keeps serving or holding the data dir."""
        if send_port is not None:
            loop.call(send_port.close())
        if server is not None:
            loop.call(server.stop(0))
        loop.close()
        threads.shutdown()
        service.close()

    transport = _Transport(service, threads, guard, busy_poll_limit_us(config.busy_poll_us, own_process))
    try:
        server, port = loop.call(_serve(config, transport))
    except BaseException:
        abandon()
        raise
    if port == 0:
        abandon()
        raise OSError(f"cannot listen on {config.host}:{config.port} (in use?); pick another --port")
    if serves_send_port(config, guard is not None):
        try:
            send_port = loop.call(serve_send_port(config, transport))
        except OSError as exc:
            abandon()
            raise OSError(f"cannot listen on {config.host}:{config.send_port} for the send port ({exc}); pick "
                          "another send_port, or -1 for none") from None
        service.send_port = config.advertised_send_port or send_port.port
    try:
        metrics_port = service.metrics.serve(
            config.metrics_port, config.host, guard=guard,
            tls=ReloadingSslContext(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
            if config.tls else None) if config.metrics_port >= 0 else None
    except OSError as exc:
        abandon()
        raise OSError(f"cannot serve metrics on {config.host}:{config.metrics_port} ({exc}); pick another "
                      "metrics_port") from None
    if service.cluster is not None:
        try:
            service.cluster.start(f"{config.host}:{port}")
        except Exception as exc:
            abandon()
            raise OSError(f"cannot join broker group {config.broker_name} through ZooKeeper {config.zookeeper}: "
                          f"{exc}; is ZooKeeper running?") from None
    stop = threading.Event()
    housekeeper = threading.Thread(target=service.housekeeping, args=(stop,), name="orderlymq-housekeeping", daemon=True)
    housekeeper.start()
    log.info("broker %s listening on %s:%d (data %s, flush=%s, %s, %s, %s)", config.broker_name, config.host, port,
             config.data_dir, config.flush, "mutual TLS" if config.tls_client_ca_file else "TLS" if config.tls
             else "plaintext", f"ACL {config.acl_file}" if guard else "no access control",
             f"send port {send_port.port}" if send_port else "no send port")
    return RunningBroker(server, service, config, port, stop, housekeeper, loop, threads, metrics_port, send_port,
                         transport.busy_loop)
