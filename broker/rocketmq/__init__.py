"""RocketMQ 5 clients against orderlymq: ``apache.rocketmq.v2.MessagingService`` beside ``orderlymq.v1``.

Served when the protocol stubs are installed (``pip install 'orderlymq[rocketmq]'``); without them
the broker serves ``orderlymq.v1`` alone and says so in its log. Never served under access control
(``acl_file``): RocketMQ clients sign each request with an HMAC keyed by their plaintext secret key,
and the broker keeps only scrypt hashes of secrets, so it cannot check them; a RocketMQ client is
then refused with a status that says so. See docs/rocketmq.md.
"""

from __future__ import annotations

import importlib.util
import logging

import grpc

from broker.thread_hops import ThreadHops

__all__ = ["ACL_REFUSAL", "available", "refusal_handler", "rocketmq_handler"]

log = logging.getLogger(__name__)

_SERVICE = "/apache.rocketmq.v2.MessagingService/"
ACL_REFUSAL = (
    "this broker has access control on (acl_file), so it does not serve the RocketMQ 5 protocol: RocketMQ "
    "clients sign requests with an HMAC of their plaintext secret key, and the broker keeps only scrypt hashes "
    "of secrets. Use an orderlymq client (docs/security.md), or a broker without acl_file"
)


def available() -> bool:
    """Whether the RocketMQ 5 protocol stubs (package ``rocketmq-python-client``) are installed."""
    return importlib.util.find_spec("rocketmq") is not None


def rocketmq_handler(service, threads: ThreadHops) -> grpc.GenericRpcHandler | None:
    """The handler of the RocketMQ service over ``service`` (a ``BrokerService``), or None without the stubs."""
    if not available():
        log.info("RocketMQ 5 protocol not served: install orderlymq[rocketmq] to let RocketMQ 5 clients connect")
        return None
    from broker.rocketmq.service import RocketMQService

    log.info("serving apache.rocketmq.v2.MessagingService beside orderlymq.v1: RocketMQ 5 clients may connect")
    return RocketMQService(service, threads).generic_handler()


def refusal_handler(reason: str) -> grpc.GenericRpcHandler:
    """Every RocketMQ 5 call refused with ``reason`` (FAILED_PRECONDITION), whatever its kind."""

    async def refuse(requests, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, reason)
        yield b""  # never reached: makes this an async generator, as a streaming handler is

    class _Refusal(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            if handler_call_details.method.startswith(_SERVICE):
                return grpc.stream_stream_rpc_method_handler(refuse)
            return None

    return _Refusal()
