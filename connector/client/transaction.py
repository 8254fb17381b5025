"""Producer transactions: messages staged on the broker, visible all at once on commit.

>>> with producer.transaction() as tx:                       # doctest: +SKIP
...     tx.send("orders", b"debit", key="acct-1")
...     tx.send("orders", b"credit", key="acct-2")

Leaving the block normally commits; an exception aborts (nothing becomes visible) and propagates.
Commit is idempotent on the broker (keyed by the transaction id), so it is retried while the broker
is unreachable. So is a staged send: it carries its number in the transaction, and the broker
stages a number once, so a send whose answer was lost (a broker restart) is sent again without
being staged twice (a broker older than numbering says so when the transaction begins: its sends
are not sent again). A send that still fails (the broker stayed away past the producer's retry
timeout, or a failover lost the transaction) aborts the transaction and raises. Within a queue,
messages become visible in the order they were sent.

In a cluster (docs/cluster.md) the transaction is opened on every broker group and committed on
each in turn (by group name): each group's part is all-or-nothing, the whole is not atomic across
groups (a commit that fails part-way leaves the later groups' parts open until committed again
with the same id, or aborted by their timeout).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from broker.wire import codec
from broker.wire.errors import OrderlyMQError, TransactionError
from broker.wire.send_request import encode_send_request
from connector.client.connection import pb
from connector.client.messages import SendResult
from connector.client.selectors import QueueSelector

if TYPE_CHECKING:
    from connector.client.producer import Messages, Producer

__all__ = ["Transaction"]


class Transaction:
    """One broker transaction of a producer; use it as a context manager or call ``commit``/``abort``.

    Parameters
    ----------
    producer : Producer
        Provides the connection and the routing (selectors) of ``send``.
    txn_id : str, optional
        Idempotency id (default: random). Reusing the id of a finished transaction raises
        ``TransactionError``.
    timeout_ms : int
        The broker aborts the transaction after this long without activity (0: broker default).
    """

    def __init__(self, producer: Producer, txn_id: str | None = None, *, timeout_ms: int = 0) -> None:
        self.producer = producer
        self.txn_id = txn_id or f"{producer.producer_id}-txn-{uuid.uuid4().hex}"
        self.timeout_ms = timeout_ms
        self.state = "NEW"
        self.count = 0
        # Broker groups the transaction is open on ("": a single broker), each with whether its
        # broker stages a numbered send once (one older than numbering does not).
        self._groups: dict[str, bool] = {}
        self._staged: dict[str, int] = {}  # sends staged per group: the number of the next one

    def begin(self) -> Transaction:
        """Open the transaction (``__enter__`` does it): on the broker, or in a cluster on every
        group (so a transaction left open, begun again by its id, commits everywhere it staged)."""
        for group in self.producer.connection.groups():
            self._open_on(group)
        self.state = "OPEN"
        return self

    def _open_on(self, group: str) -> None:
        request = pb.BeginTxnRequest(txn_id=self.txn_id, timeout_ms=self.timeout_ms)
        response = self.producer.connection.for_group(group).call("BeginTxn", request)
        if response.state != "OPEN":
            raise TransactionError(f"transaction {self.txn_id!r} is already {response.state}; use a new id")
        self._groups[group] = response.numbers_sends

    def _require_open(self) -> None:
        if self.state != "OPEN":
            raise TransactionError(f"transaction {self.txn_id!r} is {self.state}; sends need an open transaction")

    def send(
        self,
        topic: str,
        body: bytes | str,
        key: str | int | bytes | None = None,
        tag: str | None = None,
        properties: Mapping[str, str] | None = None,
        selector: str | QueueSelector | None = None,
        arg: Any = None,
        *,
        queue_id: int | None = None,
    ) -> SendResult:
        """Stage one message, routed as ``Producer.send`` routes it; its ``queue_offset`` is -1."""
        msg = {"body": body, "key": key, "tag": tag, "properties": properties}
        return self.send_batch(topic, [msg], selector=selector, arg=arg, queue_id=queue_id)[0]

    def send_batch(
        self,
        topic: str,
        messages: Messages,
        *,
        selector: str | QueueSelector | None = None,
        arg: Any = None,
        queue_id: int | None = None,
    ) -> list[SendResult]:
        """Stage many messages (Arrow table or dicts); one result per message, in input order."""
        self._require_open()
        chunks = self.producer.route(topic, messages, selector=selector, arg=arg, queue_id=queue_id)
        out: list[SendResult | None] = [None] * sum(len(c.positions) for c in chunks)
        for chunk in chunks:
            group = self.producer.routes.route(topic).group_of(chunk.queue_id) if self.producer.connection.clustered() else ""
            number = self._staged.get(group, 0)
            request = encode_send_request(topic, chunk.queue_id, codec.encode_parts(chunk.table), txn_id=self.txn_id,
                                          producer_id=self.txn_id, sequence=number)
            try:
                if group not in self._groups:
                    self._open_on(group)
                # Numbered, staged once: sent again while the broker does not answer, unless it is
                # older than numbering (it would stage the send twice).
                self.producer.connection.for_group(group).call("Send", request, retry=self._groups[group])
            except OrderlyMQError:
                self._abort_quietly()
                raise
            self._staged[group] = number + 1
            for position in chunk.positions:
                out[position] = SendResult(topic, chunk.queue_id, -1, 0)
            self.count += len(chunk.positions)
        return out  # type: ignore[return-value]

    def commit(self) -> int:
        """Make every staged message visible; returns how many the broker applied."""
        self._require_open()
        applied, already = 0, False
        for group in sorted(self._groups):
            response = self.producer.connection.for_group(group).call("CommitTxn", pb.CommitTxnRequest(txn_id=self.txn_id))
            applied += response.count
            already = already or response.already_committed
        self.state = "COMMITTED"
        return self.count if already else applied

    def abort(self) -> None:
        """Drop every staged message."""
        if self.state != "OPEN":
            return
        for group in self._groups:
            self.producer.connection.for_group(group).call("AbortTxn", pb.AbortTxnRequest(txn_id=self.txn_id))
        self.state = "ABORTED"

    def _abort_quietly(self) -> None:
        try:
            self.abort()
        except OrderlyMQError:
            self.state = "ABORTED"  # the broker aborts it when its timeout passes

    def __enter__(self) -> Transaction:
        return self.begin()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self._abort_quietly()
