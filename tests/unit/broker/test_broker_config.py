"""Broker settings for groups, offsets and the cleaner: defaults and validation."""

from __future__ import annotations

import pytest

from mq.broker.config import BrokerConfig, ConfigError
from mq.broker.group_coordinator import GroupCoordinator


def test_group_and_offsets_defaults_follow_kafka():
    cfg = BrokerConfig.from_mapping({})
    assert cfg.offsets_retention_minutes == 7 * 24 * 60
    assert cfg.group_session_timeout_ms == 45_000
    assert cfg.group_heartbeat_interval_ms == 5_000
    assert cfg.group_assignor == "sticky"
    assert cfg.cleaner_backoff_ms == 15_000


def test_the_coordinator_and_the_config_share_their_defaults():
    cfg, coordinator = BrokerConfig.from_mapping({}), GroupCoordinator()
    assert (coordinator.heartbeat_interval_ms, coordinator.session_timeout_ms,
            coordinator.min_session_timeout_ms, coordinator.max_session_timeout_ms) == \
        (cfg.group_heartbeat_interval_ms, cfg.group_session_timeout_ms,
         cfg.group_min_session_timeout_ms, cfg.group_max_session_timeout_ms) == \
        (5_000, 45_000, 45, 1_800_000)
    assert coordinator.default_assignor == cfg.group_assignor


def test_assignor_aliases_are_canonical():
    assert BrokerConfig.from_mapping({"group_assignor": "round-robin"}).group_assignor == \
        "roundrobin"
    assert BrokerConfig.from_mapping({"group_assignor": "uniform"}).group_assignor == "sticky"


def test_fractional_offsets_retention():
    assert BrokerConfig.from_mapping({"offsets_retention_minutes": 0.5}) \
        .offsets_retention_minutes == 0.5


@pytest.mark.parametrize("key,value", [
    ("group_assignor", "fastest"),
    ("offsets_retention_minutes", 0),
    ("offsets_retention_minutes", "7"),
    ("group_session_timeout_ms", -1),
    ("cleaner_backoff_ms", True),
    ("group_min_session_timeout_ms", 1.5),
])
def test_bad_values_name_the_key(key, value):
    with pytest.raises(ConfigError, match=key.split("_")[0]):
        BrokerConfig.from_mapping({key: value})


def test_storage_safety_defaults_and_values():
    cfg = BrokerConfig.from_mapping({})
    assert cfg.min_free_bytes == 64 * 1024 * 1024 and cfg.file_mode == 0o640
    cfg = BrokerConfig.from_mapping({"min_free_bytes": 0, "file_mode": "0600"})
    assert cfg.min_free_bytes == 0 and cfg.file_mode == 0o600


@pytest.mark.parametrize("key,value", [
    ("min_free_bytes", -1), ("min_free_bytes", "1G"), ("file_mode", "0440"),
    ("file_mode", "rw"), ("file_mode", "01777"), ("socket_mode", "0060"),
])
def test_bad_storage_values_name_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        BrokerConfig.from_mapping({key: value})


# --- every key's type and range, and where a bad value came from -------------------------------

@pytest.mark.parametrize("key,value,message", [
    ("state_slots", 100_000_000_000, "state_slots must be an integer from 1 to 1048576 (64 MiB "
                                     "of shared memory at 64 bytes a slot), got 100000000000"),
    ("state_slots", 1e11, "got 100000000000.0"),
    ("state_slots", "4096", "got '4096'"),
    ("state_slots", 0, "from 1 to 1048576"),
    ("max_request_bytes", 1 << 31, "max_request_bytes must be an integer from 1 to 2147483647 "
                                   "(a frame's 31-bit length)"),
    ("cleaner_backoff_ms", 1 << 62, "from 1 to 2147483647 (epoll's int32 milliseconds"),
    ("flush_interval_ms", 1 << 31, "flush_interval_ms must be an integer from 1 to 2147483647"),
    ("spin_us", 2_000_000, "spin_us must be an integer from 0 to 1000000 (one second: a spin "
                           "is bounded)"),
    ("spin_us", -1, "from 0 to 1000000"),
    ("group_session_timeout_ms", 1 << 31, "from 1 to 2147483647 (Kafka's int32)"),
    ("transaction_max_timeout_ms", 1 << 40, "(Kafka's int32)"),
    ("min_free_bytes", 1 << 63, "min_free_bytes must be an integer from 0 to "
                                "9223372036854775807"),
    ("offsets_retention_minutes", float("nan"), "offsets_retention_minutes must be a number "
                                                "above 0 and at most 2147483647"),
    ("offsets_retention_minutes", float("inf"), "got inf"),
    ("socket_mode", 432.0, "socket_mode must be octal"),
    ("file_mode", True, "file_mode must be octal"),
    ("socket", 5, "socket must be a string, got 5"),
    ("log_level", 10, "log_level must be a string"),
    ("metrics_address", 9400, "metrics_address must be a string"),
    ("socket", "/" + "s" * 120, "is 121 bytes, more than the 107 a Unix socket path can have"),
    ("topic_defaults", {"segment.bytes": 1 << 40}, "topic_defaults: segment.bytes must be at "
                                                   "most 2147483647"),
    ("topic_defaults", {"retention.ms": 10 ** 30}, "topic_defaults: retention.ms must be at "
                                                   "most 9223372036854775807"),
])
def test_every_key_is_type_and_range_checked(key, value, message):
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_mapping({key: value})
    assert message in str(info.value)


