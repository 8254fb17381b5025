"""``orderlymq console`` as a user starts it: it prints its address, serves the broker's state, and
a port it cannot take is a one-line error."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request

from connector.cli import main
from tests.support import wait_until


def test_console_command_serves_the_state_of_the_broker(broker, topic_name):
    from connector.client import Admin

    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, 3)
    process = subprocess.Popen(
        [sys.executable, "-m", "connector.cli", "--brokers", broker.address, "console", "--port", "0"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        banner = process.stdout.readline()
        url = banner.split(" at ", 1)[1].split(" ", 1)[0]
        assert "read-only" in banner
        snapshot = wait_until(lambda: json.loads(urllib.request.urlopen(url + "api/state", timeout=10).read())["snapshot"])
        assert [(t["name"], len(t["queues"])) for t in snapshot["topics"]] == [(topic_name, 3)]
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_port_in_use_is_a_one_line_error(broker, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--brokers", broker.address, "console", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"orderlymq: error: cannot listen on 127.0.0.1:{port}") and err.count("\n") == 1
