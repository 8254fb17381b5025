"""The ``apache.rocketmq.v2`` messages and codes, from the stubs the official Python client ships.

The stubs come from ``rocketmq-python-client`` (the ``rocketmq`` extra), never from copied proto
files, so they stay the ones RocketMQ 5 clients are built against. Importing this module without
that package installed raises ``ImportError``; ``broker.rocketmq.available()`` checks first.
"""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as definition
from rocketmq.grpc_protocol import service_pb2 as service

__all__ = ["SERVICE_NAME", "Code", "definition", "service"]

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
Code = definition.Code