def test_the_tops_of_the_ranges_are_accepted():
    cfg = BrokerConfig.from_mapping({"state_slots": 1 << 20, "max_request_bytes": (1 << 31) - 1,
                                     "min_free_bytes": (1 << 63) - 1, "socket_mode": "0600"})
    assert (cfg.state_slots, cfg.max_request_bytes) == (1 << 20, (1 << 31) - 1)


def test_the_default_session_timeout_lies_within_its_bounds():
    with pytest.raises(ConfigError, match=r"group_session_timeout_ms \(10\) must be between "
                                          r"group_min_session_timeout_ms \(45\) and "
                                          r"group_max_session_timeout_ms \(1800000\)"):
        BrokerConfig.from_mapping({"group_session_timeout_ms": 10})
    BrokerConfig.from_mapping({"group_session_timeout_ms": 100,
                               "group_min_session_timeout_ms": 100})


def test_a_bad_value_names_the_file_the_variable_or_the_flag(tmp_path, monkeypatch):
    conf = tmp_path / "mq.toml"
    conf.write_text("state_slots = 1e11\n")
    with pytest.raises(ConfigError, match=f"^config file {conf}: state_slots must be"):
        BrokerConfig.load(str(conf))
    conf.write_text('[topic_defaults]\n"segment.bytes" = "1"\n')
    with pytest.raises(ConfigError, match=f"^config file {conf}: topic_defaults: "
                                          "segment.bytes must be >= 75"):
        BrokerConfig.load(str(conf))
    monkeypatch.setenv("MQ_LOG_LEVEL", "loud")
    with pytest.raises(ConfigError, match=r"^\$MQ_LOG_LEVEL: log_level must be"):
        BrokerConfig.load(None)
    monkeypatch.delenv("MQ_LOG_LEVEL")
    monkeypatch.setenv("MQ_SOCKET", "/" + "s" * 200)
    with pytest.raises(ConfigError, match=r"^\$MQ_SOCKET: socket path /s+ is 201 bytes"):
        BrokerConfig.load(None)
    with pytest.raises(ConfigError, match="^--socket: socket path /x+ is 151 bytes"):
        BrokerConfig.load(None, socket="/" + "x" * 150)
    with pytest.raises(ConfigError, match="^--metrics: "):
        BrokerConfig.load(None, socket="/tmp/s", metrics_address="nohost")


def test_kafka_listeners_are_loopback_only():
    from mq.broker.config import BrokerConfig, ConfigError
    assert BrokerConfig.from_mapping(
        {"kafka_listeners": ["127.0.0.1:0", "[::1]:9092"]}).kafka_listeners == \
        ("127.0.0.1:0", "[::1]:9092")
    for bad, why in (("0.0.0.0:9092", "not a loopback"), ("127.0.0.1", "HOST:PORT"),
                     ("127.0.0.1:70000", "0..65535"), (":9092", "HOST:PORT")):
        with pytest.raises(ConfigError, match=why):
            BrokerConfig.from_mapping({"kafka_listeners": [bad]})
    with pytest.raises(ConfigError, match="list"):
        BrokerConfig.from_mapping({"kafka_listeners": "127.0.0.1:9092"})
    with pytest.raises(ConfigError, match="true or false"):
        BrokerConfig.from_mapping({"auto_create_topics": "yes"})
