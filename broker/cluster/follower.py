"""The slave's side of replication: copy the master of one epoch into this broker's store.

A ``ReplicaFetcher`` follows one master at one group epoch. It first asks for the master's epoch
history and cuts from its queues whatever the master never had (``epochs.truncation_points``),
then fetches in a loop: each answer is applied (topics, then records at the offsets they carry,
then committed offsets) before the next fetch reports the new ends, which acknowledges them.
It stops when told to (another master, another epoch) and retries a broken stream until then.

Every answer received renews this broker's ``CampaignPromise`` (its master counts on it, see
``node.py``); a refusal from the master at this epoch (it stepped down) releases it. Records of a
queue that start past this copy's end mean the master's retention removed what this copy lacks:
the queue restarts there. Once an answer brought everything the master had, the copy counts as
caught up (``EpochHistory.caught_up``): only then may this broker campaign.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import grpc

from broker.cluster import lease_clock
from broker.cluster.epochs import EpochHistory, keyed, truncation_points
from broker.cluster.fetches import GrpcFetches, LeanFetches
from broker.cluster.link import ReplicationLink
from broker.cluster.replication import MAX_RESPONSE_BYTES
from broker.cluster.txnlog import apply_changes
from broker.proto import orderlymq_pb2 as pb
from broker.proto import orderlymq_pb2_grpc as pb_grpc
from broker.service import BrokerService
from broker.storage.record import HEADER, parse_header
from broker.wire.errors import NotMasterError, OrderlyMQError, from_rpc_error
from broker.wire.frames import WrongVersionError

__all__ = ["CampaignPromise", "ReplicaFetcher"]

log = logging.getLogger(__name__)

_RETRY_S = 0.2
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
_REFUSED_RETRY_S = 2.0
# The master answers an idle fetch within half a second (replication.FETCH_WAIT_S), and a full
# answer (MAX_RESPONSE_BYTES) in well under this on any link faster than 300 KB/s: a fetch left
# unanswered this long means a connection gone silent (a half-open TCP connection never breaks by
# itself), so the stream is dropped and dialed afresh.
_ANSWER_TIMEOUT_S = 15.0
_HEALTH_TIMEOUT_S = 2.0  # asking the master for its lean port
_LEAN_RETRY_S = 10.0  # replication that fell back to gRPC tries the lean port again after this long


class CampaignPromise:
    """This broker's promise not to campaign within ``length_s`` of receiving an answer from its
    master. It starts promised (the broker's previous process may have promised just before it
    ended) and is released early by the master's refusal."""

    def __init__(self, length_s: float) -> None:
        self.length_s = length_s
        self.until = lease_clock.now() + length_s

    def renew(self) -> None:
        self.until = max(self.until, lease_clock.now() + self.length_s)

    def release(self) -> None:
        self.until = lease_clock.now()

    @property
    def kept(self) -> bool:
        """True once the promise binds no more: this broker may campaign."""
        return lease_clock.now() >= self.until


