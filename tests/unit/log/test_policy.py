"""Pure roll and retention decisions (``mq.log.policy``): no files, no clock."""

from __future__ import annotations

import pytest

from mq.log.config import LogConfig
from mq.log.policy import SegmentMeta, retention_deletable, roll_reason, should_roll

INT32_MAX = (1 << 31) - 1
CFG = LogConfig(segment_bytes=1000, segment_ms=10_000)


def meta(base=0, size=100, next_offset=None, largest_ts=0, first_ts=-1, created=0,
         oi_full=False, ti_full=False, jitter=0):
    return SegmentMeta(base_offset=base, size_bytes=size,
                       next_offset=base + (1 if size else 0) if next_offset is None
                       else next_offset,
                       largest_timestamp=largest_ts, first_batch_timestamp=first_ts,
                       created_ms=created, offset_index_full=oi_full, time_index_full=ti_full,
                       rolling_jitter_ms=jitter)


def reason(seg, *, size=10, ts=-1, last=None, now=0, config=CFG):
    last = seg.next_offset if last is None else last
    r = roll_reason(seg, batch_size=size, batch_max_timestamp=ts, batch_last_offset=last,
                    now_ms=now, config=config)
    assert should_roll(seg, batch_size=size, batch_max_timestamp=ts, batch_last_offset=last,
                       now_ms=now, config=config) == (r is not None)
    return r


# --- roll: size ---------------------------------------------------------------------------------

def test_size_roll_boundary():
    # Roll when size > segment.bytes - incoming: exactly filling the segment is allowed.
    assert reason(meta(size=990), size=10) is None
    assert reason(meta(size=991), size=10) == "size"
    assert reason(meta(size=900), size=100) is None
    assert reason(meta(size=901), size=100) == "size"


def test_size_roll_of_empty_segment_with_oversized_batch():
    # The rule itself fires (0 > 1000 - 1001); PartitionLog never rolls an empty segment for it.
    assert reason(meta(size=0), size=1001) == "size"
    assert reason(meta(size=0), size=1000) is None


# --- roll: time ---------------------------------------------------------------------------------

def test_time_roll_from_first_batch_timestamp():
    seg = meta(size=100, first_ts=5_000, created=0)
    assert reason(seg, ts=15_000, now=10**9) is None               # elapsed == segment.ms
    assert reason(seg, ts=15_001, now=0) == "time"                 # the clock is not used
    assert reason(seg, ts=4_000, now=10**9) is None                # older batch: negative


def test_time_roll_uses_wall_clock_without_first_timestamp():
    seg = meta(size=100, first_ts=-1, created=1_000)
    assert reason(seg, ts=10**12, now=11_000) is None              # batch ts ignored
    assert reason(seg, ts=-1, now=11_001) == "time"


def test_time_roll_jitter():
    seg = meta(size=100, first_ts=0, jitter=3_000)
    assert reason(seg, ts=7_000) is None
    assert reason(seg, ts=7_001) == "time"


def test_never_time_roll_an_empty_segment():
    assert reason(meta(size=0, first_ts=-1, created=0), now=10**12) is None
    assert reason(meta(size=0, first_ts=0), ts=10**12) is None


# --- roll: index full and offset overflow -------------------------------------------------------

def test_index_full_rolls():
    assert reason(meta(oi_full=True)) == "index full"
    assert reason(meta(ti_full=True)) == "index full"
    assert reason(meta(size=0, oi_full=True)) == "index full"


def test_offset_overflow_boundary():
    seg = meta(base=100, size=100)
    assert reason(seg, last=100 + INT32_MAX) is None
    assert reason(seg, last=100 + INT32_MAX + 1) == "offset overflow"
    assert reason(seg, last=99) == "offset overflow"               # below the base
    assert reason(meta(base=100, size=0), last=100 + INT32_MAX + 1) == "offset overflow"


def test_roll_reasons_are_checked_in_kafka_order():
    seg = meta(size=995, first_ts=0, oi_full=True)
    assert reason(seg, size=10, ts=20_000, last=INT32_MAX + 10) == "size"
    seg = meta(size=10, first_ts=0, oi_full=True)
    assert reason(seg, size=10, ts=20_000, last=INT32_MAX + 10) == "time"
    assert reason(seg, size=10, ts=0, last=INT32_MAX + 10) == "index full"


# --- retention ----------------------------------------------------------------------------------

def segs(*sizes_and_ts, step=10):
    """Consecutive segments of ``step`` offsets each: (size, largest_ts) pairs."""
    out = []
    for i, (size, ts) in enumerate(sizes_and_ts):
        base = i * step
        out.append(meta(base=base, size=size, next_offset=base + (step if size else 0),
                        largest_ts=ts))
    return out


def deletable(segments, *, lso=0, hw=None, now=0, **config):
    hw = segments[-1].next_offset if hw is None else hw
    cfg = LogConfig(**{"retention_ms": -1, **config})
    return retention_deletable(segments, log_start_offset=lso, high_watermark=hw, now_ms=now,
                               config=cfg)


