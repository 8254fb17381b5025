"""The settings a RocketMQ 5 client receives on its Telemetry stream when it starts.

The clients wait for these before they count as started (push consumers refuse to start without
them): producers learn the body limit and their send retries, consumers that the group is FIFO
(every orderlymq group is: see ``broker.rocketmq.deliveries``), the receive batch size, the long
polling time and how consumption is retried.
"""

from __future__ import annotations

from broker.rocketmq.protocol import definition

__all__ = ["LONG_POLLING_S", "settings_for"]

LONG_POLLING_S = 20
RECEIVE_BATCH_SIZE = 32
SEND_ATTEMPTS = 3
CONSUME_ATTEMPTS = 16
_CONSUME_BACKOFF_S = (1, 5, 10, 30, 60)  # then the last, until CONSUME_ATTEMPTS
_PRODUCERS = (definition.ClientType.PRODUCER,)


def _producer(settings: definition.Settings, max_body_bytes: int) -> None:
    settings.publishing.max_body_size = max_body_bytes
    settings.publishing.validate_message_type = True
    policy = settings.backoff_policy
    policy.max_attempts = SEND_ATTEMPTS
    policy.exponential_backoff.initial.FromMilliseconds(10)
    policy.exponential_backoff.max.FromMilliseconds(1000)
    policy.exponential_backoff.multiplier = 2.0


def _consumer(settings: definition.Settings, asked: definition.Settings) -> None:
    settings.subscription.group.CopyFrom(asked.subscription.group)
    settings.subscription.subscriptions.extend(asked.subscription.subscriptions)
    settings.subscription.fifo = True
    settings.subscription.receive_batch_size = RECEIVE_BATCH_SIZE
    settings.subscription.long_polling_timeout.seconds = LONG_POLLING_S
    policy = settings.backoff_policy
    policy.max_attempts = CONSUME_ATTEMPTS
    for seconds in _CONSUME_BACKOFF_S:
        policy.customized_backoff.next.add().seconds = seconds


def settings_for(asked: definition.Settings, max_body_bytes: int) -> definition.Settings:
    """The broker's answer to the settings a client announced."""
    settings = definition.Settings(client_type=asked.client_type)
    settings.request_timeout.CopyFrom(asked.request_timeout)
    if asked.client_type in _PRODUCERS:
        _producer(settings, max_body_bytes)
    else:
        _consumer(settings, asked)
    settings.metric.on = False
    return settings
