"""Which CreateTime timestamps a topic accepts (``mq.log.timestamps``, Kafka's KIP-937), and
that a record dated ten years ahead no longer holds time-based retention of its partition."""

from __future__ import annotations

import time

import pytest

from builders import make_batch
from mq.errors import InvalidTimestampError
from mq.log.batch import RecordBatch
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.log.timestamps import check_timestamps

NOW = 1_800_000_000_000
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
TEN_YEARS_MS = 10 * 365 * DAY_MS


def check(timestamps, now=NOW, **config) -> None:
    check_timestamps(RecordBatch(make_batch(timestamps=timestamps)), now, LogConfig(**config),
                     "t-0: ")


def test_defaults_refuse_a_record_ten_years_ahead():
    with pytest.raises(InvalidTimestampError, match=r"t-0: timestamp \d+ is 315360000000 ms "
                       r"ahead .* message.timestamp.after.max.ms is 3600000"):
        check([NOW, NOW + TEN_YEARS_MS])


def test_defaults_accept_an_hour_ahead_and_any_past():
    check([NOW + HOUR_MS])                              # a clock an hour fast still produces
    check([0, NOW - TEN_YEARS_MS, NOW])                 # before.max.ms: unlimited
    check([-1, NOW])                                    # -1: no timestamp
    with pytest.raises(InvalidTimestampError):
        check([NOW + HOUR_MS + 1])


def test_negative_timestamps_other_than_minus_one_are_refused():
    with pytest.raises(InvalidTimestampError, match="timestamp -5 is negative"):
        check([-5])
    with pytest.raises(InvalidTimestampError, match="negative"):
        check([NOW, -2], message_timestamp_before_max_ms=DAY_MS)   # decoded: any record


def test_before_max_ms_checks_every_record():
    check([NOW - DAY_MS, NOW], message_timestamp_before_max_ms=DAY_MS)
    with pytest.raises(InvalidTimestampError, match=r"timestamp \d+ is 86400001 ms behind"):
        check([NOW, NOW - DAY_MS - 1, NOW], message_timestamp_before_max_ms=DAY_MS)


def test_after_max_ms_can_be_raised_or_lifted():
    check([NOW + TEN_YEARS_MS], message_timestamp_after_max_ms=(1 << 63) - 1)
    check([NOW + DAY_MS], message_timestamp_after_max_ms=DAY_MS)


def test_log_append_time_topics_are_not_checked():
    check([NOW + TEN_YEARS_MS, -5], message_timestamp_type="LogAppendTime")


def test_configs_use_kafkas_names():
    config = LogConfig.from_properties({"message.timestamp.after.max.ms": "60000",
                                        "message.timestamp.before.max.ms": "0"})
    assert (config.message_timestamp_after_max_ms, config.message_timestamp_before_max_ms) \
        == (60000, 0)
    with pytest.raises(ValueError, match="message.timestamp.after.max.ms must be >= 0"):
        LogConfig.from_properties({"message.timestamp.after.max.ms": "-1"})


def test_a_far_future_record_no_longer_holds_retention(tmp_path):
    """Segments of 8-day-old records, with an attempt to write one record dated ten years
    ahead among them: refused, so retention (7 days) deletes every segment. Accepted, it
    would hold its segment and every later one for ten years (2 of 6 segments went)."""
    plog = PartitionLog.open(str(tmp_path / "t-0"), LogConfig(segment_bytes=300,
                                                              file_delete_delay_ms=0))
    try:
        now = int(time.time() * 1000)
        old = now - 8 * DAY_MS
        for i in range(20):
            if i == 5:
                with pytest.raises(InvalidTimestampError, match="ahead of the broker's clock"):
                    plog.append(make_batch(timestamp=now + TEN_YEARS_MS))
            plog.append(make_batch(timestamp=old + i, value=b"v%d" % i))
        count = len(plog.segments)
        assert plog.log_end_offset == 20 and count > 3
        assert plog.apply_retention(now_ms=now) == count       # all 8 days old: all go
        assert [s.base_offset for s in plog.segments] == [20]  # a new, empty active one
        assert plog.log_start_offset == 20
    finally:
        plog.close()
