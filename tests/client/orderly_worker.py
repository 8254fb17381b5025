"""An orderly consumer in its own process, for tests that kill it with SIGKILL.

Usage: python orderly_worker.py ADDRESS TOPIC GROUP CLIENT_ID OUT_FILE
Appends ``client key seq queue offset`` per consumed message to OUT_FILE (flushed per message).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from connector.client import ConsumeOrderlyStatus, OrderlyConsumer  # noqa: E402
from tests.client.helpers import FAST  # noqa: E402


def main() -> None:
    address, topic, group, client_id, out = sys.argv[1:6]
    lock = threading.Lock()
    with open(out, "a", buffering=1) as sink:

        def listener(messages, context):
            with lock:
                for m in messages:
                    sink.write(f"{client_id} {m.key} {int(m.body)} {m.queue_id} {m.queue_offset}\n")
            time.sleep(0.002)
            return ConsumeOrderlyStatus.SUCCESS

        consumer = OrderlyConsumer(address, group, listener, client_id=client_id, **FAST)
        consumer.subscribe(topic)
        consumer.start()
        print("started", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
