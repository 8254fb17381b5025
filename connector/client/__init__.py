"""The orderlymq Python client (RocketMQ's ordered-message model).

- ``Producer``: send with queue selectors (hash of the sharding key by default), pipelined and
  idempotent, per-queue order kept through retries; ``producer.transaction()``.
- Every client takes a single broker's address or any brokers of a cluster (bootstrap) and sends
  each queue's calls to the master of the broker group holding it (``connector.client.routed``).
- ``Admin``: topics, consumer progress and lag, lock holders, every group and open transaction.
- ``PullConsumer``: pull a queue from an offset, seek, commit, lock with a fencing epoch.
- ``OrderlyConsumer``: ``MessageListenerOrderly`` (clustering or broadcasting).
- ``ConcurrentConsumer``: ``MessageListenerConcurrently`` with a retry topic.

Every error is an ``connector.errors.OrderlyMQError``.
"""

from connector.client.admin import (
    Admin,
    BrokerGroup,
    GroupOffset,
    GroupState,
    LockHolder,
    OpenTransaction,
    QueueProgress,
    QueueStatus,
    TopicInfo,
)
from connector.client.concurrent_consumer import ConcurrentConsumer
from connector.client.listener import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
)
from connector.client.messages import Message, MessageQueue, PullResult, SendResult
from connector.client.orderly_consumer import OrderlyConsumer
from connector.client.producer import Producer
from connector.client.pull_consumer import PullConsumer
from connector.client.push_consumer import BROADCASTING, CLUSTERING, dlq_topic, retry_topic
from connector.client.rebalance import allocate_averagely, allocate_by_circle
from connector.client.selectors import SelectByHash, SelectByModulo, SelectRandom, SelectRoundRobin
from connector.client.send_results import SendResults
from connector.client.transaction import Transaction

__all__ = [
    "BROADCASTING",
    "CLUSTERING",
    "Admin",
    "BrokerGroup",
    "ConcurrentConsumer",
    "ConsumeConcurrentlyContext",
    "ConsumeConcurrentlyStatus",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "GroupOffset",
    "GroupState",
    "LockHolder",
    "Message",
    "MessageQueue",
    "OpenTransaction",
    "OrderlyConsumer",
    "Producer",
    "PullConsumer",
    "PullResult",
    "QueueProgress",
    "QueueStatus",
    "SelectByHash",
    "SelectByModulo",
    "SelectRandom",
    "SelectRoundRobin",
    "SendResult",
    "SendResults",
    "TopicInfo",
    "Transaction",
    "allocate_averagely",
    "allocate_by_circle",
    "dlq_topic",
    "retry_topic",
]
