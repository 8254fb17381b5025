"""BrokerConfig: defaults, TOML loading (including conf/broker.toml), overrides, validation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.wire.errors import InvalidOptionError, InvalidRequestError

ROOT = Path(__file__).resolve().parents[2]


def test_defaults():
    c = BrokerConfig()
    assert (c.host, c.port, c.data_dir, c.broker_name) == ("127.0.0.1", 9876, "data", "broker-a")
    assert (c.flush, c.flush_interval_ms) == ("async", 200)
    assert (c.segment_bytes, c.index_interval_bytes) == (64 * 1024 * 1024, 4096)
    assert (c.retention_ms, c.retention_bytes, c.retention_check_interval_ms) == (7 * 86_400_000, 0, 60_000)
    assert (c.lock_lease_ms, c.consumer_timeout_ms, c.txn_timeout_ms) == (60_000, 30_000, 60_000)
    assert (c.max_request_bytes, c.max_pull_messages, c.max_pull_bytes) == (128 * 1024 * 1024, 10_000, 16 * 1024 * 1024)
    assert (c.max_wait_ms, c.workers, c.log_level) == (30_000, 64, "INFO")
    assert c.data_path == Path("data")


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BrokerConfig().port = 1  # type: ignore[misc]


def test_shipped_conf_file_loads_and_equals_defaults():
    assert BrokerConfig.from_toml(ROOT / "conf" / "broker.toml") == BrokerConfig()


def test_shipped_conf_file_documents_every_setting():
    text = (ROOT / "conf" / "broker.toml").read_text()
    for name in BrokerConfig.field_names():
        assert f"\n{name} = " in text, name


def test_from_toml(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text('[broker]\nport = 0\nflush = "sync"\ndata_dir = "/var/lib/orderlymq"\nlog_level = "debug"\n')
    c = BrokerConfig.from_toml(path)
    assert (c.port, c.flush, c.data_dir, c.log_level) == (0, "sync", "/var/lib/orderlymq", "DEBUG")
    assert c.workers == 64


def test_from_toml_empty_file_is_defaults(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text("# nothing\n")
    assert BrokerConfig.from_toml(path) == BrokerConfig()


def test_from_toml_unknown_key_names_it_and_lists_valid(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text("[broker]\nlock_lease = 5\n")
    with pytest.raises(InvalidOptionError, match="unknown broker setting 'lock_lease'") as info:
        BrokerConfig.from_toml(path)
    assert "lock_lease_ms" in str(info.value) and str(path) in str(info.value)


def test_from_toml_top_level_key_outside_table(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text("port = 1\n[broker]\n")
    with pytest.raises(InvalidOptionError, match=r"unknown top-level key 'port'.*\[broker\]"):
        BrokerConfig.from_toml(path)


def test_from_toml_missing_file(tmp_path):
    with pytest.raises(InvalidOptionError, match="does not exist"):
        BrokerConfig.from_toml(tmp_path / "nope.toml")


def test_from_toml_syntax_error(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text("[broker]\nport = = 3\n")
    with pytest.raises(InvalidOptionError, match="not valid TOML"):
        BrokerConfig.from_toml(path)


def test_from_toml_bad_value_names_file_and_setting(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text('[broker]\nflush = "fast"\n')
    with pytest.raises(InvalidOptionError, match=r"flush must be 'sync' or 'async', got 'fast'") as info:
        BrokerConfig.from_toml(path)
    assert str(path) in str(info.value)


def test_from_mapping():
    assert BrokerConfig.from_mapping({"port": 1234}).port == 1234
    with pytest.raises(InvalidOptionError, match="unknown broker setting 'prot'"):
        BrokerConfig.from_mapping({"prot": 1234})


def test_with_overrides_ignores_none_and_validates():
    base = BrokerConfig()
    c = base.with_overrides(port=0, data_dir=None, flush="sync")
    assert (c.port, c.data_dir, c.flush) == (0, "data", "sync")
    assert base.port == 9876
    with pytest.raises(InvalidOptionError, match=r"workers must be an integer in 1\.\.1024 \(threads\), got 0"):
        base.with_overrides(workers=0)
    with pytest.raises(InvalidOptionError, match="unknown broker setting 'nope'"):
        base.with_overrides(nope=1)


def test_data_dir_accepts_path(tmp_path):
    assert BrokerConfig(data_dir=tmp_path).data_dir == str(tmp_path)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("flush", "fast", "flush must be 'sync' or 'async', got 'fast'"),
        ("port", 70_000, r"port must be an integer in 0\.\.65535, got 70000"),
        ("port", -1, "port must be an integer in 0..65535"),
        ("port", True, "port must be an integer in 0..65535, got True"),
        ("port", "9876", "port must be an integer in 0..65535, got '9876'"),
        ("flush_interval_ms", 0, r"flush_interval_ms must be an integer >= 1 \(milliseconds\), got 0"),
        ("segment_bytes", 0, "segment_bytes must be an integer in 1..2147483647"),
        ("segment_bytes", 2**31, "segment_bytes must be an integer in 1..2147483647"),
        ("index_interval_bytes", 0, "index_interval_bytes must be"),
        ("retention_ms", -1, "retention_ms must be an integer >= 0 .*0 keeps messages forever"),
        ("retention_bytes", -5, "retention_bytes must be an integer >= 0"),
        ("retention_check_interval_ms", 0, "retention_check_interval_ms must be"),
        ("lock_lease_ms", 0, "lock_lease_ms must be an integer >= 1"),
        ("consumer_timeout_ms", 0, "consumer_timeout_ms must be"),
        ("txn_timeout_ms", 1.5, "txn_timeout_ms must be an integer >= 1 .*got 1.5"),
        ("max_request_bytes", 0, "max_request_bytes must be"),
        ("max_pull_messages", 0, "max_pull_messages must be"),
        ("max_pull_bytes", 0, "max_pull_bytes must be"),
        ("max_wait_ms", -1, "max_wait_ms must be"),
        ("workers", 0, "workers must be"),
        ("busy_poll_us", -2, r"busy_poll_us must be an integer in -1\.\.1000000 \(microseconds, 0 never polls"),
        ("log_level", "LOUD", "log_level must be one of CRITICAL, ERROR, WARNING, INFO, DEBUG, got 'LOUD'"),
        ("host", "", "host must be a non-empty string"),
        ("data_dir", " ", "data_dir must be a non-empty string"),
        ("broker_name", "broker a", "broker_name must be 1-128 characters"),
        ("broker_name", "", "broker_name must be"),
    ],
)
def test_bad_values_name_the_setting(setting, value, message):
    with pytest.raises(InvalidOptionError, match=message):
        BrokerConfig(**{setting: value})


def test_error_is_a_value_error_and_request_error():
    with pytest.raises(ValueError):
        BrokerConfig(flush="fast")
    assert issubclass(InvalidOptionError, InvalidRequestError)


def test_zero_values_that_mean_unlimited_are_accepted():
    c = BrokerConfig(retention_ms=0, retention_bytes=0, max_wait_ms=0, port=0)
    assert (c.retention_ms, c.retention_bytes, c.max_wait_ms, c.port) == (0, 0, 0, 0)
