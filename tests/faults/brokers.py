"""Broker subprocesses with chosen settings, written to a broker.toml next to the data dir."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from broker.config import BrokerConfig
from broker.launcher import BrokerProcess

__all__ = ["broker_process", "open_file_limit"]


def open_file_limit(files: int) -> list[str]:
    """A ``wrapper`` that runs the broker with at most ``files`` open files (util-linux's ``prlimit``)."""
    return ["prlimit", f"--nofile={files}:{files}"]


def _toml_value(value) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def broker_process(data_dir: Path, *, env: dict[str, str] | None = None, wrapper: Sequence[str] = (),
                   **settings) -> BrokerProcess:
    """A (not yet started) ``BrokerProcess`` on ``data_dir`` with ``settings`` (``BrokerConfig`` names),
    ``env`` added to its environment, run under ``wrapper`` (a command such as ``prlimit``).

    The settings are checked here, so a typo fails before any process starts.
    """
    BrokerConfig.from_mapping(settings)
    config = data_dir.parent / f"{data_dir.name}.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    lines = ["[broker]"] + [f"{name} = {_toml_value(value)}" for name, value in sorted(settings.items())]
    config.write_text("\n".join(lines) + "\n")
    return BrokerProcess(data_dir, "--config", str(config), env=env, wrapper=wrapper)