def test_retention_nothing_to_do():
    assert retention_deletable([], log_start_offset=0, high_watermark=0, now_ms=0,
                               config=LogConfig()) == (0, "")
    assert deletable(segs((100, 0), (100, 0))) == (0, "")


def test_retention_by_log_start_offset():
    s = segs((100, 0), (100, 0), (100, 0))                        # bases 0, 10, 20
    assert deletable(s, lso=9) == (0, "")
    assert deletable(s, lso=10) == (1, "log start offset")
    assert deletable(s, lso=19) == (1, "log start offset")
    assert deletable(s, lso=20) == (2, "log start offset")


@pytest.mark.parametrize("policy", ["compact", ""])      # "": Kafka's empty list, neither
def test_retention_by_log_start_offset_also_without_delete(policy):
    s = segs((100, 0), (100, 0), (100, 0))
    assert deletable(s, lso=20, cleanup_policy=policy, retention_bytes=0) == \
        (2, "log start offset")
    # retention.bytes / retention.ms do not apply without "delete"
    assert deletable(s, cleanup_policy=policy, retention_bytes=0) == (0, "")
    assert deletable(s, cleanup_policy=policy, retention_ms=1, now=10**6) == (0, "")


def test_retention_bytes_is_cumulative():
    s = segs((100, 0), (200, 0), (300, 0), (400, 0))               # total 1000
    assert deletable(s, retention_bytes=1000) == (0, "")
    assert deletable(s, retention_bytes=901) == (0, "")          # excess 99 < 100
    assert deletable(s, retention_bytes=900) == (1, "retention.bytes")
    assert deletable(s, retention_bytes=701) == (1, "retention.bytes")
    assert deletable(s, retention_bytes=700) == (2, "retention.bytes")
    assert deletable(s, retention_bytes=400) == (3, "retention.bytes")
    assert deletable(s, retention_bytes=0) == (4, "retention.bytes")
    assert deletable(s, retention_bytes=-1) == (0, "")


def test_retention_ms_strictly_greater_and_minus_one_disables():
    s = segs((100, 1_000), (100, 2_000), (100, 3_000))
    assert deletable(s, retention_ms=500, now=1_500) == (0, "")   # 1500 - 1000 = 500
    assert deletable(s, retention_ms=500, now=1_501) == (1, "retention.ms")
    assert deletable(s, retention_ms=500, now=3_501) == (3, "retention.ms")
    assert deletable(s, retention_ms=-1, now=10**12) == (0, "")
    assert deletable(s, retention_ms=0, now=3_000) == (2, "retention.ms")


def test_retention_stops_at_first_segment_that_does_not_qualify():
    s = segs((100, 5_000), (100, 1_000), (100, 1_000))
    assert deletable(s, retention_ms=500, now=4_000) == (0, "")   # first is too new


def test_retention_never_passes_the_high_watermark():
    s = segs((100, 0), (100, 0), (100, 0))                        # next offsets 10, 20, 30
    assert deletable(s, retention_bytes=0, hw=29) == (2, "retention.bytes")
    assert deletable(s, retention_bytes=0, hw=20) == (2, "retention.bytes")
    assert deletable(s, retention_bytes=0, hw=19) == (1, "retention.bytes")
    assert deletable(s, retention_bytes=0, hw=9) == (0, "")
    assert deletable(s, retention_ms=1, now=10**6, hw=15) == (1, "retention.ms")


def test_empty_last_segment_is_never_deleted():
    s = segs((100, 0), (100, 0), (0, 0))                          # active segment empty
    assert deletable(s, retention_bytes=0) == (2, "retention.bytes")
    assert deletable(s, retention_ms=1, now=10**6) == (2, "retention.ms")
    assert deletable(segs((0, 0)), retention_bytes=0, retention_ms=0, now=10**6) == (0, "")


def test_non_empty_last_segment_may_qualify():
    # The caller rolls a new active segment first when every segment qualifies.
    s = segs((100, 0), (100, 0))
    assert deletable(s, retention_ms=1, now=10**6) == (2, "retention.ms")


def test_mixed_reasons_report_the_last_one():
    s = segs((100, 0), (100, 0), (100, 10**6), (100, 10**6))
    # total 400, excess 150. seg 0: below the log start (excess -> 50); seg 1: 50 < 100 bytes,
    # but older than retention.ms; seg 2: too new.
    assert deletable(s, lso=10, retention_bytes=250, retention_ms=1, now=2_000) == \
        (2, "retention.ms")


@pytest.mark.parametrize("retention_bytes, expected", [(0, 3), (50, 2), (150, 1), (250, 0)])
def test_retention_bytes_with_empty_active_segment(retention_bytes, expected):
    # 3 segments of 100 bytes (+ an empty active one): total 300.
    s = segs((100, 0), (100, 0), (100, 0), (0, 0))
    assert deletable(s, retention_bytes=retention_bytes)[0] == expected
