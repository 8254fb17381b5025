"""Clients of the first release beside this version's, on this broker: what a rolling upgrade of an
application's instances goes through (brokers are upgraded first). An orderly consumer group holds an
instance of the first release (``tests.support.FIRST_RELEASE``, run from this repository's
history) and then one of this version; queues move to the new instance when it joins and when the
older one is stopped, while producers of both versions send. Every key's messages must be consumed
in order and none lost. The queues the older instance hands over mid-stream are consumed once; an
instance stopped without notice may leave what it consumed uncommitted (at least once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from connector.client import Admin, Producer
from tests.support import FIRST_RELEASE, older_code, wait_until

from .helpers import send_keyed
from .test_orderly_consumer import appending_listener, parse_consumed, start_consumer

OLDER_TREE = ("broker", "connector", "tests/__init__.py", "tests/client/__init__.py", "tests/client/helpers.py",
              "tests/client/orderly_worker.py")
OLDER_SENDER = """
import json, sys
from connector.client import Producer
from tests.client.helpers import send_keyed
address, topic, keys, per_key, start = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), \
    json.loads(sys.argv[5])
with Producer(address) as producer:
    print(json.dumps(send_keyed(producer, topic, keys, per_key, start)))
"""


def older_send(older: Path, address: str, topic: str, keys: list[str], per_key: int, start: dict) -> dict:
    """``send_keyed`` by the first release's producer, in a process of its own."""
    done = subprocess.run([sys.executable, "-c", OLDER_SENDER, address, topic, json.dumps(keys), str(per_key),
                           json.dumps(start)], env={**os.environ, "PYTHONPATH": str(older)}, cwd=older,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_an_orderly_group_upgraded_instance_by_instance(fast_broker, topic_name, tmp_path, record_property):
    address = fast_broker.address
    older = older_code(tmp_path, FIRST_RELEASE, *OLDER_TREE)
    out = tmp_path / "consumed.txt"
    out.touch()
    keys = [f"k{i}" for i in range(16)]
    with Admin(address) as admin, Producer(address) as producer:
        admin.create_topic(topic_name, 4)
        instance = subprocess.Popen([sys.executable, str(older / "tests" / "client" / "orderly_worker.py"), address,
                                     topic_name, "g", "older", str(out)],
                                    env={**os.environ, "PYTHONPATH": str(older)}, stdout=subprocess.PIPE, text=True)
        try:
            assert instance.stdout.readline().strip() == "started"
            seqs = send_keyed(producer, topic_name, keys, 15)
            # A backlog of a second or two for the older instance: its queues change hands mid-stream.
            seqs = older_send(older, address, topic_name, keys, 60, seqs)
            current = start_consumer(address, topic_name, "g", appending_listener(out, "current"), "current")
            try:
                holders = lambda: sorted(h.client_id for h in admin.lock_holders("g", topic_name))  # noqa: E731
                assert wait_until(lambda: holders() == ["current"] * 2 + ["older"] * 2)
                seqs = send_keyed(producer, topic_name, keys, 15, seqs)
                seqs = older_send(older, address, topic_name, keys, 15, seqs)
                assert wait_until(lambda: parse_consumed(out).has_all(seqs), timeout=60)
                assert parse_consumed(out).check(seqs) == 0  # handed over between versions: nothing consumed twice
                instance.send_signal(signal.SIGTERM)  # stopped as a deployment stops it: no unlock, no goodbye
                instance.wait()
                seqs = send_keyed(producer, topic_name, keys, 15, seqs)
                assert wait_until(lambda: parse_consumed(out).has_all(seqs), timeout=60)
                assert wait_until(lambda: holders() == ["current"] * 4)
                log = parse_consumed(out)
                record_property("duplicates", log.check(seqs))
                assert {client for client, *_ in log.entries} == {"older", "current"}
            finally:
                current.shutdown()
        finally:
            instance.kill()
            instance.wait()
