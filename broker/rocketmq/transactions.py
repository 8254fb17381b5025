"""RocketMQ transactional messages on our broker transactions, and the orphaned-transaction checks.

A half message (a TRANSACTION message) is staged in a broker transaction of its own, id
``rocketmq:<client id>:<message id>`` (message ids of two processes may collide, client ids do
not): invisible until EndTransaction commits it (appended to its queue, like any commit) or rolls
it back. A half message left unresolved is an orphan: from ``FIRST_CHECK_MS``
after it was sent, the broker asks a producer over its Telemetry stream
(RecoverOrphanedTransactionCommand) and the producer's transaction checker answers with an
EndTransaction; checks repeat with a growing interval until ``HALF_MESSAGE_TIMEOUT_MS``, when the
broker rolls it back (its transaction timeout). Which producer is asked: the one that sent it while
it is connected, else any producer announcing the topic.

The pending checks live in memory: after a restart a half message is still committed or rolled back
by EndTransaction, or rolled back at its timeout, but not checked.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.clocks import steady_ms
from broker.proto import orderlymq_pb2 as pb
from broker.rocketmq.protocol import Code, definition, service
from broker.rocketmq.statuses import RocketMQStatusError
from broker.transactions import OPEN

__all__ = ["FIRST_CHECK_MS", "HALF_MESSAGE_TIMEOUT_MS", "HalfMessages"]

FIRST_CHECK_MS = 5_000
MAX_CHECK_INTERVAL_MS = 60_000
HALF_MESSAGE_TIMEOUT_MS = 15 * 60_000
_MAX_CLIENT_ID_IN_TXN = 128


@dataclass
class _Pending:
    topic: str
    message: definition.Message  # as the producer's checker will see it
    client_id: str
    next_check_ms: int
    interval_ms: int


def transaction_id(client_id: str, message_id: str) -> str:
    if len(client_id) > _MAX_CLIENT_ID_IN_TXN:  # transaction ids are bounded: a long one by its digest
        client_id = hashlib.sha256(client_id.encode()).hexdigest()[:32]
    return f"rocketmq:{client_id}:{message_id}"


class HalfMessages:
    """Half messages of RocketMQ producers: staged, resolved, and checked when orphaned."""

    def __init__(self, broker, clock: Callable[[], int] = steady_ms) -> None:
        self.broker = broker
        self.clock = clock
        self._pending: dict[str, _Pending] = {}
        self._mutex = threading.Lock()

    def stage(self, topic: str, queue_id: int, batch: bytes, message: definition.Message, client_id: str) -> str:
        """Stage a half message; returns its transaction id. A retried send is staged once."""
        message_id = message.system_properties.message_id
        if not message_id:
            raise RocketMQStatusError(Code.ILLEGAL_MESSAGE_ID, "a transactional message needs a message id: it "
                                      "names the transaction")
        txn_id = transaction_id(client_id, message_id)
        with self._mutex:
            if txn_id in self._pending:
                return txn_id
            state = self.broker.BeginTxn(pb.BeginTxnRequest(txn_id=txn_id, timeout_ms=HALF_MESSAGE_TIMEOUT_MS)).state
            if state != OPEN:
                raise RocketMQStatusError(Code.INVALID_TRANSACTION_ID, f"message {message_id} was already "
                                          f"resolved ({state}); send a new message")
            self.broker.Send(pb.SendRequest(topic=topic, queue_id=queue_id, batch=batch, txn_id=txn_id))
            interval = _first_check_ms(message)
            self._pending[txn_id] = _Pending(topic, message, client_id, self.clock() + interval, interval)
        return txn_id

    def end(self, txn_id: str, resolution: int) -> None:
        """Commit (append to its queue) or roll back a half message."""
        if resolution == definition.TransactionResolution.COMMIT:
            self.broker.CommitTxn(pb.CommitTxnRequest(txn_id=txn_id))
        elif resolution == definition.TransactionResolution.ROLLBACK:
            self.broker.AbortTxn(pb.AbortTxnRequest(txn_id=txn_id))
        else:
            raise RocketMQStatusError(Code.BAD_REQUEST, "EndTransaction needs a resolution: COMMIT or ROLLBACK")
        with self._mutex:
            self._pending.pop(txn_id, None)

    def checks_for(self, client_id: str, topics: Iterable[str]) -> list[service.TelemetryCommand]:
        """The orphan checks due now that the producer ``client_id`` (announcing ``topics``) should answer."""
        now, topics, commands = self.clock(), set(topics), []
        with self._mutex:
            for txn_id, pending in list(self._pending.items()):
                if self.broker.txns.state(txn_id) != OPEN:  # resolved elsewhere, or timed out
                    del self._pending[txn_id]
                    continue
                if pending.next_check_ms > now or (pending.client_id != client_id and pending.topic not in topics):
                    continue
                pending.interval_ms = min(pending.interval_ms * 2, MAX_CHECK_INTERVAL_MS)
                pending.next_check_ms = now + pending.interval_ms
                command = service.TelemetryCommand()
                command.recover_orphaned_transaction_command.message.CopyFrom(pending.message)
                command.recover_orphaned_transaction_command.transaction_id = txn_id
                commands.append(command)
        return commands


def _first_check_ms(message: definition.Message) -> int:
    asked = message.system_properties.orphaned_transaction_recovery_duration
    ms = asked.seconds * 1000 + asked.nanos // 1_000_000
    return ms if ms > 0 else FIRST_CHECK_MS