class ReplicaFetcher(threading.Thread):
    """Copies the master at ``master_address`` of ``epoch`` until ``stop()``, dialing it over ``link``."""

    def __init__(self, service: BrokerService, history: EpochHistory, broker_id: int, master_address: str,
                 epoch: int, promise: CampaignPromise, link: ReplicationLink | None = None) -> None:
        super().__init__(name=f"orderlymq-replica-of-{master_address}", daemon=True)
        self.service = service
        self.history = history
        self.broker_id = broker_id
        self.master_address = master_address
        self.epoch = epoch
        self.promise = promise
        self.link = link or ReplicationLink()
        self._stopped = threading.Event()
        self._call: LeanFetches | GrpcFetches | None = None  # the fetches under way: cancel() ends them
        self._asked_at: float | None = None  # when the fetch now unanswered was sent
        self._offsets_version = 0
        self._txn_seq = 0
        # Where this copy of each queue ends, kept as answers are applied; and the ends that moved
        # since the last fetch, all a fetch lists once its master takes that (``_fetch``).
        self._known: dict[tuple[str, int], int] = {}
        self._moved: dict[tuple[str, int], int] = {}
        self._delta = False  # the master takes fetches of the moved ends only
        self._whole_next = True
        self.applied = threading.Event()  # set once a first answer was applied (tests, status)

    def stop(self) -> None:
        self._stopped.set()
        call = self._call
        if call is not None:
            call.cancel()
        self.join(timeout=10)

    def run(self) -> None:
        threading.Thread(target=self._watch_answers, name=f"{self.name}-watch", daemon=True).start()
        while not self._stopped.is_set():
            try:
                self._follow()
            except grpc.RpcError as err:
                if isinstance(from_rpc_error(err), NotMasterError):  # it stepped down: it serves this epoch no more
                    self.promise.release()
                if self._stopped.is_set():
                    pass
                elif err.code() in _REFUSED or "handshake" in (err.details() or "").lower():
                    # a setting to fix: said loudly, and retried in case it gets fixed
                    log.error("replication from %s refused: %s; check replication_tls_ca_file, "
                              "replication_access_key and replication_secret_file here, the master's certificate "
                              "and its ACL file", self.master_address, err.details())
                    self._stopped.wait(_REFUSED_RETRY_S)
                else:
                    log.info("replication from %s: %s; retrying", self.master_address, err.details() or err.code())
            except NotMasterError as exc:  # said on the lean port
                self.promise.release()
                log.info("replication from %s: %s; retrying", self.master_address, exc)
            except (OrderlyMQError, OSError) as exc:
                if not self._stopped.is_set():  # else stop() ended the lean connection
                    log.warning("replication from %s failed: %s; retrying", self.master_address, exc)
            except Exception:  # noqa: BLE001 - the fetcher must outlive any one bad answer
                log.exception("replication from %s failed; retrying", self.master_address)
            self._stopped.wait(_RETRY_S)

    def _watch_answers(self) -> None:
        """Drop a stream whose master has not answered within ``_ANSWER_TIMEOUT_S``."""
        while not self._stopped.wait(_ANSWER_TIMEOUT_S / 5):
            asked, call = self._asked_at, self._call
            if asked is not None and call is not None and time.monotonic() - asked > _ANSWER_TIMEOUT_S:
                log.warning("replication from %s: no answer for %.0f s; reconnecting", self.master_address,
                            time.monotonic() - asked)
                call.cancel()

    def _follow(self) -> None:
        with self.link.channel(self.master_address) as channel:
            fetches, lean_failed = self._open_fetches(channel)
            self._call = fetches
            # Over gRPC because the lean port failed: the stream ends after a while, to try it again.
            until = time.monotonic() + _LEAN_RETRY_S if lean_failed else float("inf")
            try:
                if self._stopped.is_set():
                    return
                handshake = pb.ReplicaFetch(broker_id=self.broker_id, group_epoch=self.epoch, handshake=True)
                greeting = self._exchange(fetches, handshake)
                self._truncate(json.loads(greeting.epoch_history))
                self._delta, self._whole_next = greeting.delta_fetches, True
                self._known_from_store()
                while not self._stopped.is_set() and time.monotonic() < until:
                    answer = self._exchange(fetches, self._fetch())
                    self._apply(answer)
                    if sum(len(r.frames) for r in answer.records) < MAX_RESPONSE_BYTES:
                        self.history.mark_caught_up()  # the answer was not cut short: it held all the master had
                    self.applied.set()
            finally:
                fetches.close()
                self._call = self._asked_at = None

    def _open_fetches(self, channel: grpc.Channel) -> tuple[LeanFetches | GrpcFetches, bool]:
        """Over the master's lean port where the link may (plaintext, no credentials) and the master
        serves one; else over gRPC: for the whole stream when the master's version does not take
        replication there, else, when the port fails, for a while (then True)."""
        port = self._lean_port(channel) if self.link.plain else 0
        if port:
            try:
                return LeanFetches(self.master_address.rpartition(":")[0], port), False
            except WrongVersionError as exc:  # asked again once this stream ends (the master restarted)
                log.info("replication from %s: %s; over gRPC", self.master_address, exc)
                return GrpcFetches(channel, self.link.metadata()), False
            except OSError as exc:
                log.info("replication from %s over its lean port %d failed (%s); over gRPC for %.0f s",
                         self.master_address, port, exc, _LEAN_RETRY_S)
                return GrpcFetches(channel, self.link.metadata()), True
        return GrpcFetches(channel, self.link.metadata()), False

    @staticmethod
    def _lean_port(channel: grpc.Channel) -> int:
        try:
            return pb_grpc.OrderlyMQStub(channel).Health(pb.HealthRequest(), timeout=_HEALTH_TIMEOUT_S).send_port
        except grpc.RpcError:
            return 0  # the stream's call says what is wrong

    def _exchange(self, fetches: LeanFetches | GrpcFetches, fetch: pb.ReplicaFetch) -> pb.ReplicaData:
        self._asked_at = time.monotonic()
        answer = fetches.exchange(fetch)
        self._asked_at = None
        self.promise.renew()  # before the next fetch tells the master it was received
        return answer

    def _truncate(self, master_history: list) -> None:
        """Cut what the master never had, then adopt its history (in that order: a crash in
        between cuts again, never keeps a tail)."""
        store = self.service.store
        for key, offset in truncation_points(self.history.epoch, keyed(store.ends()), master_history).items():
            topic, _, queue_id = key.rpartition("/")
            store.queue(topic, int(queue_id)).truncate(offset)
        self.history.follow(self.epoch, master_history)

    def _known_from_store(self) -> None:
        self._known, self._moved = self.service.store.ends(), {}

    def _fetch(self) -> pb.ReplicaFetch:
        """The next fetch: the ends that moved since the previous one when the master takes that,
        else (and first on a stream, and after the topics changed) every end."""
        delta = self._delta and not self._whole_next
        listed = self._moved if delta else self._known
        ends = [pb.QueuePosition(topic=topic, queue_id=queue_id, offset=end) for (topic, queue_id), end in listed.items()]
        self._moved, self._whole_next = {}, False
        return pb.ReplicaFetch(broker_id=self.broker_id, group_epoch=self.epoch, ends=ends, delta=delta,
                               offsets_version=self._offsets_version, txn_seq=self._txn_seq, topics_on_change=True)

    def _apply(self, answer: pb.ReplicaData) -> None:
        if not answer.topics_unchanged:  # left out while it is the same (a master of an earlier version always sends it)
            self._apply_topics(dict(answer.topics))
        store = self.service.store
        for records in answer.records:
            queue = store.queue(records.topic, records.queue_id)
            first = parse_header(records.frames[:HEADER.size])
            if first is not None and first.base_offset > queue.max_offset:  # behind the master's retention
                queue.restart_at(first.base_offset)
            ref = (records.topic, records.queue_id)
            self._known[ref] = self._moved[ref] = queue.append_frames(records.frames)
        if answer.offsets:
            self.service.offsets.replace([tuple(row) for row in json.loads(answer.offsets)])
            self._offsets_version = answer.offsets_version
        if answer.txn_table:
            self.service.reset_transactions()
        apply_changes(self.service.txns, answer.txn_changes)
        self._txn_seq = answer.txn_seq

    def _apply_topics(self, topics: dict[str, int]) -> None:
        """Create, grow and delete topics as the master's table says; then every end is listed
        again (a deleted topic's queues must leave what the master knows of this copy)."""
        store, service = self.service.store, self.service
        mine, changed = store.topics(), False
        for topic in mine.keys() - topics.keys():
            service.offsets.drop_topic(topic)
            service.locks.drop_topic(topic)
            store.delete_topic(topic)
            changed = True
        for topic, count in topics.items():
            if topic not in mine:
                store.create_topic(topic, count)
                changed = True
            elif count > mine[topic]:
                store.grow_topic(topic, count)
                changed = True
        if changed:
            self._known_from_store()
            self._whole_next = True
