"""``Producer.send`` and the pipelined batches over the broker's send port: per-key order and
completeness (judged by ``connector.history`` on what the broker stored) when synchronous sends mix
with pipelined ones, and when the port goes away under them (a broker killed and restarted, a
frozen broker)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from broker.launcher import BrokerProcess
from broker.proto import orderlymq_pb2 as pb
from broker.wire.errors import OrderlyMQError
from broker.wire.one_message import encode_one
from broker.wire.tls import TlsOptions
from connector.client import Admin, Producer
from connector.client.busy_poll import BusyPoll
from connector.client.connection import BrokerConnection
from connector.client.send_port import SendPortClient
from connector.errors import SendOutcomeUnknownError
from connector.history import History
from tests.faults.workload import body, stored_deliveries
from tests.support import served_calls, wait_until


def _freeze(pid: int) -> None:
    """SIGSTOP, and wait until the process is stopped: a send is quick enough to beat the signal."""
    os.kill(pid, signal.SIGSTOP)
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
        time.sleep(0.001)


def _verdict(address: str, topic: str, history: History):
    with BrokerConnection(address) as conn:
        history.extend_deliveries(stored_deliveries(conn, topic))
    return history.check()


def test_sync_sends_on_the_port_keep_each_keys_order_beside_pipelined_and_batch_sends(broker, topic_name):
    Admin(broker.address).create_topic(topic_name, 4)
    history = History()
    keys = [f"k{i}" for i in range(8)]

    def work(key: str, producer: Producer) -> None:
        for seq in range(0, 120, 3):  # per key: a synchronous send, an asynchronous one, a batch of one
            producer.send(topic_name, body(key, seq), key=key)
            future = producer.send_async(topic_name, body(key, seq + 1), key=key)
            producer.send_batch(topic_name, [{"key": key, "body": body(key, seq + 2)}])
            future.result()
            for s in range(seq, seq + 3):
                history.sent(key, s, acked=True)

    with Producer(broker.address, linger_ms=1) as producer:
        threads = [threading.Thread(target=work, args=(key, producer)) for key in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert served_calls(broker, "SendPort") > 0, "synchronous sends to an idle queue take the send port"
    verdict = _verdict(broker.address, topic_name, history)
    assert verdict.ok and verdict.deliveries == 8 * 120, verdict


def test_threads_sending_on_shared_queues_take_the_port_in_turn(broker, topic_name):
    """Synchronous sends of threads whose keys share queues: a send finding another thread's send
    of its queue out on the port waits for it to end and takes the port next, rather than the
    stream; every key's messages stored once, in order."""
    Admin(broker.address).create_topic(topic_name, 2)
    history = History()
    threads, rounds = 6, 40

    def work(thread: int, producer: Producer) -> None:
        for seq in range(rounds):
            for key in (f"t{thread}-a", f"t{thread}-b", f"t{thread}-c"):
                producer.send(topic_name, body(key, seq), key=key)
                history.sent(key, seq, acked=True)

    with Producer(broker.address) as producer:
        workers = [threading.Thread(target=work, args=(i, producer)) for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    assert served_calls(broker, "SendPort") == threads * 3 * rounds, "every send went over the port"
    verdict = _verdict(broker.address, topic_name, history)
    assert verdict.ok and verdict.deliveries == threads * 3 * rounds, verdict


def test_a_send_waiting_for_its_queues_turn_ends_by_its_deadline(tmp_path, topic_name):
    """A frozen broker holds one thread's send on the port; another thread's send of the same queue
    waits its turn only until its deadline, then fails as a send over the stream would. Once the
    broker runs again, what either stored is there once, in order."""
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        Admin(proc.address).create_topic(topic_name, 1)
        history = History()
        failures: list[BaseException] = []

        def send(producer: Producer, key: str) -> None:
            try:
                producer.send(topic_name, body(key, 1), key=key)
                history.sent(key, 1, acked=True)
            except BaseException as exc:  # noqa: BLE001 - collected for the assertions
                failures.append(exc)
                history.sent(key, 1, acked=False)

        with Producer(proc.address, retry_timeout=2.0) as producer:
            for key in ("a", "b"):
                producer.send(topic_name, body(key, 0), key=key)
                history.sent(key, 0, acked=True)
            _freeze(proc.pid)
            try:
                first = threading.Thread(target=send, args=(producer, "a"))
                first.start()
                assert wait_until(lambda: any(p.direct for p in producer._senders[""]._partitions.values()),
                                  interval=0.001), "the first send went out on the port"
                second = threading.Thread(target=send, args=(producer, "b"))
                second.start()
                first.join(30)
                second.join(30)
                assert not first.is_alive() and not second.is_alive()
                assert len(failures) == 2 and all(isinstance(f, OrderlyMQError) for f in failures), failures
            finally:
                os.kill(proc.pid, signal.SIGCONT)
        verdict = _verdict(proc.address, topic_name, history)
        assert verdict.ok, verdict
    finally:
        proc.kill9()


def test_a_broker_without_the_port_gets_the_sends_over_grpc(broker_factory, topic_name):
    broker = broker_factory(send_port=-1)
    Admin(broker.address).create_topic(topic_name, 1)
    history = History()
    with Producer(broker.address) as producer:
        for seq in range(20):
            assert producer.send(topic_name, body("k", seq), key="k").queue_offset == seq
            history.sent("k", seq, acked=True)
    assert served_calls(broker, "SendPort") == 0
    verdict = _verdict(broker.address, topic_name, history)
    assert verdict.ok and verdict.deliveries == 20, verdict


def test_a_tls_client_never_uses_the_plaintext_port(broker):
    with BrokerConnection(broker.address, tls=TlsOptions()) as conn:
        assert not SendPortClient(conn).ready()


def test_sync_sends_go_on_over_grpc_and_back_when_the_broker_restarts(tmp_path, topic_name):
    """The restarted broker's send port is a new one: sends cut off are resent on the stream under
    their sequence (stored once), and later ones find the new port."""
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        Admin(proc.address).create_topic(topic_name, 2)
        history = History()
        with Producer(proc.address, retry_timeout=60) as producer:
            for seq in range(300):
                if seq == 100:
                    proc.kill9()
                    proc.start()
                producer.send(topic_name, body(f"k{seq % 3}", seq // 3), key=f"k{seq % 3}")
                history.sent(f"k{seq % 3}", seq // 3, acked=True)
        verdict = _verdict(proc.address, topic_name, history)
        assert verdict.ok and verdict.deliveries == 300, verdict
    finally:
        proc.kill9()


def test_sends_take_the_port_of_a_broker_restarted_between_them_at_once(broker_factory, topic_name):
    """The broker stops between two sends and comes back at the same address with another send
    port: the next send finds its idle link closed and looks the port up again, so no send goes
    over gRPC (before, the closed link failed it, and the port went unused for 5 s)."""
    from broker.config import BrokerConfig
    from broker.server import start_broker

    first = broker_factory()
    Admin(first.address).create_topic(topic_name, 1)
    history = History()
    with Producer(first.address) as producer:
        for seq in range(10):
            producer.send(topic_name, body("k", seq), key="k")
            history.sent("k", seq, acked=True)
        assert served_calls(first, "SendPort") == 10
        first.stop()
        second = start_broker(BrokerConfig(port=first.port, data_dir=first.config.data_dir))
        try:
            for seq in range(10, 20):
                producer.send(topic_name, body("k", seq), key="k")
                history.sent("k", seq, acked=True)
            assert second.send_port.port != first.send_port.port
            assert (served_calls(second, "SendPort"), served_calls(second, "Send")) == (10, 0)
            verdict = _verdict(second.address, topic_name, history)
            assert verdict.ok and verdict.deliveries == 20, verdict
        finally:
            second.stop()


def test_a_sync_send_cut_off_by_a_freeze_is_unknown_then_settled_once(tmp_path, topic_name):
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        Admin(proc.address).create_topic(topic_name, 1)
        history = History()
        with Producer(proc.address, retry_timeout=2.0) as producer:
            producer.send(topic_name, body("k", 0), key="k")
            history.sent("k", 0, acked=True)
            _freeze(proc.pid)
            try:
                with pytest.raises(SendOutcomeUnknownError) as unknown:
                    producer.send(topic_name, body("k", 1), key="k")
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            (settled,) = producer.resolve(unknown.value, timeout=60)
            history.sent("k", 1, acked=True)
            assert settled.queue_offset == 1
            assert producer.send(topic_name, body("k", 2), key="k").queue_offset == 2
            history.sent("k", 2, acked=True)
        verdict = _verdict(proc.address, topic_name, history)
        assert verdict.ok and verdict.deliveries == 3, verdict
    finally:
        proc.kill9()


@pytest.mark.parametrize(("timeout", "busy_poll_us"), [(0.3, 0), (1.5, 0), (0.3, 500)])
def test_a_round_trip_to_a_frozen_broker_ends_at_its_timeout(tmp_path, topic_name, timeout, busy_poll_us):
    """The link's waits are the kernel's (a blocking socket with SO_RCVTIMEO): an answer that does
    not come ends the round trip with a TimeoutError, not a hang, whether under a second or over,
    and whether the link first polls for the answer or not."""
    from connector.client.send_port import _Link

    proc = BrokerProcess(tmp_path / "data").start()
    try:
        Admin(proc.address).create_topic(topic_name, 1)
        with BrokerConnection(proc.address) as conn:
            host, port = SendPortClient(conn).address()
        link = _Link(host, port, 10.0, BusyPoll(busy_poll_us))
        request = pb.SendRequest(topic=topic_name, queue_id=0, batch=encode_one({"key": "k", "body": body("k", 0)}))
        assert pb.SendResponse.FromString(link.round_trip([request.SerializeToString()], 10.0)).base_offset == 0
        _freeze(proc.pid)
        try:
            with pytest.raises(TimeoutError, match=f"did not take or answer the request within {timeout:.3g} s"):
                link.round_trip([request.SerializeToString()], timeout)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        link.close()
    finally:
        proc.kill9()


def _send_keyed_batches(producer: Producer, topic: str, history: History, keys: list[str], rounds: int,
                        first: int = 0) -> None:
    """``rounds`` batches of one message per key, each key's sequence numbers in order from ``first``."""
    for seq in range(first, first + rounds):
        results = producer.send_batch(topic, [{"key": key, "body": body(key, seq)} for key in keys])
        assert len(results) == len(keys)
        for key in keys:
            history.sent(key, seq, acked=True)


def test_pipelined_batches_take_the_port_and_keep_each_keys_order(broker, topic_name):
    Admin(broker.address).create_topic(topic_name, 4)
    history, keys = History(), [f"k{i}" for i in range(50)]
    with Producer(broker.address, linger_ms=1) as producer:
        futures = [producer.send_async(topic_name, body("a", seq), key="a") for seq in range(500)]
        for seq, future in enumerate(futures):
            assert future.result().queue_offset >= 0
            history.sent("a", seq, acked=True)
        _send_keyed_batches(producer, topic_name, history, keys, 40)
    assert served_calls(broker, "SendPort") > 40, "batches go over the send port"
    assert served_calls(broker, "SendStream") == 0, "no batch went over a gRPC stream"
    verdict = _verdict(broker.address, topic_name, history)
    assert verdict.ok and verdict.deliveries == 500 + 50 * 40, verdict


def test_pipelined_batches_cut_off_by_a_restart_are_stored_once_in_order(tmp_path, topic_name):
    """The port stream breaks with the broker while batches are on it: what it had not answered is
    resent under the same sequences (over gRPC until the new port is learned), stored once, in order."""
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        Admin(proc.address).create_topic(topic_name, 4)
        history, keys = History(), [f"k{i}" for i in range(20)]
        with Producer(proc.address, retry_timeout=60, linger_ms=1) as producer:
            futures = [(key, seq, producer.send_async(topic_name, body(key, seq), key=key))
                       for seq in range(300) for key in keys]
            while sum(future.done() for _key, _seq, future in futures) < 1000:
                time.sleep(0.001)
            proc.kill9()  # batches are on the stream: some stored and not answered, some never read
            proc.start()
            for key, seq, future in futures:
                assert future.result(timeout=60).queue_offset >= 0
                history.sent(key, seq, acked=True)
            _send_keyed_batches(producer, topic_name, history, keys, 1, first=300)  # and on after the restart
        verdict = _verdict(proc.address, topic_name, history)
        assert verdict.ok and verdict.deliveries == 20 * 301, verdict
    finally:
        proc.kill9()


def test_sync_sends_read_their_answers_while_polling_and_keep_each_keys_order(tmp_path, topic_name):
    """Against a broker process, answers are read while the sender polls for them (a limit long
    enough that none is missed but on a stalled machine; the machine taken to have a CPU to spare,
    whatever else runs beside the test), and what each key sent is stored complete and in order;
    a producer that never polls sends the same way."""
    history = History()
    with BrokerProcess(tmp_path / "data") as proc:
        Admin(proc.address).create_topic(topic_name, 4)
        for busy_poll_us, first in ((200_000, 0), (0, 100)):
            with Producer(proc.address, busy_poll_us=busy_poll_us) as producer:
                if busy_poll_us:  # before the first send makes the port's first connection
                    producer._senders[""]._send_port._poll = BusyPoll(busy_poll_us, cpu_to_spare=lambda: True)
                for seq in range(first, first + 100):
                    for key in ("a", "b", "c"):
                        producer.send(topic_name, body(key, seq), key=key)
                        history.sent(key, seq, acked=True)
                poll = producer._senders[""]._send_port._poll
                if busy_poll_us:
                    assert poll.polls == 300 and poll.answered > 250, (poll.polls, poll.answered)
                else:
                    assert poll.polls == 0
        verdict = _verdict(proc.address, topic_name, history)
    assert verdict.ok and verdict.deliveries == 3 * 200, verdict


def test_polls_that_keep_missing_give_way_to_a_probe_now_and_then():
    """No answer within the limit: the caller sleeps in ``recv`` instead. After four such misses in a
    row only one round trip in sixteen polls, and one that reads an answer makes polling usual again."""
    import socket

    poll = BusyPoll(1000, cpu_to_spare=lambda: True)
    left, right = socket.socketpair()
    with left, right:
        buffer = bytearray(64)
        assert [poll.read(left, buffer) for _ in range(4)] == [0] * 4 and poll.polls == 4
        assert [poll.read(left, buffer) for _ in range(32)] == [0] * 32
        assert poll.polls == 4 + 2, "a probe in every 16 round trips once polls keep missing"
        right.sendall(b"answer")
        while poll.read(left, buffer) == 0:  # the next probe reads it
            pass
        assert bytes(buffer[:6]) == b"answer" and poll.answered == 1
        polls = poll.polls
        poll.read(left, buffer)
        assert poll.polls == polls + 1, "an answer read while polling: polling is usual again"
        right.close()
        with pytest.raises(ConnectionError, match="closed"):
            poll.read(left, buffer)
    assert BusyPoll(1000, cpu_to_spare=lambda: False).read(None, bytearray(8)) == 0, "no CPU to spare: no poll"


_FORK_DURING_A_SEND = """
import os
from connector.client.busy_poll import SENDING
with SENDING:
    pid = os.fork()
    if pid == 0:
        os._exit(0 if SENDING.count == 0 else 3)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status) or (4 if SENDING.count else 0))
"""


def test_a_child_forked_during_a_send_counts_none_of_its_parents_sends():
    """Else a lone send of the child would never poll (the count of sends under way is what lets it).
    Forked from a fresh interpreter: a test process holds gRPC threads of earlier tests, and a fork
    among them may abort in gRPC's own fork handler, which is not what this checks."""
    done = subprocess.run([sys.executable, "-c", _FORK_DURING_A_SEND], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"3: the child counted its parent's send; 4: the parent lost count\n{done.stderr}"


def test_a_negative_busy_poll_is_refused_by_name():
    with pytest.raises(ValueError, match="busy_poll_us must be 0"):
        Producer("127.0.0.1:1", busy_poll_us=-1)


def test_write_parts_sends_more_parts_than_one_sendmsg_takes():
    """A batch of many Arrow buffers (a table of many chunks) leaves whole and in order."""
    import socket

    from connector.client.lean_port import write_parts

    parts = [bytes([i % 256]) * (1 + i % 5) for i in range(os.sysconf("SC_IOV_MAX") * 3 + 7)]
    left, right = socket.socketpair()
    with left, right:
        reader = threading.Thread(target=lambda: received.append(_read_all(right, sum(map(len, parts)))))
        received: list[bytes] = []
        reader.start()
        write_parts(left, parts)
        reader.join(10)
    assert received == [b"".join(parts)]


def _read_all(sock, size: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(size - got)
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def test_a_stream_reads_answers_however_they_arrive():
    """``PortStream`` reads answers in bursts: several in one read, one cut across reads, and one
    longer than its read buffer all come out whole and in order, and the stream ends cleanly when
    the broker closes after the last. The peer is a plain socket speaking the port's frames."""
    import socket

    from broker.wire.frames import HELLO_SIZE, LENGTH, SENDS, VERSION, hello
    from connector.client.send_port import PortStream

    answers = [pb.SendResponse(base_offset=i, count=1) for i in range(5)]
    answers.insert(2, pb.SendResponse(error_code=3, error_kind="BadBatchError", error_message="x" * 200_000))
    frames = [LENGTH.pack(len(a.SerializeToString())) + a.SerializeToString() for a in answers]
    wire = b"".join(frames)
    cuts = [0, len(frames[0]) + 3, len(frames[0]) + len(frames[1]) + 70_000, len(wire) - 5, len(wire)]
    listener = socket.create_server(("127.0.0.1", 0))

    def broker() -> None:
        conn, _ = listener.accept()
        with conn:
            _read_all(conn, HELLO_SIZE)
            conn.sendall(hello(VERSION, SENDS))
            for start, end in itertools.pairwise(cuts):
                time.sleep(0.05)  # each piece its own read
                conn.sendall(wire[start:end])

    thread = threading.Thread(target=broker)
    thread.start()
    with listener:
        stream = PortStream(None, "127.0.0.1", listener.getsockname()[1], connect_timeout=5)
        stream.start(iter([]))
        got = list(stream)
        thread.join(10)
    assert got == answers
