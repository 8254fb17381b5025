"""A process that uses a client and then starts programs (fork and exec), as a notebook that sent
messages before it started Spark does: PySpark starts its JVM with ``subprocess.Popen`` and a
``preexec_fn``, so the child runs Python, closes the inherited descriptors, then execs. Under
gRPC's epoll poller such a child aborted at times before its exec (``connector/__init__.py``).
A child forked without an exec still makes a client of its own and sends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from connector.client import Admin
from connector.client.connection import BrokerConnection
from connector.history import check_keyed
from tests.support import stored_keyed

ROOT = Path(__file__).resolve().parents[2]
QUEUES, KEYS = 4, 8

# The user's process: imports the client first, sends keyed messages from a thread, and starts
# ``starts`` programs the way PySpark starts its JVM; then forks a child that sends ``KEYS``
# messages of key "forked". Prints the exit codes of the programs that did not run, and what was sent.
USER_PROCESS = textwrap.dedent("""
    import json, os, signal, subprocess, sys, threading, time
    from connector.client import Producer
    from tests.support import send_keyed_rounds

    address, topic, starts, KEYS = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sent, done = {}, threading.Event()
    with Producer(address) as producer:
        def send():
            while not done.is_set():
                send_keyed_rounds(lambda key, body: producer.send(topic, body, key=key), sent, 1, KEYS)
        sender = threading.Thread(target=send)
        sender.start()
        failed = []
        for _ in range(starts):
            child = subprocess.Popen(["/bin/true"], preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            if child.wait() != 0:
                failed.append(child.returncode)
        done.set()
        sender.join()
        child = os.fork()
        if child == 0:
            try:
                with Producer(address) as own:
                    for seq in range(KEYS):
                        own.send(topic, f"forked:{seq}", key="forked")
                os._exit(0)
            finally:  # never runs on into the parent's code
                os._exit(1)
        deadline = time.monotonic() + 60
        while (ended := os.waitpid(child, os.WNOHANG)) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(child, signal.SIGKILL)
                sys.exit("the forked child hung")
            time.sleep(0.05)
        if os.waitstatus_to_exitcode(ended[1]) != 0:
            sys.exit("the forked child failed")
        sent["forked"] = KEYS
    print(json.dumps({"failed": failed, "sent": sent}))
""")


def test_a_process_using_a_client_starts_programs_and_keeps_sending(broker, topic_name):
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, QUEUES)
    env = {name: value for name, value in os.environ.items() if not name.startswith("GRPC_")}
    user = subprocess.run([sys.executable, "-c", USER_PROCESS, broker.address, topic_name, "600", str(KEYS)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert user.returncode == 0, user.stderr[-3000:]
    outcome = json.loads(user.stdout.splitlines()[-1])
    assert outcome["failed"] == [], f"started programs that died before their exec: {outcome['failed']}"
    with BrokerConnection(broker.address) as conn:
        verdict = check_keyed(outcome["sent"], stored_keyed(conn, topic_name, QUEUES))
    assert sum(outcome["sent"].values()) > 0 and verdict.ok and verdict.duplicated == 0, str(verdict)
