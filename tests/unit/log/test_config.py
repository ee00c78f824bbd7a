"""Per-topic log configuration (``mq.log.config``): Kafka's names and defaults."""

from __future__ import annotations

import dataclasses

import pytest

from mq.log.config import DEFAULTS, ConfigError, LogConfig

DAY_MS = 24 * 60 * 60 * 1000
LONG_MAX = (1 << 63) - 1


def test_defaults_match_kafka():
    c = LogConfig()
    assert c.segment_bytes == 1073741824                  # 1 GiB
    assert c.segment_ms == 604800000                      # 7 days (log.roll.hours = 168)
    assert c.segment_jitter_ms == 0
    assert c.segment_index_bytes == 10485760              # 10 MiB
    assert c.index_interval_bytes == 4096
    assert c.retention_ms == 604800000                    # 7 days
    assert c.retention_bytes == -1
    assert c.cleanup_policy == "delete"
    assert c.max_message_bytes == 1048588                 # 1 MiB + 12
    assert c.file_delete_delay_ms == 60000
    assert c.delete_retention_ms == DAY_MS
    assert c.min_compaction_lag_ms == 0
    assert c.max_compaction_lag_ms == LONG_MAX
    assert c.min_cleanable_dirty_ratio == 0.5
    assert c.message_timestamp_type == "CreateTime"
    assert c.message_timestamp_before_max_ms == LONG_MAX  # KIP-937
    assert c.message_timestamp_after_max_ms == 3600000    # 1 hour: Kafka 4.0's (KIP-1030)
    assert c.flush_messages == LONG_MAX
    assert c.flush_ms == LONG_MAX
    assert DEFAULTS == c
    assert c.delete_enabled and not c.compact_enabled


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LogConfig().segment_bytes = 5                     # type: ignore[misc]


def test_to_properties_uses_kafka_names():
    props = LogConfig().to_properties()
    assert set(props) == {
        "segment.bytes", "segment.ms", "segment.jitter.ms", "segment.index.bytes",
        "index.interval.bytes", "retention.ms", "retention.bytes", "cleanup.policy",
        "max.message.bytes", "file.delete.delay.ms", "delete.retention.ms",
        "min.compaction.lag.ms", "max.compaction.lag.ms", "min.cleanable.dirty.ratio",
        "message.timestamp.type", "message.timestamp.before.max.ms",
        "message.timestamp.after.max.ms", "flush.messages", "flush.ms"}
    assert props["segment.bytes"] == "1073741824"
    assert props["cleanup.policy"] == "delete"


def test_properties_round_trip():
    c = LogConfig(segment_bytes=4096, retention_ms=-1, cleanup_policy="compact,delete",
                  min_cleanable_dirty_ratio=0.25, message_timestamp_type="LogAppendTime")
    assert LogConfig.from_properties(c.to_properties()) == c
    assert LogConfig.from_properties(LogConfig().to_properties()) == LogConfig()


def test_from_properties_converts_strings_and_ints():
    c = LogConfig.from_properties({
        "segment.bytes": "1048576", "segment.ms": 3600000, "retention.bytes": " 5000 ",
        "retention.ms": "-1", "index.interval.bytes": "0", "file.delete.delay.ms": "0",
        "min.cleanable.dirty.ratio": "0.75", "message.timestamp.type": "LogAppendTime",
        "max.message.bytes": "2000"})
    assert c.segment_bytes == 1048576
    assert c.segment_ms == 3600000
    assert c.retention_bytes == 5000
    assert c.retention_ms == -1
    assert c.index_interval_bytes == 0
    assert c.file_delete_delay_ms == 0
    assert c.min_cleanable_dirty_ratio == 0.75
    assert c.message_timestamp_type == "LogAppendTime"
    assert c.max_message_bytes == 2000
    assert c.segment_index_bytes == 10485760             # untouched keys keep the default


def test_from_properties_overlays_a_base():
    base = LogConfig(segment_bytes=5000, retention_ms=10)
    c = LogConfig.from_properties({"retention.ms": "20"}, base=base)
    assert c.segment_bytes == 5000 and c.retention_ms == 20
    assert base.retention_ms == 10                        # the base is not modified


@pytest.mark.parametrize("value, expected", [
    ("delete", "delete"), ("compact", "compact"), ("compact,delete", "compact,delete"),
    ("delete,compact", "delete,compact"), (" delete , compact ", "delete,compact"),
    ("delete,delete", "delete"), ("compact,delete,compact", "compact,delete"),
    ("", ""), (" , ", ""),                                  # Kafka's empty list: neither
])
def test_cleanup_policy_normalised(value, expected):
    c = LogConfig.from_properties({"cleanup.policy": value})
    assert c.cleanup_policy == expected
    assert c.delete_enabled == ("delete" in expected)
    assert c.compact_enabled == ("compact" in expected)


@pytest.mark.parametrize("props, match", [
    ({"segment.byte": "1"}, "unknown config 'segment.byte'"),
    ({"segment_bytes": "1"}, "unknown config 'segment_bytes'"),
    ({"segment.bytes": "big"}, "segment.bytes must be an integer, got 'big'"),
    ({"segment.bytes": "1.5"}, "segment.bytes must be an integer"),
    ({"segment.bytes": "10"}, "segment.bytes must be >= 75, got 10"),
    ({"segment.bytes": str(1 << 31)}, r"segment.bytes must be at most 2147483647 \(Kafka's int32"),
    ({"segment.index.bytes": str(1 << 31)}, "segment.index.bytes must be at most 2147483647"),
    ({"max.message.bytes": str(1 << 31)}, "max.message.bytes must be at most 2147483647"),
    ({"retention.ms": str(1 << 63)}, r"retention.ms must be at most 9223372036854775807 "
                                     r"\(Kafka's int64\), got 9223372036854775808"),
    ({"segment.ms": "0"}, "segment.ms must be >= 1"),
    ({"retention.ms": "-2"}, "retention.ms must be >= -1, got -2"),
    ({"retention.bytes": "-5"}, "retention.bytes must be >= -1"),
    ({"index.interval.bytes": "-1"}, "index.interval.bytes must be >= 0"),
    ({"max.message.bytes": "-1"}, "max.message.bytes must be >= 0"),
    ({"file.delete.delay.ms": "-1"}, "file.delete.delay.ms must be >= 0"),
    ({"flush.messages": "0"}, "flush.messages must be >= 1"),
    ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio must be between 0 and 1"),
    ({"min.cleanable.dirty.ratio": "x"}, "min.cleanable.dirty.ratio must be a number"),
    ({"cleanup.policy": "remove"}, "cleanup.policy must be delete, compact"),
    ({"cleanup.policy": "delete,nope"}, "cleanup.policy must be"),
    ({"message.timestamp.type": "createtime"}, "message.timestamp.type must be CreateTime or "
                                               "LogAppendTime"),
])
def test_from_properties_errors_name_the_key(props, match):
    with pytest.raises(ConfigError, match=match) as info:
        LogConfig.from_properties(props)
    assert list(props)[0] in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_key_message_lists_known_keys():
    with pytest.raises(ConfigError) as info:
        LogConfig.from_properties({"retention.hours": "1"})
    assert "retention.ms" in str(info.value) and "segment.bytes" in str(info.value)
