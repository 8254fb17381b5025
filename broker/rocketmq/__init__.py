"""RocketMQ 5 clients against orderlymq: ``apache.rocketmq.v2.MessagingService`` beside ``orderlymq.v1``.

Served when the protocol stubs are installed (``pip install 'orderlymq[rocketmq]'``); without them
the broker serves ``orderlymq.v1`` alone and says so in its log. See docs/rocketmq.md.
"""

from __future__ import annotations

import importlib.util
import logging
from concurrent import futures

import grpc

__all__ = ["available", "rocketmq_handler"]

log = logging.getLogger(__name__)


def available() -> bool:
    """Whether the RocketMQ 5 protocol stubs (package ``rocketmq-python-client``) are installed."""
    return importlib.util.find_spec("rocketmq") is not None


def rocketmq_handler(service, pool: futures.ThreadPoolExecutor) -> grpc.GenericRpcHandler | None:
    """The handler of the RocketMQ service over ``service`` (a ``BrokerService``), or None without the stubs."""
    if not available():
        log.info("RocketMQ 5 protocol not served: install orderlymq[rocketmq] to let RocketMQ 5 clients connect")
        return None
    from broker.rocketmq.service import RocketMQService

    log.info("serving apache.rocketmq.v2.MessagingService beside orderlymq.v1: RocketMQ 5 clients may connect")
    return RocketMQService(service, pool).generic_handler()
