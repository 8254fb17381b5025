"""``ScratchBroker``: a benchmark's broker whose data directory is removed once it stops.

A full ``make bench`` writes tens of gigabytes: kept until the run ends, its brokers' data filled
the 78 GB a machine had free before the Spark suite finished. Each benchmark's data is used by that
benchmark only, so it goes as soon as its broker stops (its log, beside it, stays).
"""

from __future__ import annotations

import shutil

from broker.launcher import BrokerProcess

__all__ = ["ScratchBroker"]


class ScratchBroker(BrokerProcess):
    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            shutil.rmtree(self.data_dir, ignore_errors=True)
