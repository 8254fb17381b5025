"""Test helpers shared by the suites: raw RPC helpers (the broker subprocess is broker.launcher)."""

from __future__ import annotations

import io
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from broker.launcher import BrokerProcess
from broker.wire import codec
from connector.client.connection import BrokerConnection, pb

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
# The last broker before staged sends were numbered in their transaction (BeginTxnResponse.numbers_sends).
BROKER_BEFORE_NUMBERED_STAGING = "ca05a6aa9143a5c966fa0d476ead4bc93edbc989"
# The first release: a data dir its broker wrote must open in every later broker, and its clients and
# Spark queries must go on beside and under later ones.
FIRST_RELEASE = "7277497d261576d837318b2e66a0d278c804d010"


def arrow_batch(rows: list[dict]) -> pa.Table:
    """Message dicts as a table built by pyarrow's own conversions (``pa.array`` of each column):
    the reference the encoders that lay out Arrow bytes by hand are checked against."""
    def text(value):
        return bytes(value).decode() if isinstance(value, bytes | bytearray | memoryview) else value

    born = [row.get("born_timestamp") for row in rows]
    return pa.Table.from_arrays([
        pa.array([None if row.get("key") is None else str(text(row["key"])) for row in rows], pa.string()),
        pa.array([row.get("tag") for row in rows], pa.string()),
        pa.array([row["body"].encode() if isinstance(row["body"], str) else bytes(row["body"]) for row in rows],
                 pa.binary()),
        pa.array([None if row.get("properties") is None else [(str(k), str(v)) for k, v in row["properties"].items()]
                  for row in rows], codec.PROPERTIES_TYPE),
        pa.array([codec.now_ms() if stamp is None else stamp for stamp in born], pa.int64()).cast(codec.TIMESTAMP_MS),
    ], schema=codec.MESSAGE_SCHEMA)


def older_code(directory: Path, revision: str, *paths: str) -> Path:
    """Where ``paths`` (files or directories) of this repository at ``revision`` were extracted,
    under ``directory``: a tree that runs as that revision did."""
    code = directory / f"code-{revision[:12]}"
    git = ["git", "-C", str(ROOT)]
    if subprocess.run([*git, "cat-file", "-e", f"{revision}^{{commit}}"], capture_output=True).returncode:
        subprocess.run([*git, "fetch", "--quiet", "--unshallow"], capture_output=True)  # a shallow clone
    archived = subprocess.run([*git, "archive", revision, *paths], capture_output=True, check=False)
    if archived.returncode:
        raise RuntimeError(f"cannot read {', '.join(paths)} of revision {revision} from {ROOT}'s history "
                           f"(a clone without --depth has it): {archived.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archived.stdout)) as archive:
        archive.extractall(code, filter="data")
    return code


def older_broker(directory: Path, revision: str) -> BrokerProcess:
    """A broker process (not started) running ``broker/`` as it was at ``revision`` of this
    repository, with its data in ``directory``: the older broker of a connector upgraded first."""
    broker = BrokerProcess(directory / "data", log_path=directory / "broker.log")
    broker.code_dir = older_code(directory, revision, "broker")
    return broker


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns a true value or ``timeout`` passes; returns its last
    value, so ``assert wait_until(...)`` fails only if it never held (a liveness wait, not a timing
    assertion) and a caller may still use the value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


class FakeClock:
    """An injectable millisecond clock that moves only when a test sets ``now``."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def send_rows(conn: BrokerConnection, topic: str, queue_id: int, rows: list[dict], **fields) -> pb.SendResponse:
    """Send message dicts as one batch with a raw Send RPC."""
    batch = codec.encode(codec.messages_to_batch(rows))
    return conn.call("Send", pb.SendRequest(topic=topic, queue_id=queue_id, batch=batch, **fields))


def send_keyed_rounds(send: Callable[[str, str], object], sent: dict[str, int], rounds: int, keys: int) -> None:
    """``rounds`` more messages of each of the keys ``k0`` .. ``k<keys - 1>``, bodies ``"<key>:<seq>"``
    (what ``stored_keyed`` reads): ``send(key, body)`` each, counted in ``sent`` once it returned."""
    for _ in range(rounds):
        for k in range(keys):
            key = f"k{k}"
            seq = sent.get(key, 0)
            send(key, f"{key}:{seq}")
            sent[key] = seq + 1


def stored_keyed(conn: BrokerConnection, topic: str, queues: int) -> list[tuple[str, int]]:
    """``(key, seq)`` of every message of ``topic`` whose body is ``"<key>:<seq>"``, queue by queue
    in queue order (what ``connector.history.check_keyed`` judges)."""
    bodies = [raw.decode() for q in range(queues) for raw in pull_all(conn, topic, q).column("body").to_pylist()]
    return [(key, int(seq)) for key, seq in (body.rsplit(":", 1) for body in bodies)]


def pull_all(conn: BrokerConnection, topic: str, queue_id: int, offset: int = 0, **fields):
    """Every message of a queue from ``offset`` as a pyarrow Table (raw Pull RPCs)."""
    tables = []
    while True:
        resp = conn.call("Pull", pb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, **fields))
        if resp.batches:
            tables.append(codec.decode_many(resp.batches))
        offset = resp.next_offset
        if offset >= resp.max_offset:
            return pa.concat_tables(tables) if tables else codec.empty_stored_table()


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of one scrape of ``/metrics``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def served_calls(broker, method: str) -> float:
    """How many ``method`` calls an in-process broker (``broker_factory``) answered."""
    return broker.service.metrics.registry.get_sample_value(
        "orderlymq_rpc_duration_seconds_count", {"method": method}) or 0


def port_calls(metrics_port: int, method: str) -> float:
    """How many ``method`` calls (``SendPort``, ``PullPort``: the lean port's) a broker answered."""
    return value(scrape(metrics_port), "orderlymq_rpc_duration_seconds_count", method=method)


def resident_bytes(paths: Iterable[Path]) -> int:
    """Bytes of ``paths`` in the OS page cache (util-linux's ``fincore``)."""
    names = [str(path) for path in paths]
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *names],
                         check=True, capture_output=True, text=True).stdout
    return sum(int(line) for line in out.split())
