"""Durable storage: per-queue segmented append-only logs (``QueueLog``) under a ``Store``."""

from broker.storage.queue_log import AppendResult, QueueLog, ReadResult
from broker.storage.store import Store

__all__ = ["AppendResult", "QueueLog", "ReadResult", "Store"]
