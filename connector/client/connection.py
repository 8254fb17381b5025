"""The client's one transport: a gRPC channel to a broker, with error translation and retries.

Every RPC goes through ``BrokerConnection.call``, the only place a ``grpc.RpcError`` becomes an
``OrderlyMQError``. Calls that are safe to repeat are retried with backoff while the broker is
unavailable; after ``retry_timeout`` seconds a ``BrokerUnavailableError`` names the address.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from broker.proto import orderlymq_pb2 as pb
from broker.proto import orderlymq_pb2_grpc as pb_grpc
from broker.wire.credentials import Credentials
from broker.wire.errors import BrokerUnavailableError, InvalidOptionError, NotMasterError, from_rpc_error
from broker.wire.pull_response import decode_pull_response
from broker.wire.send_request import serialize_send
from broker.wire.tls import TlsOptions, channel_credentials, channel_options

__all__ = ["MAX_MESSAGE_BYTES", "BrokerConnection", "Credentials", "TlsOptions", "open_channel", "parse_brokers",
           "pb"]

_T = TypeVar("_T")

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),
    # A connection that went silent (the broker's host gone, a firewall dropping it: no close, no
    # reset) fails its calls within about 20 s, and the next call dials anew: pinged every 10 s, idle
    # or not, dropped when a ping goes 10 s unanswered. This gRPC times the ping by ``ping_timeout_ms``
    # (60 s by default), not ``keepalive_timeout_ms``; and it stops pinging a long poll that carries no
    # data after two pings unless ``max_pings_without_data`` is 0.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
]


def parse_brokers(brokers: str) -> list[str]:
    """``"host:port[,host:port]"`` as a list; ``InvalidOptionError`` when malformed."""
    if not isinstance(brokers, str) or not brokers.strip():
        raise InvalidOptionError("option 'brokers' is required, e.g. brokers='127.0.0.1:9876'")
    out = []
    for part in brokers.split(","):
        addr = part.strip()
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidOptionError(f"broker address {addr!r} is not host:port (in brokers={brokers!r})")
        out.append(addr)
    return out


def open_channel(address: str, tls: TlsOptions | None = None) -> grpc.Channel:
    """A channel to ``address``: TLS when ``tls`` is given, plaintext otherwise."""
    if tls is None:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.secure_channel(address, channel_credentials(tls), options=CHANNEL_OPTIONS + channel_options(tls))


class _Stub(pb_grpc.OrderlyMQStub):
    """The generated stub, whose sends also take a request already serialized by
    ``broker.wire.send_request.encode_send_request`` (one copy of a big batch instead of three), and
    whose ``Pull`` answers a ``PullReply`` parsed by hand (its megabytes of batches not copied again
    once gRPC hands over the bytes)."""

    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(channel)
        self.Send = channel.unary_unary("/orderlymq.v1.OrderlyMQ/Send", request_serializer=serialize_send,
                                        response_deserializer=pb.SendResponse.FromString, _registered_method=True)
        self.SendStream = channel.stream_stream("/orderlymq.v1.OrderlyMQ/SendStream", request_serializer=serialize_send,
                                                response_deserializer=pb.SendResponse.FromString,
                                                _registered_method=True)
        pull = channel.unary_unary("/orderlymq.v1.OrderlyMQ/Pull", request_serializer=pb.PullRequest.SerializeToString,
                                   _registered_method=True)
        self.Pull = lambda request, **kwargs: decode_pull_response(pull(request, **kwargs))


class BrokerConnection:
    """A channel to the first reachable broker of ``brokers``; thread-safe, cheap to share.

    Parameters
    ----------
    brokers : str
        ``"host:port[,host:port]"``; later addresses are tried when earlier ones are down.
    timeout : float
        Deadline in seconds of one RPC attempt (long polls add their wait to it).
    retry_timeout : float
        How long retryable calls keep retrying an unavailable broker before giving up.
    tls : TlsOptions, optional
        Connect over TLS, verifying the broker (and presenting a client certificate if given).
    credentials : Credentials, optional
        Access key and secret sent with every call to a broker with access control; by default
        those of ``ORDERLYMQ_ACCESS_KEY`` / ``ORDERLYMQ_SECRET_KEY`` when set.
    """

    def __init__(self, brokers: str, *, timeout: float = 30.0, retry_timeout: float = 30.0,
                 tls: TlsOptions | None = None, credentials: Credentials | None = None) -> None:
        self.addresses = parse_brokers(brokers)
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.tls = tls
        self.credentials = credentials if credentials is not None else Credentials.from_environment()
        self.metadata = self.credentials.metadata() if self.credentials is not None else None
        self._lock = threading.Lock()
        self._index = 0
        self._channel: grpc.Channel | None = None
        self._stub: _Stub | None = None

    @property
    def address(self) -> str:
        return self.addresses[self._index]

    @property
    def stub(self) -> _Stub:
        with self._lock:
            if self._stub is None:
                self._channel = open_channel(self.address, self.tls)
                self._stub = _Stub(self._channel)
            return self._stub

    def on_current_stub(self, start: Callable[[_Stub], _T]) -> _T:
        """``start(stub)`` (which starts a call) on the channel of the broker this connection points
        at. Another thread may move the connection to another broker and close the channel between
        reading the stub and starting the call (gRPC raises ValueError; nothing was sent): the call
        is started again on the new channel. Whether it moved is read under the lock, as a move
        closes the channel before it lets go of the stub."""
        while True:
            stub = self.stub
            try:
                return start(stub)
            except ValueError:
                with self._lock:
                    if stub is self._stub:
                        raise

    def _fail_over(self, error: BaseException | None = None) -> None:
        """Point the channel at another broker: the master ``error`` names when it is a
        ``NotMasterError`` (a broker group), else the next address, if any."""
        with self._lock:
            master = error.master if isinstance(error, NotMasterError) else ""
            if master:
                if master not in self.addresses:
                    self.addresses.append(master)
                if self.addresses.index(master) != self._index or self._stub is None:
                    if self._channel is not None:
                        self._channel.close()
                    self._channel = self._stub = None
                    self._index = self.addresses.index(master)
            elif len(self.addresses) > 1:
                if self._channel is not None:
                    self._channel.close()
                self._channel = self._stub = None
                self._index = (self._index + 1) % len(self.addresses)

    def follow(self, master: str, addresses=()) -> None:
        """Learn ``addresses`` of the same group and send from now on to ``master`` when given
        (a fresh route named it)."""
        with self._lock:
            for address in addresses:
                if address not in self.addresses:
                    self.addresses.append(address)
        if master and master != self.address:
            self._fail_over(NotMasterError("", master))

    def call(
        self,
        method: str,
        request: Any,
        *,
        timeout: float | None = None,
        retry: bool = True,
        deadline: float | None = None,
    ) -> Any:
        """Invoke RPC ``method`` (e.g. ``"Pull"``); raise the ``OrderlyMQError`` it failed with.

        With ``retry``, an unavailable broker is retried with jittered backoff until
        ``retry_timeout`` has passed. Only pass ``retry=True`` for calls that are safe to repeat.
        ``deadline`` (``time.monotonic()``) bounds the whole call, attempts and retries together.
        """
        end = deadline if deadline is not None else time.monotonic() + self.retry_timeout
        delay = 0.05
        while True:
            attempt = timeout or self.timeout
            if deadline is not None:
                attempt = max(min(attempt, deadline - time.monotonic()), 0.001)
            try:
                return self.on_current_stub(lambda stub, attempt=attempt: getattr(stub, method)(
                    request, timeout=attempt, metadata=self.metadata))
            except grpc.RpcError as err:
                error = from_rpc_error(err)
                # A broker group's slave refused before doing anything: any call may go to the master.
                refused = isinstance(error, NotMasterError)
                if not (retry and isinstance(error, BrokerUnavailableError)) and not refused:
                    raise error from None
                if refused and time.monotonic() >= end:
                    raise error from None
                if refused and error.master and error.master != self.address:
                    self._fail_over(error)
                    continue
                if time.monotonic() + delay > end:
                    waited = f"{self.retry_timeout:g}s" if deadline is None else "the whole time allowed"
                    raise BrokerUnavailableError(
                        f"broker {self.address} unavailable for {waited} "
                        f"(last error: {error}); is it running? start one with `orderlymq-broker`"
                    ) from None
                self._fail_over(error)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None

    def __enter__(self) -> BrokerConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # Picklable for Spark: ship the addresses, reopen the channel on the other side.
        return {"addresses": self.addresses, "timeout": self.timeout, "retry_timeout": self.retry_timeout,
                "tls": self.tls, "credentials": self.credentials}

    def __setstate__(self, state: dict) -> None:
        self.__init__(",".join(state["addresses"]), timeout=state["timeout"], retry_timeout=state["retry_timeout"],
                      tls=state.get("tls"), credentials=state.get("credentials"))
