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
