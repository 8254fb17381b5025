"""The official RocketMQ 5 Python client against a test broker: started clients, (key, seq) messages,
and draining a SimpleConsumer into the emission-ordered deliveries ``connector.history`` judges.

A message of key ``k`` and sequence ``s`` has message group ``k`` and body ``{"key": k, "seq": s}``.
"""

from __future__ import annotations

import contextlib
import json
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from connector.history import Delivery


def configuration(address: str) -> ClientConfiguration:
    return ClientConfiguration(address, Credentials(), request_timeout=5)


@contextlib.contextmanager
def producer(address: str, *topics: str):
    client = Producer(configuration(address), topics)
    client.startup()
    try:
        yield client
    finally:
        client.shutdown()


@contextlib.contextmanager
def simple_consumer(address: str, group: str, topic: str, await_s: int = 1, tags: str = "*"):
    client = SimpleConsumer(configuration(address), group, {topic: FilterExpression(tags)}, await_duration=await_s)
    client.startup()
    try:
        yield client
    finally:
        client.shutdown()


def keyed_message(topic: str, key: str, seq: int, *, fifo: bool = True, tag: str | None = None) -> Message:
    message = Message()
    message.topic = topic
    message.body = json.dumps({"key": key, "seq": seq}).encode()
    if fifo:
        message.message_group = key
    if tag:
        message.tag = tag
    message.keys = f"{key}#{seq}"
    return message


def event(message) -> tuple[str, int]:
    return event_of(message.body)


def event_of(body: bytes) -> tuple[str, int]:
    decoded = json.loads(body)
    return decoded["key"], decoded["seq"]


def drain(consumer: SimpleConsumer, expected: int, *, timeout: float = 30.0, batch: int = 16,
          invisible_s: int = 20) -> list[Delivery]:
    """Receive and ack until ``expected`` distinct messages came (or ``timeout``); every delivery
    in the order received, for ``connector.history.check``."""
    deliveries: list[Delivery] = []
    seen: set[tuple[str, int]] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < expected and time.monotonic() < deadline:
        for message in consumer.receive(batch, invisible_s):
            key, seq = event(message)
            deliveries.append(Delivery(key, seq, "rocketmq", -1, -1))
            seen.add((key, seq))
            consumer.ack(message)
    return deliveries
