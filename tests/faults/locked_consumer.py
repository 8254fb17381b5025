"""A consumer in its own process that reads queues under the group's broker lock, so a test can
freeze it with SIGSTOP while another instance takes its queues.

Usage: python locked_consumer.py ADDRESS TOPIC GROUP CLIENT_ID QUEUE_IDS EVENTS STOP [WORK_MS]

``QUEUE_IDS`` is comma-separated. For each queue in turn it pulls a batch with its fencing epoch,
"works" ``WORK_MS`` per message, then commits the batch's end offset with the same epoch. It trusts
the broker's fencing to tell it when it lost a queue: a fenced pull makes it lock the queue again
(and start from the committed offset), a failed commit makes it pull the batch again. A thread
renews its locks every third of the lease without changing the epoch its pulls use.

Every step is appended to ``EVENTS`` as one JSON line stamped with ``time.monotonic_ns()`` taken
*before* the RPC (so a step that the broker accepted is ordered by when it was sent, which is
while the lock was valid): ``locked``, ``lock_refused``, ``delivered`` (with the messages),
``committed`` (with the messages it covers), ``pull_fenced``, ``commit_fenced``, ``renew_refused``.
It exits when the file ``STOP`` exists.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.wire.errors import FencedError, LockUnavailableError, OrderlyMQError  # noqa: E402
from connector.client import PullConsumer  # noqa: E402
from connector.client.connection import pb  # noqa: E402
from tests.faults.workload import parse_body  # noqa: E402

BATCH = 8


class EventLog:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, event: str, t: int, **fields) -> None:
        with self._lock:
            self._file.write(json.dumps({"event": event, "t": t, **fields}) + "\n")


class LockedConsumer:
    def __init__(self, address: str, topic: str, group: str, client_id: str, queues: list[int], events: EventLog,
                 work_s: float) -> None:
        self.consumer = PullConsumer(address, group=group, client_id=client_id, retry_timeout=30)
        self.topic, self.group, self.client_id, self.queues = topic, group, client_id, queues
        self.events, self.work_s = events, work_s
        self.positions: dict[int, int] = {}

    def run(self, stop: Path) -> None:
        threading.Thread(target=self._renew, args=(stop,), daemon=True).start()
        while not stop.exists():
            busy = False
            for queue_id in self.queues:
                busy |= self._step(queue_id)
            if not busy:
                time.sleep(0.05)
        self.consumer.close()

    def _step(self, queue_id: int) -> bool:
        """One pull-work-commit round of a queue; whether it consumed anything."""
        if queue_id not in self.positions and not self._lock(queue_id):
            return False
        epoch, start = self.consumer.epoch(self.topic, queue_id), self.positions[queue_id]
        t = time.monotonic_ns()
        try:
            result = self.consumer.pull(self.topic, queue_id, start, BATCH)
        except FencedError as exc:
            self.events.write("pull_fenced", t, queue=queue_id, epoch=epoch, offset=start, error=str(exc))
            del self.positions[queue_id]
            return False
        if not result.messages:
            return False
        messages = [[*parse_body(m.body), m.queue_offset] for m in result.messages]
        self.events.write("delivered", t, queue=queue_id, epoch=epoch, messages=messages)
        time.sleep(self.work_s * len(messages))
        t = time.monotonic_ns()
        try:
            self.consumer.commit(self.topic, queue_id, result.next_offset)
        except FencedError as exc:
            self.events.write("commit_fenced", t, queue=queue_id, epoch=epoch, offset=result.next_offset,
                              error=str(exc))
            return True  # pull the batch again: the broker will say whether the queue is still ours
        self.events.write("committed", t, queue=queue_id, epoch=epoch, offset=result.next_offset,
                          messages=messages)
        self.positions[queue_id] = result.next_offset
        return True

    def _lock(self, queue_id: int) -> bool:
        t = time.monotonic_ns()
        try:
            epoch = self.consumer.lock(self.topic, queue_id)
        except LockUnavailableError as exc:
            self.events.write("lock_refused", t, queue=queue_id, error=str(exc))
            return False
        committed = self.consumer.committed(self.topic, queue_id)
        self.positions[queue_id] = max(committed, 0)
        self.events.write("locked", t, queue=queue_id, epoch=epoch, offset=self.positions[queue_id])
        return True

    def _renew(self, stop: Path) -> None:
        lease_ms = 0
        while not stop.exists():
            time.sleep(max(lease_ms / 3000, 0.05) if lease_ms else 0.1)
            held = [q for q in self.queues if q in self.positions]
            if not held:
                continue
            request = pb.LockBatchRequest(group=self.group, client_id=self.client_id, topic=self.topic,
                                          queue_ids=held)
            t = time.monotonic_ns()
            try:
                granted = {lk.queue_id: lk.epoch for lk in self.consumer.connection.call("LockBatch", request).locked}
                locks = self.consumer.connection.call(
                    "QueryLocks", pb.QueryLocksRequest(group=self.group, topic=self.topic)).locks
            except OrderlyMQError:
                continue
            mine = [lk.expires_at_ms for lk in locks if lk.client_id == self.client_id]
            lease_ms = max(mine) - int(time.time() * 1000) if mine else lease_ms
            for queue_id in held:
                if granted.get(queue_id) != self.consumer.epoch(self.topic, queue_id):
                    self.events.write("renew_refused", t, queue=queue_id, granted=granted.get(queue_id))


def main() -> None:
    address, topic, group, client_id, queue_ids, events, stop = sys.argv[1:8]
    work_ms = float(sys.argv[8]) if len(sys.argv) > 8 else 20.0
    queues = [int(q) for q in queue_ids.split(",")]
    LockedConsumer(address, topic, group, client_id, queues, EventLog(events), work_ms / 1000).run(Path(stop))


if __name__ == "__main__":
    main()
