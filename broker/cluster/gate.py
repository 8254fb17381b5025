"""Only a group's master serves: a server interceptor that refuses every orderlymq.v1 call but
``Health``, ``DescribeCluster`` and the topic calls (the cluster's topics live in ZooKeeper: any
broker answers them) on a broker that is not master, with ``NotMasterError`` naming the master.

A refusal happens before the request is read, so nothing was done and the client may send it to
the master whatever the call. Under access control the caller is authenticated first (``admit``):
a caller without valid credentials learns nothing, not even where the master is. A ``SendStream``
opened while master is also checked per request (``BrokerService.Send``), since the role may
change while it is open.
"""

from __future__ import annotations

import grpc

from broker.wire.errors import NotMasterError, status_metadata

__all__ = ["MasterGate"]

_SERVICE = "/orderlymq.v1.OrderlyMQ/"
_ALWAYS_SERVED = frozenset(_SERVICE + name for name in (
    "Health", "CreateTopic", "UpdateTopic", "DescribeTopic", "ListTopics", "DeleteTopic", "DescribeCluster"))


class MasterGate(grpc.aio.ServerInterceptor):
    """``admit(context, method)``, when given, authenticates a caller before it is refused (and
    ends the call UNAUTHENTICATED when it cannot)."""

    def __init__(self, require_master, admit=None) -> None:
        self.require_master = require_master
        self.admit = admit

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(_SERVICE) or method in _ALWAYS_SERVED:
            return handler
        try:
            self.require_master()
        except NotMasterError as exc:
            return _refusal(handler, exc, method.rsplit("/", 1)[1], self.admit)
        return handler


def _refusal(handler: grpc.RpcMethodHandler, exc: NotMasterError, method: str, admit) -> grpc.RpcMethodHandler:
    async def refuse(context: grpc.aio.ServicerContext) -> None:
        if admit is not None:
            await admit(context, method)
        await context.abort(exc.code, str(exc), trailing_metadata=status_metadata(exc))

    if handler.request_streaming:
        async def refuse_stream(requests, context):
            await refuse(context)
            yield b""  # never reached: makes this an async generator, as a streaming handler is

        return grpc.stream_stream_rpc_method_handler(refuse_stream, response_serializer=handler.response_serializer)

    async def refuse_unary(request, context):
        await refuse(context)

    return grpc.unary_unary_rpc_method_handler(refuse_unary, response_serializer=handler.response_serializer)
