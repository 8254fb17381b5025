"""Receipt handles: what a RocketMQ consumer gets with a message and hands back to ack it.

A receipt names the delivery it acknowledges: (topic, queue, offset), the delivery attempt, the
queue lock epoch under which the broker's delivery state for that queue was built, and the client
it was handed to. The broker keeps no table of receipts; it checks a returned one against the
message's current delivery (``broker.rocketmq.deliveries``), so a receipt of an earlier attempt,
or one from before the queue passed to another consumer, is refused as INVALID_RECEIPT_HANDLE.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from broker.rocketmq.protocol import Code
from broker.rocketmq.statuses import RocketMQStatusError

__all__ = ["Receipt"]

_VERSION = "omq1."


@dataclass(frozen=True)
class Receipt:
    topic: str
    queue_id: int
    offset: int
    attempt: int
    epoch: int
    client_id: str

    def encode(self) -> str:
        fields = [self.topic, self.queue_id, self.offset, self.attempt, self.epoch, self.client_id]
        return _VERSION + base64.urlsafe_b64encode(json.dumps(fields, separators=(",", ":")).encode()).decode()

    @classmethod
    def decode(cls, handle: str) -> Receipt:
        """The receipt in ``handle``; ``RocketMQStatusError(INVALID_RECEIPT_HANDLE)`` if it is none of ours."""
        if not handle.startswith(_VERSION):
            raise _invalid(handle)
        try:
            topic, queue_id, offset, attempt, epoch, client_id = json.loads(
                base64.urlsafe_b64decode(handle[len(_VERSION):].encode()))
            receipt = cls(str(topic), int(queue_id), int(offset), int(attempt), int(epoch), str(client_id))
        except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
            raise _invalid(handle) from None
        return receipt


def _invalid(handle: str) -> RocketMQStatusError:
    shown = handle if len(handle) <= 40 else handle[:40] + "..."
    return RocketMQStatusError(Code.INVALID_RECEIPT_HANDLE, f"receipt handle {shown!r} was not issued by this "
                               "broker; ack with the receipt handle of a message received from it")
