"""A write task's keep-alive of its transactions outlives a refresh that fails unexpectedly."""

from __future__ import annotations

from connector.spark.txn_keepalive import KeepAlive
from tests.support import wait_until


def test_refreshes_go_on_after_an_unexpected_failure(caplog):
    refreshed: list[int] = []

    def refresh() -> None:
        refreshed.append(len(refreshed))
        if len(refreshed) == 1:
            raise RuntimeError("an unexpected failure of a refresh")

    keepalive = KeepAlive(refresh, lambda: 40)  # a transaction timeout of 40 ms: a refresh every 10 ms
    keepalive.start()
    try:
        assert wait_until(lambda: len(refreshed) >= 3, timeout=30)
    finally:
        keepalive.stop()
    assert "failed unexpectedly; trying again" in caplog.text
